"""What a trainer rank records about itself for a baseline comparison: torch's deterministic settings (debug
replay turns them on) and its thread settings. report.json's ``environment`` is built from these, with the versions
and settings that explain a run that moved (``forge_replay.verdict.identity.ENVIRONMENT_KEYS`` names its fields;
``forge_replay.verdict.explain`` compares them)."""

from __future__ import annotations

import os
from importlib import metadata

CUBLAS_WORKSPACE = ":4096:8"
"""CUBLAS_WORKSPACE_CONFIG that makes cuBLAS deterministic (torch's reproducibility notes, CUDA >= 10.2)."""
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def make_deterministic(use_gpu: bool, warn_only: bool = True) -> dict:
    """Turn on torch's deterministic settings in this process (a trainer rank, before its first CUDA call) and
    say which were on. ``warn_only``: an op without a deterministic implementation warns instead of failing."""
    import torch

    on: dict = {"use_deterministic_algorithms": True, "warn_only": warn_only}
    if use_gpu:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        on["cublas_workspace_config"] = os.environ["CUBLAS_WORKSPACE_CONFIG"]
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        on["cudnn_deterministic"] = True
        on["cudnn_benchmark"] = False
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    on["use_deterministic_algorithms"] = torch.are_deterministic_algorithms_enabled()
    on["warn_only"] = torch.is_deterministic_algorithms_warn_only_enabled()
    return on


def thread_settings() -> dict:
    """This process's thread settings, which change CPU results in the last bits: torch's intra-op and inter-op
    thread counts and OMP_NUM_THREADS / MKL_NUM_THREADS as set (None when unset)."""
    import torch

    return {"torch_intra_op": torch.get_num_threads(), "torch_inter_op": torch.get_num_interop_threads(),
            **{name: os.environ.get(name) for name in THREAD_VARIABLES}}


def environment(seed: int, device: str, world_size: int, deterministic: dict | None, threads: dict | None,
                spec=None) -> dict:
    """report.json's ``environment``: what a baseline comparison needs to be meaningful, and what explains a run
    that moved (issue 35): the CUDA and sglang versions, the GPU product (``device``), and with the job's ``spec``
    (:func:`run_settings`) the engine arguments and the trainer settings that change memory but not the numbers."""
    from forge_replay import __version__

    return {
        "seed": seed,
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "forge_replay": __version__,
        "device": device,
        "world_size": world_size,
        "deterministic": deterministic or {},
        "threads": threads or {},
        "cuda": _cuda_version(),
        "sglang": _version("sglang"),
        **(run_settings(spec) if spec is not None else {}),
    }


def run_settings(spec) -> dict:
    """What of the job's spec changes memory or speed but not the numbers a baseline compares: the trainer's
    gradient checkpointing and micro-batch tokens, its image (slime / miles), and in forge mode the sglang engines'
    arguments and how many GPUs each has."""
    t = spec.trainer
    out: dict = {"trainer": {"gradient_checkpointing": t.gradient_checkpointing,
                             "micro_batch_tokens": t.micro_batch_tokens}}
    if t.image:
        out["images"] = {"trainer": t.image}
    if spec.rollout is not None:
        out["engine_args"] = dict(spec.rollout.engine_args)
        out["engines"] = {"num_gpus_per_engine": spec.rollout.num_gpus_per_engine, "colocate": spec.rollout.colocate}
    return out


def _cuda_version() -> str | None:
    """torch.version.cuda (None for a CPU build, or without torch)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.version.cuda


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
