"""The figures of report.json that spec.expect can gate, by name: the per-rollout numbers a debug replay reproduces
bit for bit (:data:`ROLLOUT_METRICS`), and the measurements that vary from run to run (:data:`MEASURED_METRICS`:
step times and memory), which only a band (spec.expect.baseline.bands) or a window (spec.expect.windows) gates."""

from __future__ import annotations

ROLLOUT_METRICS = (
    "loss", "grad_norm", "clip_fraction", "reward_mean", "tokens", "loss_tokens", "num_samples", "micro_batches",
    "masked_out_samples", "multimodal_ignored_samples",
)
"""The per-rollout numeric fields of report.json a baseline can compare (the deterministic ones: step times
and memory vary run to run)."""

TIMING_METRICS = ("step_seconds", "data_wait_seconds", "weight_sync_seconds")
"""Per-rollout times of report.json (seconds)."""

MEMORY_METRICS = ("peak_reserved_gib", "peak_allocated_gib", "peak_rss_gib")
"""Per-rank memory peaks of a rollout's ``memory`` entries (GiB): per rollout the highest of any rank, and per rank
the highest of the run (``over: peakPerRank``)."""

MEASURED_METRICS = TIMING_METRICS + MEMORY_METRICS
GATED_METRICS = ROLLOUT_METRICS + MEASURED_METRICS
"""Every metric a band or a window can gate."""
