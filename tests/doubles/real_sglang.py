"""sglang's own code that runs on CPU, wrapped for the tests and the double (never re-implemented here).

sglang's engine needs CUDA, but its package installs without one (``tests/conformance/requirements.txt``, installed
by ``scripts/test`` with ``--no-deps``), and three of its parts run here:
- its server-argument parser: :func:`parse_server_args` is ``sglang.srt.server_args.prepare_server_args``, the
  function ``python -m sglang.launch_server`` calls on its argv;
- its weight-group helper: :func:`init_weight_group` is ``sglang.srt.utils.init_custom_process_group``, which an
  engine calls on ``/init_weights_update_group``
  (``python/sglang/srt/model_executor/model_runner_components/weight_updater.py``, 0.5.23; the helper itself is in
  ``python/sglang/srt/utils/common.py``, re-exported by ``sglang.srt.utils``); over gloo it runs on CPU;
- its HTTP app and request classes (``sglang.srt.entrypoints.http_server``, ``sglang.srt.managers.io_struct``),
  which the conformance tests import directly.

Import this module freely: sglang is imported only when a function needs it.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import importlib.util
import io

SGLANG_VERSION = "0.5.23"
"""The sglang version forge-replay pins (images/runtime/Dockerfile, pyproject's sglang extra,
tests/conformance/requirements.txt); 0.5.19 is supported too."""


def _installed_version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return ""


VERSION = _installed_version()
"""The installed sglang's version ("" when sglang is not installed)."""


def available() -> bool:
    """Whether sglang is installed (its modules are imported on first use, not here)."""
    return bool(VERSION) and importlib.util.find_spec("sglang") is not None


class ServerArgsRefused(ValueError):
    """sglang's own parser refused an argv (argparse's message: unknown flag, missing or bad value)."""


def parse_server_args(argv: list[str]):
    """``ServerArgs`` from sglang's own ``prepare_server_args(argv)`` (argv without the launch command).

    Raises :class:`ServerArgsRefused` with argparse's message where sglang's launcher would print it and exit 2.
    """
    from sglang.srt.server_args import prepare_server_args

    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return prepare_server_args(list(argv))
    except SystemExit as exc:
        message = errors.getvalue().strip().splitlines()
        raise ServerArgsRefused(
            f"sglang {VERSION} refuses {list(argv)}: {message[-1] if message else f'exit {exc.code}'}"
        ) from None


def init_weight_group(*, backend: str, init_method: str, world_size: int, rank: int, group_name: str,
                      timeout_s: float):
    """The process group sglang's own ``init_custom_process_group`` forms, as an engine joins a weight group."""
    from sglang.srt.utils import init_custom_process_group

    return init_custom_process_group(
        backend=backend,
        init_method=init_method,
        world_size=world_size,
        rank=rank,
        group_name=group_name,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
