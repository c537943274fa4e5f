"""The weight-sync requests every path sends to one engine, and their checks.

``post_weight_request`` posts a push and requires ``success``; after it, :func:`confirm_weights` reads the
version back and flushes the cache; colocated engines release and resume their memory around training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from forge_replay.runtime.engines.http import EngineHTTPError, engine_call


class WeightSyncError(RuntimeError):
    """An engine refused or did not apply a weight push."""


@dataclass(frozen=True)
class PushResult:
    """One engine's answer to one weight push."""

    url: str
    version: str
    confirmed_version: str | None
    """What /get_weight_version answered; None when the server has no such endpoint (see ``unsupported``)."""
    unsupported: tuple[str, ...] = ()
    """Check endpoints the server answered 404 to (a stand-in server may lack them): reported, not hidden."""


Caller = Callable[..., object]


def post_weight_request(url: str, path: str, body: dict, what: str, *, timeout_s: float = 600.0,
                        call: Caller = engine_call, hint: str = "") -> object:
    """POST one weight-sync request (``/init_weights_update_group``, ``/update_weights_from_distributed``,
    ``/update_weights_from_tensor``) and require ``success``; ``what`` and ``hint`` go into the error."""
    try:
        answer = call(url, path, method="POST", body=body, timeout_s=timeout_s)
    except EngineHTTPError as exc:
        extra = f"; {hint}" if hint and exc.status == 404 else ""
        verb = "gave no answer to" if exc.status is None else "refused"  # no answer: dead, or its connection cut
        raise WeightSyncError(f"engine {url} {verb} {what} ({path}): {exc}{extra}") from exc
    require_success(answer, url, what)
    return answer


def require_success(answer: object, url: str, what: str) -> None:
    """WeightSyncError when an engine answered ``{"success": false, ...}`` to a push of ``what``."""
    if isinstance(answer, dict) and answer.get("success") is False:
        raise WeightSyncError(f"engine {url} did not load {what}: {answer.get('message')}")


def confirm_weights(url: str, version: str, *, timeout_s: float = 600.0, call: Caller = engine_call) -> PushResult:
    """After a push: ``/get_weight_version`` must answer ``version``; then ``/flush_cache`` (a 404 on either is
    noted in the result: a stand-in server may lack them)."""
    unsupported: list[str] = []
    confirmed: str | None = None
    reported = _optional(call, url, "/get_weight_version", timeout_s, unsupported)
    if "/get_weight_version" not in unsupported:
        confirmed = str(reported.get("weight_version")) if isinstance(reported, dict) else str(reported).strip()
        if confirmed != version:
            raise WeightSyncError(
                f"engine {url} reports weight version {confirmed!r} after loading version {version!r}: "
                "the push did not take"
            )
    _optional(call, url, "/flush_cache", timeout_s, unsupported)
    return PushResult(url, version, confirmed, tuple(unsupported))


def _optional(call: Caller, url: str, path: str, timeout_s: float, unsupported: list[str]) -> object:
    """GET ``path``; a 404 is noted in ``unsupported`` (sglang has it; a stand-in may not), other errors raise."""
    try:
        return call(url, path, timeout_s=timeout_s)
    except EngineHTTPError as exc:
        if exc.status == 404:
            unsupported.append(path)
            return None
        raise WeightSyncError(f"engine {url}: {path} after a weight push failed: {exc}") from exc


def release_memory(url: str, *, timeout_s: float = 120.0, call: Caller = engine_call) -> None:
    """Colocated engines give their GPU memory (weights, KV cache, CUDA graphs) to the trainer."""
    call(url, "/release_memory_occupation", method="POST", body={}, timeout_s=timeout_s)


def resume_memory(url: str, *, timeout_s: float = 120.0, call: Caller = engine_call) -> None:
    """Colocated engines take their GPU memory back after training."""
    call(url, "/resume_memory_occupation", method="POST", body={}, timeout_s=timeout_s)
