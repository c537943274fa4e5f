"""One sglang engine process: its launch command and model source (pure), its health probe, start and stop.

One engine is one sglang HTTP server process (``python -m sglang.launch_server`` or the command
given with ``--engine-command``), started by one Ray actor (:mod:`.actor`) in its own process group and
killed as a group at the end, on failure, and when its actor dies (PDEATHSIG + atexit + ``__del__``).
The orchestration of the whole fleet (monitors, weight sync, recovery) is in :mod:`.fleet`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from forge_replay.api.engine_args import engine_args_problems
from forge_replay.runtime.engines.http import EngineHTTPError, engine_call

log = logging.getLogger(__name__)

SGLANG_LAUNCH_MODULE = "sglang.launch_server"

ENGINE_LOGS = "engine-logs"
"""The folder of engine-N.log under a fleet's work dir (``<results>/engines``)."""
ROUTER_LOG = "router.log"
"""The router's log, in the fleet's work dir."""


def start_run_logs(work_dir: Path) -> None:
    """A run's engine and router logs are its own: those a previous run left in ``work_dir`` (the next run of a job
    reuses its results folder) are removed before any engine starts. Within a run, an engine started again (fault
    tolerance) appends to its log, so the log of the process that died is kept."""
    for path in [*(work_dir / ENGINE_LOGS).glob("engine-*.log"), work_dir / ROUTER_LOG]:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


class EngineUnavailable(RuntimeError):
    """No engine server can be launched (no sglang, no --engine-command)."""


class EngineStartError(RuntimeError):
    """An engine process exited or never became healthy."""


def resolve_engine_command(engine_command: str | None) -> list[str]:
    """The argv prefix that starts one engine server; fails fast when there is none.

    ``engine_command`` (``forge-replay run --engine-command``) replaces ``python -m
    sglang.launch_server`` and receives the same arguments.
    """
    if engine_command is not None:
        argv = shlex.split(engine_command)
        if not argv:
            raise EngineUnavailable("--engine-command is empty: give the command that starts one engine server")
        return argv
    if importlib.util.find_spec("sglang") is None:
        raise EngineUnavailable(
            "replay.mode forge starts sglang engines, but sglang is not installed in this Python "
            f"({sys.executable}). Install forge-replay[sglang] (needs CUDA), or pass "
            "--engine-command 'CMD' with a server that speaks sglang's HTTP API, "
            "or use replay.mode: debug (no engines)."
        )
    return [sys.executable, "-m", SGLANG_LAUNCH_MODULE]


@dataclass(frozen=True)
class ModelSource:
    """Where an engine loads its model from, and how."""

    model_path: str
    load_format: str | None
    """``dummy`` (random weights from a config alone) or None for the server's default."""
    from_config: bool
    config: Mapping | None = None
    """The model config when ``from_config``: an engine on another node writes it there itself."""
    has_tokenizer: bool = False
    """Whether ``model_path`` holds a tokenizer (see :data:`TOKENIZER_FILES`); a config-only model has none."""


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")
"""Files of a Hugging Face tokenizer: a model directory with none of them has no tokenizer, and sglang, which loads
one from the model path at start unless ``--skip-tokenizer-init`` is given (``managers/tokenizer_manager.py``),
would die there."""

ENGINE_ENV_DROPPED = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
"""Trainer settings an engine must not inherit: expandable segments (the trainer's allocator setting, under its old
and new name) cannot be used with the memory pool of sglang's ``--enable-memory-saver`` (slime strips it too)."""

STARTUP_PROBE_TIMEOUT_S = 30.0
"""Timeout of one start-up ``/health_generate`` probe: sglang itself waits up to 20 s for the probe's one-token
generation (``HEALTH_CHECK_TIMEOUT``, ``entrypoints/http_server.py``, 0.5.19 and 0.5.23); a shorter timeout
cuts the probe off and sends another generation."""


def prepare_model_source(
    model_config: Mapping | None, model_path: str | None, model_root: str | None, scratch_dir: Path
) -> ModelSource:
    """The model an engine loads: a checkpoint dir under ``model_root``, or ``config`` written to
    ``scratch_dir/engine-model/config.json`` and loaded with ``--load-format dummy``."""
    if model_config is not None:
        target = Path(scratch_dir) / "engine-model"
        target.mkdir(parents=True, exist_ok=True)
        (target / "config.json").write_text(json.dumps(dict(model_config), indent=1, sort_keys=True))
        return ModelSource(str(target), "dummy", from_config=True, config=dict(model_config), has_tokenizer=False)
    if not model_path:
        raise ValueError("spec.model: neither config nor path is set (the spec validation should have refused it)")
    full = Path(model_root or "") / model_path if model_root else Path(model_path)
    if not full.is_dir():
        raise FileNotFoundError(
            f"spec.model.path: model directory {full} does not exist "
            f"(model root {model_root!r}); check spec.model.claimName/path or --model-root"
        )
    return ModelSource(str(full), None, from_config=False, has_tokenizer=holds_tokenizer(full))


def holds_tokenizer(directory: Path) -> bool:
    """Whether ``directory`` holds any of :data:`TOKENIZER_FILES`."""
    return any((Path(directory) / name).is_file() for name in TOKENIZER_FILES)


def engine_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of an engine process: ``environ`` without :data:`ENGINE_ENV_DROPPED`."""
    return {key: value for key, value in environ.items() if key not in ENGINE_ENV_DROPPED}


def build_engine_argv(
    command: Sequence[str],
    *,
    host: str,
    port: int,
    model: ModelSource,
    tp_size: int,
    engine_args: Mapping[str, str],
    base_gpu_id: int | None = None,
    dtype: str | None = None,
    memory_saver: bool = False,
) -> list[str]:
    """argv of one engine server: the command, then sglang's launch_server arguments.

    engineArgs pass through as ``--key value``; ``""`` or ``"true"`` passes the flag alone and
    ``"false"`` leaves it out (sglang's on/off switches take no value). Unless engineArgs set them: the server
    warm-up is skipped; a model from a config loads random weights (``--load-format dummy``); a model without a
    tokenizer starts with ``--skip-tokenizer-init`` (unless engineArgs name a ``tokenizer-path``); ``dtype`` (the
    trainer's) is the engine's ``--dtype`` (sglang otherwise turns a float32 or absent config dtype into float16,
    ``configs/model_config.py``); ``memory_saver`` (colocated engines) adds ``--enable-memory-saver``, without
    which ``/release_memory_occupation`` releases nothing.
    """
    problems = engine_args_problems(engine_args)
    if problems:
        raise ValueError("; ".join(f"{path}: {message}" for path, message in problems))
    user = {(k[2:] if k.startswith("--") else k): str(v) for k, v in engine_args.items()}
    argv = [*command, "--host", host, "--port", str(port), "--model-path", model.model_path]
    argv += ["--tp-size", str(tp_size)]
    if base_gpu_id is not None:
        argv += ["--base-gpu-id", str(base_gpu_id)]
    defaults: list[tuple[str, str | None]] = [("skip-server-warmup", None)]
    if model.load_format:
        defaults.insert(0, ("load-format", model.load_format))
    if not model.has_tokenizer and "tokenizer-path" not in user:
        defaults.append(("skip-tokenizer-init", None))
    if dtype:
        defaults.append(("dtype", dtype))
    if memory_saver:
        defaults.append(("enable-memory-saver", None))
    for name, value in defaults:
        if name not in user:
            argv += [f"--{name}"] if value is None else [f"--{name}", value]
    for name, value in user.items():
        if value.lower() == "false":
            continue
        argv.append(f"--{name}")
        if value.lower() not in ("", "true"):
            argv.append(value)
    return argv


def engine_count(num_gpus: int, num_gpus_per_engine: int) -> int:
    """Number of engines for a rollout section (its numGpus must divide: the spec rule 3)."""
    if num_gpus < 1 or num_gpus_per_engine < 1 or num_gpus % num_gpus_per_engine:
        raise ValueError(
            f"spec.rollout: numGpus {num_gpus} must be a positive multiple of numGpusPerEngine {num_gpus_per_engine}"
        )
    return num_gpus // num_gpus_per_engine


# --------------------------------------------------------------------------- probe


_WITHOUT_HEALTH_GENERATE: set[str] = set()


def probe_health(url: str, timeout_s: float) -> str | None:
    """GET /health_generate within ``timeout_s``: None when healthy, else why not.

    A server that answers 404 there (a stand-in that is not sglang) is probed on ``/health`` instead; that
    is logged once per engine, since ``/health`` does not prove the server can generate."""
    try:
        engine_call(url, "/health_generate", timeout_s=timeout_s)
    except EngineHTTPError as exc:
        if exc.status != 404:
            return str(exc)
        try:
            engine_call(url, "/health", timeout_s=timeout_s)
        except EngineHTTPError as fallback:
            return f"{exc}; {fallback}"
        if url not in _WITHOUT_HEALTH_GENERATE:
            _WITHOUT_HEALTH_GENERATE.add(url)
            log.warning("engine %s has no /health_generate (404): probing /health instead", url)
    return None


# --------------------------------------------------------------------------- engine process


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the parent (the engine actor) dies (Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        pass


class EngineProcess:
    """One engine server process in its own process group, logged to ``log_path``."""

    def __init__(self, argv: Sequence[str], url: str, log_path: Path, env: Mapping[str, str] | None = None):
        self.argv = list(argv)
        self.url = url
        self.log_path = Path(log_path)
        self.env = dict(os.environ if env is None else env)
        self.process: subprocess.Popen | None = None
        self.log_offset = 0
        """Where this process's part of the log starts (an engine started again appends to its log)."""

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self) -> None:
        """Start the server; EngineStartError (command, log) when it cannot even be executed."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            self.log_offset = log_file.tell()
            try:
                self.process = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,
                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
                )
            except OSError as exc:  # missing or non-executable program: a raw FileNotFoundError names neither
                self.note(f"cannot start {shlex.join(self.argv)}: {exc}")
                raise EngineStartError(
                    f"engine at {self.url} could not be started: {exc}; command: {shlex.join(self.argv)} "
                    f"(check the program of --engine-command, or that sglang is installed); log: {self.log_path}"
                ) from None

    def note(self, message: str) -> None:
        """Append a ``[forge-replay]`` line to the engine's log: the file a user reads first."""
        try:
            with open(self.log_path, "a") as log_file:
                log_file.write(f"[forge-replay] {message}\n")
        except OSError:
            pass

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_since_start(self, max_bytes: int = 1 << 20) -> str:
        """This process's log (its last ``max_bytes``), without what earlier processes of the engine wrote."""
        try:
            with open(self.log_path, "rb") as log_file:
                log_file.seek(0, os.SEEK_END)
                log_file.seek(max(self.log_offset, log_file.tell() - max_bytes))
                return log_file.read().decode(errors="replace")
        except OSError:
            return ""

    def wait_healthy(self, timeout_s: float, probe_timeout_s: float = STARTUP_PROBE_TIMEOUT_S,
                     poll_s: float = 0.2) -> float:
        """Wait until /health_generate answers 200; the seconds it took. EngineStartError with the
        log tail when the process exits or the deadline passes."""
        started = time.monotonic()
        last_problem = "not probed yet"
        while True:
            if not self.alive():
                code = None if self.process is None else self.process.returncode
                raise EngineStartError(
                    f"engine at {self.url} exited with code {code} before it was healthy; "
                    f"command: {shlex.join(self.argv)}\nlast lines of {self.log_path}:\n{self.log_tail()}"
                )
            problem = probe_health(self.url, probe_timeout_s)
            if problem is None:
                return time.monotonic() - started
            last_problem = problem
            if time.monotonic() - started > timeout_s:
                self.stop()
                raise EngineStartError(
                    f"engine at {self.url} was not healthy within {timeout_s:.0f} s ({last_problem}); "
                    f"command: {shlex.join(self.argv)}\nlast lines of {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(poll_s)

    def _signal_group(self, sig: int) -> bool:
        if self.process is None:
            return False
        try:
            os.killpg(self.process.pid, sig)  # start_new_session: the pgid is the leader's pid
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def kill(self) -> None:
        """SIGKILL the whole process group now (fault injection, failed health)."""
        self._signal_group(signal.SIGKILL)
        if self.process is not None:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.error("engine %s (pid %s) did not exit after SIGKILL", self.url, self.process.pid)

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; the leader's exit code."""
        if self.process is None:
            return None
        if self._signal_group(signal.SIGTERM):
            self.note(f"stopping: SIGTERM to process group {self.process.pid}")
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("engine %s did not stop within %.0f s of SIGTERM: SIGKILL", self.url, grace_s)
            self.note(f"still running {grace_s:.0f} s after SIGTERM: SIGKILL to process group {self.process.pid}")
        # Children (sglang's schedulers) may outlive the leader: kill whatever is left of the group.
        self._signal_group(signal.SIGKILL)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.error("engine %s (pid %s) survived SIGKILL", self.url, self.process.pid)
        return self.process.returncode


