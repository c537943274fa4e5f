"""Whether a slime / miles job ran out of memory, from what its processes left: read by the publish step once the
team's script has ended (backends.publish), into report.json's ``out_of_memory`` (the record of api/outcome.py,
snake_case, as a dict: the team's image has no pydantic) and the progress ConfigMap's result.

Structured signals first (the memory probe writes them, backends.probe):

- torch's OOM observer's file (``oom-<host>-<pid>.json``): the CUDA allocator refused an allocation
  (``cudaAllocator``), with the bytes requested, the device's total and free memory, and torch's allocated and
  reserved bytes at that moment;
- a memory cgroup whose OOM kill count rose above the baseline its first worker recorded (``cgroup-*.json``, this
  node's cgroups read now; ``oomkill-*.json``, written on any node by the workers that survived the kill): the
  kernel's OOM killer (``kernelOomKiller``), with the cgroup's limit and peak usage.

Where nothing structured exists, the script's log: the last ``ray.exceptions.OutOfMemoryError: ...`` its traceback
printed, when Ray's memory monitor killed a worker the script waited on (``rayMemoryMonitor``). The driver's
``ray.get`` raises that exception (Ray 2.60.0 ray/exceptions.py:655-667, deserialized from ErrorType.OUT_OF_MEMORY,
ray/_private/serialization.py:500-502); its text is the monitor's message, which alone says the node, the victim's
pid and the memory figures; Python prints a traceback's last line as ``<module>.<qualname>: <str(exc)>``.

Only a script that failed ran out of memory: an exit status alone (137 is any SIGKILL, sglang's own too) never
says so. Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from forge_replay.backends.probe import cgroup_figures
from forge_replay.runtime.memory_signals import held_by_others_bytes, ray_monitor_figures

RAY_OOM_ERROR = "ray.exceptions.OutOfMemoryError: "
"""The last line of a traceback of Ray's memory monitor's error, up to its message."""
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""Set by Ray's job supervisor for the entrypoint (ray/dashboard/modules/job/job_supervisor.py
_get_driver_env_vars), its metadata holding ``job_submission_id``: the name of the entrypoint's log."""


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def cuda_record(folder: str) -> dict[str, Any] | None:
    """The first CUDA out-of-memory torch's observer recorded in any process (``cudaAllocator``), or None."""
    found = [r for r in (_read(p) for p in sorted(Path(folder).glob("oom-*.json"))) if r]
    if not found:
        return None
    first = min(found, key=lambda r: r.get("at") or "")
    figures = ("requested_bytes", "allocated_bytes", "reserved_bytes", "device_total_bytes", "device_free_bytes")
    how_much = {key: first[key] for key in figures if first.get(key) is not None}
    others = held_by_others_bytes(first.get("device_total_bytes"), first.get("device_free_bytes"),
                                  first.get("reserved_bytes"))
    if others is not None:
        how_much["held_by_others_bytes"] = others
    return {"signal": "cudaAllocator",
            "where": {"component": "trainer", "node": first.get("host"), "pid": first.get("pid"),
                      "device": first.get("device")},
            "when": {"at": first.get("at")}, "how_much": how_much,
            "message": f"torch's CUDA allocator could not allocate {first.get('requested_bytes')} bytes on "
                       f"{first.get('device')} (process {first.get('pid')} on {first.get('host')})"}


def kernel_record(folder: str, host: str | None = None) -> dict[str, Any] | None:
    """A memory cgroup whose OOM kill count rose above its baseline (``kernelOomKiller``), or None: this node's
    (``host``) cgroups are read now, other nodes' from what their surviving workers wrote."""
    host = host or socket.gethostname()
    seen: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(folder).glob("oomkill-*.json")):
        record = _read(path)
        if record and record.get("cgroup"):
            seen[f"{record['host']}:{record['cgroup']}"] = record
    for path in sorted(Path(folder).glob("cgroup-*.json")):
        baseline = _read(path)
        if not baseline or baseline.get("host") != host or baseline.get("oom_kill") is None:
            continue
        figures = cgroup_figures(baseline["cgroup"], baseline["version"])
        if figures["oom_kill"] is not None and figures["oom_kill"] > baseline["oom_kill"]:
            seen[f"{host}:{baseline['cgroup']}"] = {**baseline, **figures, "baseline": baseline["oom_kill"]}
    if not seen:
        return None
    record = seen[sorted(seen)[0]]
    kills = record["oom_kill"] - record["baseline"]
    how_much = {key: record[key] for key in ("limit_bytes", "max_usage_bytes") if record.get(key) is not None}
    return {"signal": "kernelOomKiller", "where": {"component": "trainer", "node": record.get("host")},
            "when": {"at": record.get("seen_at")} if record.get("seen_at") else {}, "how_much": how_much,
            "message": f"the kernel's OOM killer killed {kills} process(es) in memory cgroup {record['cgroup']} on "
                       f"{record.get('host')}" + (f" (limit {record['limit_bytes']} bytes)"
                                                   if record.get("limit_bytes") else "")}


def ray_monitor_record(log: str) -> dict[str, Any] | None:
    """Ray's memory monitor's error as the script's traceback printed it last (``rayMemoryMonitor``), or None."""
    start = log.rfind(RAY_OOM_ERROR)
    if start < 0 or (start > 0 and log[start - 1] != "\n"):
        return None
    text = log[start + len(RAY_OOM_ERROR):]
    message = text.split("\n\n", 1)[0].strip()
    said = ray_monitor_figures(text)
    where: dict[str, Any] = {"component": "trainer", **{key: said[key] for key in ("node", "pid") if key in said}}
    return {"signal": "rayMemoryMonitor", "where": where, "when": {}, "how_much": {}, "message": message[:2000]}


def out_of_memory(folder: str, exit_code: int, log: str = "", host: str | None = None) -> dict[str, Any] | None:
    """The out-of-memory record of a script that ended with ``exit_code`` (see the module's docstring), or None."""
    if exit_code == 0:
        return None
    return cuda_record(folder) or kernel_record(folder, host) or ray_monitor_record(log)


def job_log(environ: dict[str, str] | None = None) -> str:
    """The Ray job's own log so far (the entrypoint's output, the script's included), or "" where it cannot be found:
    ``<ray temp dir>/session_*/logs/job-driver-<submission id>.log`` (ray/dashboard/modules/job/common.py
    JOB_LOGS_PATH_TEMPLATE, job_log_storage_client.py get_log_file_path)."""
    environ = os.environ if environ is None else environ
    try:
        submission = json.loads(environ.get(RAY_JOB_CONFIG_ENV) or "{}")["metadata"]["job_submission_id"]
    except (ValueError, KeyError, TypeError):
        return ""
    root = Path(environ.get("RAY_TMPDIR") or "/tmp", "ray")
    for path in sorted(root.glob(f"session_*/logs/job-driver-{submission}.log")):
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
    return ""


def camel(record: dict[str, Any]) -> dict[str, Any]:
    """The record as the progress ConfigMap and the status carry it (camelCase, api.outcome.OutOfMemory's aliases)."""
    def key(name: str) -> str:
        head, *rest = name.split("_")
        return head + "".join(part.title() for part in rest)

    def convert(value: Any) -> Any:
        if isinstance(value, dict):
            return {key(k): convert(v) for k, v in value.items() if v is not None}
        return value

    return convert(record)
