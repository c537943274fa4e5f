"""The disk path of the weight push after every training step: checkpoints written, staged and loaded.

The disk path (the distributed path lives in :mod:`.distributed`, the tensor path in :mod:`.tensor`; the spec's
``rollout.weightSync`` picks one, see :func:`forge_replay.runtime.gating.plan_weight_sync`):
``POST /update_weights_from_disk`` with a checkpoint directory on the engine's own node
(safetensors, HF ``save_pretrained`` layout; the trainer's files reach that node through Ray's object
store, see :func:`stage_checkpoint`, so no volume is shared), carrying the new
``weight_version`` and its ``load_format``; then ``/model_info`` must report that version, and ``/flush_cache``
drops KV entries computed with the old weights. Replay sends no generation traffic, so there is
nothing in flight to pause (``/pause_generation`` is not needed; sglang's update waits for
running requests itself), and a server needs only these three endpoints plus health. When the engines share the trainer's GPUs (colocate) their memory is
released (``/release_memory_occupation``) for training and resumed before the push (:mod:`.calls`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

from forge_replay.runtime.engines.http import EngineHTTPError, engine_call
from forge_replay.runtime.weights.calls import Caller, PushResult, WeightSyncError, confirm_weights, require_success

WEIGHTS_DIR_PREFIX = "weights-v"
CHECKPOINT_LOAD_FORMAT = "safetensors"
"""The format of every checkpoint written here, sent with each disk push: without ``load_format`` sglang loads
with the format the server was started with (``managers/tokenizer_manager.py``, ``update_weights_from_disk``), and
for a config-only model that is ``dummy``, whose loader the update refuses ("Failed to get model loader",
``model_executor/model_runner_components/weight_updater.py``, 0.5.23; the same in 0.5.19)."""

CheckpointFiles = dict[str, bytes]
"""A checkpoint directory's files by relative name: how weights travel through Ray's object store to
engines on other nodes, so that no volume needs to be shared between the trainer and the engines."""


def read_checkpoint_files(directory: Path) -> CheckpointFiles:
    """Every file of a checkpoint directory, by relative name."""
    directory = Path(directory)
    return {str(f.relative_to(directory)): f.read_bytes() for f in sorted(directory.rglob("*")) if f.is_file()}


def stage_checkpoint(files: Mapping[str, bytes], root: Path, version: int) -> Path:
    """Write ``files`` to ``root/weights-v<version>`` on this node (older versions removed); the directory."""
    target = Path(root) / f"{WEIGHTS_DIR_PREFIX}{version}"
    if not any(name.endswith(".safetensors") for name in files):
        raise WeightSyncError(f"checkpoint for version {version} holds no *.safetensors file to push to the engines")
    for name, data in files.items():
        path = (target / name).resolve()
        if target.resolve() not in path.parents:
            raise WeightSyncError(f"checkpoint file name {name!r} leaves {target}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for old in Path(root).glob(f"{WEIGHTS_DIR_PREFIX}*"):
        suffix = old.name[len(WEIGHTS_DIR_PREFIX):]
        if suffix.isdigit() and int(suffix) < version and old != target:
            shutil.rmtree(old, ignore_errors=True)
    return target


def save_weights(weights: object, directory: Path) -> Path:
    """Write ``weights`` (a ``save_pretrained`` model, an ``nn.Module`` or a tensor dict) as safetensors
    under ``directory``; a directory path is taken as an already written checkpoint."""
    directory = Path(directory)
    if isinstance(weights, (str, Path)):
        source = Path(weights)
        if not any(source.glob("*.safetensors")):
            raise WeightSyncError(f"checkpoint {source} holds no *.safetensors file to push to the engines")
        return source
    directory.mkdir(parents=True, exist_ok=True)
    if hasattr(weights, "save_pretrained"):
        weights.save_pretrained(directory, safe_serialization=True)
        return directory
    from safetensors.torch import save_file

    state = weights.state_dict() if hasattr(weights, "state_dict") else weights
    if not isinstance(state, Mapping):
        raise TypeError(f"cannot save weights of type {type(weights).__name__}: give a model or a tensor dict")
    # safetensors refuses shared storage and non-contiguous views: store plain contiguous copies.
    tensors = {name: tensor.detach().to("cpu").contiguous().clone() for name, tensor in state.items()}
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def write_versioned_checkpoint(weights: object, root: Path, version: int, config: Mapping | None = None) -> Path:
    """Save ``weights`` to ``root/weights-v<version>`` (and its config.json when given), removing
    older versions so the shared volume holds at most two."""
    root = Path(root)
    target = save_weights(weights, root / f"{WEIGHTS_DIR_PREFIX}{version}")
    if config is not None and not (target / "config.json").exists():
        (target / "config.json").write_text(json.dumps(dict(config), indent=1, sort_keys=True))
    for old in root.glob(f"{WEIGHTS_DIR_PREFIX}*"):
        suffix = old.name[len(WEIGHTS_DIR_PREFIX):]
        if suffix.isdigit() and int(suffix) < version - 1 and old != target:
            shutil.rmtree(old, ignore_errors=True)
    return target


def push_weights_from_disk(
    url: str, checkpoint_dir: Path, version: str, *, timeout_s: float = 600.0, call: Caller = engine_call
) -> PushResult:
    """Push one checkpoint to one engine and check it took: update, read the version back, flush."""
    try:
        answer = call(
            url,
            "/update_weights_from_disk",
            method="POST",
            body={"model_path": str(checkpoint_dir), "load_format": CHECKPOINT_LOAD_FORMAT,
                  "weight_version": version},
            timeout_s=timeout_s,
        )
    except EngineHTTPError as exc:
        raise WeightSyncError(f"engine {url} refused the weights in {checkpoint_dir} (version {version}): {exc}") from exc
    require_success(answer, url, f"the weights in {checkpoint_dir} (version {version})")
    return confirm_weights(url, version, timeout_s=timeout_s, call=call)


