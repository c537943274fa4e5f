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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from forge_replay.runtime.engines.http import EngineHTTPError, engine_call
from forge_replay.runtime.engines.process import ROUTER_LOG, EngineProcess, EngineStartError
from forge_replay.runtime.ports import free_ports

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


def build_router_argv(worker_urls: Sequence[str], host: str, port: int, metrics_port: int) -> list[str]:
    """argv of ``sglang_router.launch_router`` for ``worker_urls`` (flags of sglang_router 0.3.2 ``router_args.py``).

    The router's own worker health checks are off (``--disable-health-check``): they probe ``/health`` every 60 s,
    which on sglang runs a generation, during weight pushes too; the fleet's own monitor probes, gated by rollout FT.
    Its Prometheus server gets a free port on ``host`` (``--prometheus-port``, default 0.0.0.0:29000): two routers on
    one node, two runs or two tests, would otherwise both want 29000."""
    return [sys.executable, "-m", ROUTER_MODULE, "--host", host, "--port", str(port), "--disable-health-check",
            "--prometheus-host", host, "--prometheus-port", str(metrics_port), "--worker-urls", *worker_urls]


class RouterStartError(EngineStartError):
    """The router did not come up, or did not list every engine it was started with in time."""


class Router:
    """A running sglang_router process."""

    def __init__(self, worker_urls: Sequence[str], host: str, log_dir: Path):
        self.port, self.metrics_port = free_ports(2, host)
        self.url = f"http://{host}:{self.port}"
        self.expected_workers = sorted(worker_urls)
        argv = build_router_argv(worker_urls, host, self.port, self.metrics_port)
        self.process = EngineProcess(argv, self.url, Path(log_dir) / ROUTER_LOG)

    def start(self) -> None:
        self.process.start()

    def wait_ready(self, timeout_s: float, poll_s: float = 0.2) -> float:
        """Wait until the router answers and lists every engine it was started with; the seconds it took.

        sglang_router registers ``--worker-urls`` in the background: its ``/health`` answers before they are listed,
        and a request in between finds no worker."""
        started = time.monotonic()
        self.process.wait_healthy(timeout_s)
        while (listed := self.worker_urls()) != self.expected_workers:
            if not self.process.alive():
                problem = "exited before it listed its engines"
            elif time.monotonic() - started > timeout_s:
                missing = sorted(set(self.expected_workers) - set(listed))
                problem = f"did not list engines {missing} within {timeout_s:.0f} s (it lists {listed})"
            else:
                time.sleep(poll_s)
                continue
            raise RouterStartError(f"router at {self.url} {problem}\nlast lines of {self.process.log_path}:\n"
                                   f"{self.process.log_tail()}")
        return time.monotonic() - started

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
