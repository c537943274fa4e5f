"""The Ray actor owning one engine process, and the GPU memory that engine holds.

One actor per engine: it builds the argv (:func:`~forge_replay.runtime.engines.process.build_engine_argv`),
starts the process on a port of its node, stages checkpoints on that node's disk for the disk push, and
stops the process (and deletes what it wrote) when it stops or dies.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from forge_replay.api.outcome import OutOfMemory, RanOutOfMemory
from forge_replay.runtime.engines.oom import EngineAt, engine_record, read_log
from forge_replay.runtime.engines.process import (
    EngineProcess,
    EngineStartError,
    ModelSource,
    build_engine_argv,
    engine_env,
)
from forge_replay.runtime.ports import free_port
from forge_replay.runtime.weights.disk import stage_checkpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineInfo:
    """Where one started engine runs."""

    index: int
    url: str
    pid: int
    node_ip: str
    started_in_s: float


class EngineActor:
    """Ray actor owning one engine process (created through :func:`engine_actor_class`)."""

    def __init__(
        self,
        index: int,
        command: Sequence[str],
        model: ModelSource,
        tp_size: int,
        engine_args: Mapping[str, str],
        log_dir: str,
        colocated_base_gpu_id: int | None = None,
        use_gpus: bool = False,
        caller_node_ip: str | None = None,
        dtype: str | None = None,
        memory_saver: bool = False,
    ):
        self.index = index
        self.command = list(command)
        self.model = model
        self.tp_size = tp_size
        self.engine_args = dict(engine_args)
        self.log_dir = Path(log_dir)
        self.colocated_base_gpu_id = colocated_base_gpu_id
        self.use_gpus = use_gpus
        self.dtype = dtype
        self.memory_saver = memory_saver
        self.engine: EngineProcess | None = None
        self.node_ip = self._node_ip()
        # On the caller's own node (always so for `forge-replay run`) the engine listens on loopback: nothing
        # off the node needs it, and a stand-in server that ignores --host still answers there.
        self.host = "127.0.0.1" if caller_node_ip in (None, self.node_ip) else self.node_ip
        self.port = free_port()
        self.starts = 0
        self._scratch: list[Path] = []  # node-local dirs this actor wrote (staged weights, model config)
        atexit.register(self.stop)

    @staticmethod
    def _node_ip() -> str:
        try:
            import ray

            return ray.util.get_node_ip_address()
        except Exception:  # noqa: BLE001 - outside Ray (unit use) loopback is right
            return "127.0.0.1"

    def _base_gpu_id(self) -> int | None:
        if not self.use_gpus:
            return None
        if self.colocated_base_gpu_id is not None:
            return self.colocated_base_gpu_id
        return 0  # disaggregated: Ray set CUDA_VISIBLE_DEVICES to this actor's GPUs

    def _local_model(self) -> ModelSource:
        """The model source as seen from this node: a config-only model is written here when the
        caller's copy is not visible (engine on another node than the rollout manager)."""
        model = self.model
        if not model.from_config or model.config is None or (Path(model.model_path) / "config.json").exists():
            return model
        import tempfile

        target = Path(tempfile.gettempdir()) / f"forge-replay-engine-model-{os.getpid()}"
        target.mkdir(parents=True, exist_ok=True)
        if target not in self._scratch:
            self._scratch.append(target)
        (target / "config.json").write_text(json.dumps(dict(model.config), indent=1, sort_keys=True))
        return dataclasses.replace(model, model_path=str(target))

    def _log_path(self) -> Path:
        """engine-N.log under the run's engine-logs dir, or under /tmp when that is not writable on this
        node (said in the log, since the run's dir is where a user looks first)."""
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            return self.log_dir / f"engine-{self.index}.log"
        except OSError as exc:
            import tempfile

            path = Path(tempfile.gettempdir()) / f"forge-replay-engine-{self.index}.log"
            log.warning("engine %d: cannot write %s (%s); its log is %s on %s", self.index, self.log_dir, exc,
                        path, self.node_ip)
            return path

    def argv(self) -> list[str]:
        return build_engine_argv(
            self.command,
            host=self.host,
            port=self.port,
            model=self._local_model(),
            tp_size=self.tp_size,
            engine_args=self.engine_args,
            base_gpu_id=self._base_gpu_id(),
            dtype=self.dtype,
            memory_saver=self.memory_saver,
        )

    def start(self, health_timeout_s: float, rollout: int | None = None) -> EngineInfo:
        """Start the engine process (again, on the same port) and wait for /health_generate.

        A process that ended before it was healthy because it ran out of memory (its log says so, see
        :func:`~forge_replay.runtime.engines.oom.read_log`) raises :class:`RanOutOfMemory` (phase engineStart,
        ``rollout`` being served when it is a restart); any other end, EngineStartError."""
        if self.engine is not None and self.engine.alive():
            self.engine.stop()
        self.starts += 1
        url = f"http://{self.host}:{self.port}"
        self.engine = EngineProcess(self.argv(), url, self._log_path(), env=engine_env(os.environ))
        self.engine.start()
        try:
            took = self.engine.wait_healthy(health_timeout_s)
        except EngineStartError:
            record = self.out_of_memory("engineStart", rollout)
            if record is not None:
                self.engine.note(f"out of memory at start: {record.line()}")
                raise RanOutOfMemory(record) from None
            raise
        return EngineInfo(self.index, url, self.engine.pid or -1, self.node_ip, took)

    def out_of_memory(self, phase: str, rollout: int | None = None) -> OutOfMemory | None:
        """Why the engine process ended, when it ran out of memory: the record of sglang's own refusal in its log
        (phase ``engineStart`` or ``engineServing``); None while it runs, or when it ended for another reason."""
        engine = self.engine
        if engine is None or engine.process is None or engine.alive():
            return None
        refusal = read_log(engine.log_since_start())
        if refusal is None:
            return None
        fraction = {k.removeprefix("--"): v for k, v in self.engine_args.items()}.get("mem-fraction-static")
        return engine_record(refusal, EngineAt(
            engine=self.index, phase=phase, rollout=rollout, pid=engine.pid, node=self.node_ip,
            mem_fraction_static=None if fraction is None else str(fraction),
        ))

    def stage_checkpoint(self, files: Mapping[str, bytes], version: int) -> str:
        """Write a checkpoint's files (fetched by Ray from the trainer's node) to this node's disk; its path.

        Only the newest version is kept here, and none once the actor stops."""
        import tempfile

        root = Path(tempfile.gettempdir()) / f"forge-replay-engine-{self.index}-{os.getpid()}-weights"
        if root not in self._scratch:
            self._scratch.append(root)
        return str(stage_checkpoint(files, root, version))

    def is_alive(self) -> bool:
        return self.engine is not None and self.engine.alive()

    def exit_code(self) -> int | None:
        return None if self.engine is None or self.engine.process is None else self.engine.process.poll()

    def kill(self) -> None:
        """SIGKILL the engine's process group (fault injection, failed health check)."""
        if self.engine is not None:
            self.engine.kill()

    def stop(self) -> int | None:
        """Stop the engine process, then delete what this actor wrote to the node's disk (a staged
        checkpoint is a full copy of the model: left behind, every run would leak one per engine)."""
        code = None if self.engine is None else self.engine.stop()
        while self._scratch:
            shutil.rmtree(self._scratch.pop(), ignore_errors=True)
        return code

    def gpu_memory_gib(self) -> float | None:
        """GPU memory held by this engine (see :func:`engine_gpu_memory_gib`); None when unreadable."""
        own: list[int] = []
        if self.use_gpus and self.colocated_base_gpu_id is None:
            import ray

            own = [int(i) for i in ray.get_gpu_ids()]
        return engine_gpu_memory_gib(self.engine.pid if self.engine else None, own)

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - interpreter teardown: best effort, PDEATHSIG backs it up
            pass


def process_group_members(pgid: int) -> set[int]:
    """PIDs of the live processes in process group ``pgid``."""
    import psutil

    members = set()
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.info["pid"]) == pgid:
                members.add(proc.info["pid"])
        except (ProcessLookupError, PermissionError):
            continue
    return members


def sum_csv_mib(csv_text: str, keys: set[int]) -> float | None:
    """Sum the second column of nvidia-smi ``key, MiB`` lines whose first column is in ``keys``;
    None when no line matched."""
    total, matched = 0.0, False
    for line in csv_text.splitlines():
        key, _, used = line.partition(",")
        if key.strip().isdigit() and int(key) in keys:
            total += float(used.strip() or 0)
            matched = True
    return total if matched else None


def _nvidia_smi(query: str) -> str:
    return subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30, check=True
    ).stdout


def engine_gpu_memory_gib(pgid: int | None, own_gpu_ids: Sequence[int] = ()) -> float | None:
    """GiB of GPU memory held by the processes of process group ``pgid`` (nvidia-smi per process).

    In a container nvidia-smi often lists host PIDs, which match none of ours: then the memory used
    on the engine's own GPUs (``own_gpu_ids``, disaggregated engines only) is taken instead. None when
    neither can be read.
    """
    if pgid is None:
        return None
    per_process = sum_csv_mib(_nvidia_smi("--query-compute-apps=pid,used_memory"), process_group_members(pgid))
    if per_process is not None:
        return per_process / 1024
    if own_gpu_ids:
        per_device = sum_csv_mib(_nvidia_smi("--query-gpu=index,memory.used"), {int(i) for i in own_gpu_ids})
        if per_device is not None:
            return per_device / 1024
    return None


def engine_actor_class():
    """The Ray remote class of :class:`EngineActor` (imports Ray only when engines are started)."""
    import ray

    return ray.remote(EngineActor)
