"""Errors that cross process boundaries intact.

Ray hands an error raised in an actor to the caller pickled. Pickle rebuilds an exception as
``type(exc)(*exc.args)``, which fails for an error whose ``__init__`` takes other arguments than its message
(ReplayError(rollout_id, path, message)): Ray then reports "Failed to deserialize exception" and a traceback
instead of the error's one line. :class:`Portable` rebuilds such errors from their args and attributes instead.
"""

from __future__ import annotations

from typing import Any


class Portable:
    """Mixin for exception classes with their own ``__init__`` signature: pickling keeps type, message and
    attributes without calling ``__init__`` again. List it before the exception base:
    ``class ReplayError(Portable, RuntimeError)``."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), self.args, dict(self.__dict__))  # type: ignore[attr-defined]


def _rebuild(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> BaseException:
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc
