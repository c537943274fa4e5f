"""How a slime / miles job is started: the entrypoint, its Ray runtime env, and forge_replay made importable.

Pure functions of a validated spec; controller/render.py puts them into the RayJob, and ``forge-replay run
--trainer-root`` uses the same entrypoint on one machine.
"""

from __future__ import annotations

import shlex
from typing import Any

from forge_replay.backends.argv import injected_argv

FORGE_LIB_MOUNT = "/opt/forge-replay/lib"
"""Shared emptyDir in every Ray pod of a slime / miles job: forge_replay copied there from our runtime image."""
FORGE_LIB_VOLUME = "forge-replay-lib"
FORGE_LIB_CONTAINER = "forge-replay-lib"

MEGATRON_PATH = "/root/Megatron-LM/"
"""Where slime's and miles' images keep Megatron-LM (their launch scripts put it on PYTHONPATH)."""

DEFAULT_ENV = {"PYTHONPATH": MEGATRON_PATH, "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
"""slime's and miles' usual runtime env (scripts/run-*.sh: ray job submit --runtime-env-json)."""


def command(spec: Any, dumps_root: str) -> list[str]:
    """``python3 <script> <args> <injected>``: the team's argv first, forge-replay's flags after it."""
    return ["python3", spec.trainer.script, *spec.trainer.args, *injected_argv(spec, dumps_root)]


PUBLISH_MODULE = "forge_replay.backends.publish"
"""Run after the team's script: the memory probe's report into report.json and status.memory."""


def entrypoint(spec: Any, dumps_root: str, working_dir: str | None = None, results_dir: str | None = None,
               job_name: str = "", progress_configmap: str | None = None) -> str:
    """The shell line a RayJob runs: ``cd <workingDir> && python3 <script> ...``, every word quoted.

    With ``results_dir``, the memory report is published once the script has ended, whatever its exit status
    (``python3 -m forge_replay.backends.publish``, into ``progress_configmap`` too when given; with
    spec.expect.maxPeakMemoryGiB it records the verdict on the probe's peak, with spec.expect.outcome the one on
    the run's outcome); the line still exits with the script's status."""
    folder = working_dir if working_dir is not None else spec.trainer.working_dir
    run = f"cd {shlex.quote(folder)} && {shlex.join(command(spec, dumps_root))}"
    if results_dir is None:
        return run
    publish = ["python3", "-m", PUBLISH_MODULE, "--results", results_dir, "--job", job_name,
               "--backend", spec.trainer.backend, "--script", spec.trainer.script,
               "--total", str(spec.replay.num_rollouts)]
    if progress_configmap:
        publish += ["--configmap", progress_configmap]
    if spec.expect is not None and spec.expect.max_peak_memory_gib is not None:  # the verdict on the probe's peak
        publish += ["--max-peak-memory-gib", repr(spec.expect.max_peak_memory_gib)]
    if spec.expect is not None and spec.expect.outcome is not None:  # ... and on the run's outcome
        publish += ["--expect-outcome", spec.expect.outcome]
    if spec.expect is not None and not spec.expect.enforce:  # shadow mode: the verdict recorded, not enforced
        publish += ["--shadow"]
    return f'{run}; code=$?; {shlex.join(publish)} --exit-code "$code"; exit "$code"'


def env_vars(spec: Any, forge_lib: str = FORGE_LIB_MOUNT) -> dict[str, str]:
    """The Ray job's runtime env ``env_vars``: DEFAULT_ENV, then spec.trainer.env over it; ``forge_lib`` is
    always appended to PYTHONPATH (the loader must import whatever the team sets)."""
    merged = {**DEFAULT_ENV, **spec.trainer.env}
    paths = [p for p in merged["PYTHONPATH"].split(":") if p] if merged.get("PYTHONPATH") else []
    merged["PYTHONPATH"] = ":".join([*paths, forge_lib] if forge_lib not in paths else paths)
    return merged


def runtime_env(spec: Any) -> dict[str, Any]:
    """The RayJob's runtime env (KubeRay's runtimeEnvYAML, as a dict)."""
    return {"env_vars": env_vars(spec)}


def with_probe(env: dict[str, Any], probe_dir: str) -> dict[str, Any]:
    """``env`` (a runtime env) with the memory probe started in every Ray worker, writing under ``probe_dir``."""
    from forge_replay.backends.probe import HOOK, PROBE_DIR_ENV

    return {**env, "worker_process_setup_hook": HOOK, "env_vars": {**env["env_vars"], PROBE_DIR_ENV: probe_dir}}


COPY_PACKAGE = (
    "import os, shutil, forge_replay; "
    f"shutil.copytree(os.path.dirname(forge_replay.__file__), {FORGE_LIB_MOUNT + '/forge_replay'!r}, "
    "dirs_exist_ok=True, ignore=shutil.ignore_patterns('__pycache__'))"
)
"""Copies the pure-Python forge_replay package from our runtime image into the shared volume."""


def forge_lib_init_container(image: str, security_context: dict[str, Any]) -> dict[str, Any]:
    """Init container (our runtime ``image``) that makes forge_replay importable in the team's image."""
    return {
        "name": FORGE_LIB_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-c", COPY_PACKAGE],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": security_context,
        "volumeMounts": [{"name": FORGE_LIB_VOLUME, "mountPath": FORGE_LIB_MOUNT}],
    }


def forge_lib_volume() -> dict[str, Any]:
    """The emptyDir the init container fills."""
    return {"name": FORGE_LIB_VOLUME, "emptyDir": {}}


def forge_lib_mount() -> dict[str, Any]:
    """The Ray container's read-only view of it."""
    return {"name": FORGE_LIB_VOLUME, "mountPath": FORGE_LIB_MOUNT, "readOnly": True}
