"""The router in front of several engines (as slime and miles run it).

When there is more than one engine and ``sglang_router`` is installed, it is launched with
``python -m sglang_router.launch_router --worker-urls URL ...`` in its own process group. Without
it (and always with ``--engine-command``), engines are addressed directly: forge-replay pushes
weights and probes health per engine anyway, and replay sends no generation traffic. That choice
is logged and reported, never silent.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from forge_replay.runtime.engines.http import EngineHTTPError, engine_call
from forge_replay.runtime.engines.process import ROUTER_LOG, EngineProcess, free_port

log = logging.getLogger(__name__)

ROUTER_MODULE = "sglang_router.launch_router"


@dataclass(frozen=True)
class RouterPlan:
    """Whether a router runs, and why (the reason goes to the log and the report)."""

    launch: bool
    reason: str


def plan_router(num_engines: int, engine_command_given: bool, router_installed: bool) -> RouterPlan:
    """Decide whether to launch sglang_router in front of ``num_engines`` engines."""
    if num_engines <= 1:
        return RouterPlan(False, "one engine: addressed directly")
    if engine_command_given:
        return RouterPlan(False, "--engine-command given: engines addressed directly, no sglang_router")
    if not router_installed:
        return RouterPlan(False, "sglang_router is not installed: engines addressed directly")
    return RouterPlan(True, f"sglang_router in front of {num_engines} engines")


def router_installed() -> bool:
    return importlib.util.find_spec("sglang_router") is not None


def build_router_argv(worker_urls: Sequence[str], host: str, port: int) -> list[str]:
    """argv of ``sglang_router.launch_router`` for ``worker_urls``, with the router's own worker health checks off
    (``--disable-health-check``, sglang_router 0.3.2 ``router_args.py``): they probe ``/health`` every 60 s, which
    on sglang runs a generation, during weight pushes too. The fleet's own monitor probes, gated by rollout FT."""
    return [sys.executable, "-m", ROUTER_MODULE, "--host", host, "--port", str(port), "--disable-health-check",
            "--worker-urls", *worker_urls]


class Router:
    """A running sglang_router process."""

    def __init__(self, worker_urls: Sequence[str], host: str, log_dir: Path):
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        self.process = EngineProcess(build_router_argv(worker_urls, host, self.port), self.url, Path(log_dir) / ROUTER_LOG)

    def start(self) -> None:
        self.process.start()

    def worker_urls(self) -> list[str]:
        """The workers the router knows (``GET /workers``, sglang_router >= 0.2)."""
        answer = engine_call(self.url, "/workers")
        return sorted(w["url"] for w in answer.get("workers", [])) if isinstance(answer, dict) else []

    def replace_worker(self, old_url: str, new_url: str) -> None:
        """Swap a recovered engine's URL (only when it came back on another address).

        sglang_router's current API is ``POST /workers`` + ``DELETE /workers/{id}``; releases before it
        only have ``/add_worker`` + ``/remove_worker``: a 404 on ``/workers`` selects those (logged).
        """
        if old_url == new_url:
            return
        try:
            answer = engine_call(self.url, "/workers")
        except EngineHTTPError as exc:
            if exc.status != 404:
                raise
            log.info("router %s has no /workers API: using /remove_worker + /add_worker", self.url)
            engine_call(self.url, f"/remove_worker?url={quote(old_url, safe='')}", method="POST")
            engine_call(self.url, f"/add_worker?url={quote(new_url, safe='')}", method="POST")
            return
        for worker in answer.get("workers", []) if isinstance(answer, dict) else []:
            if worker.get("url") == old_url:
                engine_call(self.url, f"/workers/{worker['id']}", method="DELETE")
        engine_call(self.url, "/workers", method="POST", body={"url": new_url})

    def stop(self) -> None:
        self.process.stop()
