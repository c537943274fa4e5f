"""The weight-sync requests every path sends to one engine, and their checks.

``post_weight_request`` posts a push and requires ``success``; the distributed and tensor pushes run inside a
weight-update session (:func:`begin_weight_update`, :func:`end_weight_update`); after a push
:func:`confirm_weights` reads the version back and flushes the cache; colocated engines release and resume their
memory around training.
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
    confirmed_version: str
    """The ``weight_version`` the engine reported after the push (it equals ``version``, else the push failed)."""
    unsupported: tuple[str, ...] = ()
    """Optional endpoints the server answered 404 to (``/flush_cache`` on a stand-in): reported, not hidden."""


Caller = Callable[..., object]

VERSION_ENDPOINTS = ("/model_info", "/get_model_info")
"""Where sglang reports ``weight_version``: ``GET /model_info``, or the deprecated ``/get_model_info`` that
answers the same (sglang 0.5.19 and 0.5.23, ``python/sglang/srt/entrypoints/http_server.py``).
``/get_weight_version`` is never asked: 0.5.19 answers it 404 ("deprecated"), 0.5.23 has no such route."""

SESSION_BEGIN = "/begin_weight_update"
SESSION_END = "/end_weight_update"
"""sglang >= 0.5.21 refuses ``/update_weights_from_distributed`` and ``/update_weights_from_tensor`` with 400,
before receiving anything, outside a weight-update session opened by ``POST /begin_weight_update {}`` and closed by
``POST /end_weight_update {}`` (0.5.23: ``python/sglang/srt/managers/scheduler_components/weight_updater.py``,
routes in ``entrypoints/http_server.py``). Older servers (0.5.19) answer 404 on both: they update without one."""


def post_weight_request(url: str, path: str, body: dict, what: str, *, timeout_s: float = 600.0,
                        call: Caller = engine_call, hint: str = "") -> object:
    """POST one weight-sync request (``/init_weights_update_group``, ``/update_weights_from_distributed``,
    ``/update_weights_from_tensor``, the session routes) and require ``success``; ``what`` and ``hint`` go into
    the error."""
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


def begin_weight_update(url: str, *, timeout_s: float = 600.0, call: Caller = engine_call) -> bool:
    """Open the engine's weight-update session (see :data:`SESSION_END`): True when opened, False when the server
    has none (404: sglang before 0.5.21, which takes updates without one). Any other refusal raises."""
    try:
        post_weight_request(url, SESSION_BEGIN, {}, "opening a weight-update session", timeout_s=timeout_s,
                            call=call)
    except WeightSyncError as exc:
        if isinstance(exc.__cause__, EngineHTTPError) and exc.__cause__.status == 404:
            return False
        raise
    return True


def end_weight_update(url: str, *, timeout_s: float = 600.0, call: Caller = engine_call) -> None:
    """Close the weight-update session :func:`begin_weight_update` opened (sglang finalizes the weights then)."""
    post_weight_request(url, SESSION_END, {}, "closing the weight-update session", timeout_s=timeout_s, call=call)


def read_weight_version(url: str, *, timeout_s: float = 600.0, call: Caller = engine_call) -> str:
    """The ``weight_version`` the engine serves (:data:`VERSION_ENDPOINTS`, in order, the next one on a 404).
    WeightSyncError when none answers it: a version that cannot be confirmed fails the push."""
    for path in VERSION_ENDPOINTS:
        try:
            answer = call(url, path, timeout_s=timeout_s)
        except EngineHTTPError as exc:
            if exc.status == 404:
                continue
            raise WeightSyncError(f"engine {url}: GET {path} after a weight push failed: {exc}") from exc
        if not isinstance(answer, dict) or "weight_version" not in answer:
            raise WeightSyncError(f"engine {url}: GET {path} answered no weight_version ({str(answer)[:200]}), so the "
                                  "version it loaded cannot be confirmed")
        return str(answer["weight_version"])
    raise WeightSyncError(f"engine {url} answers 404 to GET {' and '.join(VERSION_ENDPOINTS)}, so the weight version "
                          "it loaded cannot be confirmed (sglang reports weight_version there)")


def confirm_weights(url: str, version: str, *, timeout_s: float = 600.0, call: Caller = engine_call) -> PushResult:
    """After a push: the engine must report ``version`` (:func:`read_weight_version`); then ``/flush_cache`` (a 404
    there is noted in the result: a stand-in server may lack it)."""
    confirmed = read_weight_version(url, timeout_s=timeout_s, call=call)
    if confirmed != version:
        raise WeightSyncError(
            f"engine {url} reports weight version {confirmed!r} after loading version {version!r}: "
            "the push did not take"
        )
    unsupported: list[str] = []
    try:
        call(url, "/flush_cache", timeout_s=timeout_s)
    except EngineHTTPError as exc:
        if exc.status != 404:
            raise WeightSyncError(f"engine {url}: /flush_cache after a weight push failed: {exc}") from exc
        unsupported.append("/flush_cache")
    return PushResult(url, version, confirmed, tuple(unsupported))


def release_memory(url: str, *, timeout_s: float = 120.0, call: Caller = engine_call) -> None:
    """Colocated engines give their GPU memory (weights, KV cache, CUDA graphs) to the trainer."""
    call(url, "/release_memory_occupation", method="POST", body={}, timeout_s=timeout_s)


def resume_memory(url: str, *, timeout_s: float = 120.0, call: Caller = engine_call) -> None:
    """Colocated engines take their GPU memory back after training."""
    call(url, "/resume_memory_occupation", method="POST", body={}, timeout_s=timeout_s)
