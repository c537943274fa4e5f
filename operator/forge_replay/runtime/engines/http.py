"""The HTTP client of sglang engines: one call, and the error naming the engine, endpoint and answer.

Its own module so that both the engine processes (:mod:`.process`) and the weight pushes
(:mod:`forge_replay.runtime.weights`) use it without importing each other.
"""

from __future__ import annotations

from forge_replay.errors import Portable


class EngineHTTPError(Portable, RuntimeError):
    """An engine answered an HTTP call with an error (``status``), or did not answer (``status`` None)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def engine_call(
    url: str, path: str, *, method: str = "GET", body: dict | None = None, timeout_s: float = 30.0
) -> object:
    """One HTTP call to an engine: the decoded JSON (or text) answer, or EngineHTTPError naming the
    engine, the endpoint and what it answered."""
    import requests

    try:
        response = requests.request(method, url + path, json=body, timeout=timeout_s)
    except requests.RequestException as exc:
        raise EngineHTTPError(f"{method} {url}{path} failed: {exc}") from exc
    if response.status_code >= 400:
        raise EngineHTTPError(
            f"{method} {url}{path} answered {response.status_code}: {response.text[:500]}", response.status_code
        )
    try:
        return response.json()
    except ValueError:
        return response.text
