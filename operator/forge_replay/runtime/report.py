"""The run report: per rollout and per rank, a summary, as JSON, a PNG plot and a rich table.

Pure functions build the records and the summary; the writers only format them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from forge_replay.dumps.writing import write_atomically
from forge_replay.verdict.reports import FINITE_METRICS, dumps_strict, non_finite_metrics

log = logging.getLogger(__name__)

REPORT_JSON = "report.json"
MEMORY_PLOT = "memory.png"


@dataclass
class RolloutRecord:
    """One training step (one rollout)."""

    step: int
    rollout_id: int
    loss: float
    tokens: int
    loss_tokens: float
    num_samples: int
    micro_batches: int
    step_seconds: float
    data_wait_seconds: float
    fallback_used: bool
    dump_path: str
    clip_fraction: float
    grad_norm: float
    reward_mean: float
    memory: list[dict]
    """One entry per rank (see ``forge_replay.runtime.trainer.memory.RankMemory``)."""
    weight_sync_seconds: float | None = None
    """forge mode: the push of this step's weights to every engine, checks included; None in debug mode."""
    masked_out_samples: int = 0
    """Samples whose loss mask is all zeros: slime accepts them, they add no loss token."""
    rollout_id_mismatch: str | None = None
    """Why the dump's own rollout_id is not the rollout its file stands for (slime never reads it); None when it is."""
    multimodal_ignored_samples: int = 0
    """Samples with multimodal inputs (VLM images, pixel_values) of which the builtin trainer trained the tokens only."""
    stretch: dict | None = None
    """spec.replay.stretch: this rollout's longest sample before and after, the factor, its tokens before and after
    (``forge_replay.dumps.stretch.StretchRecord``); None when not stretched."""
    non_finite: dict[str, str] = field(default_factory=dict)
    """loss / grad_norm values that are not finite, as ``{"grad_norm": "nan"}``: report.json writes them as null
    (strict JSON), so this says what they were."""


@dataclass
class EvalRecord:
    """What one eval reports: a missing eval dump is an empty result, flagged, never a fallback."""

    after_rollout_id: int | None
    """The training rollout this eval followed; None for the eval before the first step (evalBeforeTrain)."""
    eval_id: int
    path: str | None
    missing: bool
    num_samples: int
    reward_mean: float | None
    truncated: int
    skipped: str = ""
    """Why this eval was skipped (its engines failed the eval fleet's self-probe), as miles skips an eval point
    instead of failing the job; "" when it ran."""


@dataclass
class RunReport:
    job: str
    mode: str
    world_size: int
    device: str
    num_params: int
    started_at: str
    partial: bool = True
    """True until the run has trained every planned rollout and written its final report."""
    completed: int = 0
    planned: int = 0
    error: str | None = None
    """Why the run stopped early (one line), when it did."""
    interrupted: str | None = None
    """The signal that stopped the run early (SIGINT, SIGTERM), when one did; ``planned`` says what was left."""
    time_to_first_step_seconds: float | None = None
    rollouts: list[RolloutRecord] = field(default_factory=list)
    evals: list[EvalRecord] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    engines: dict | None = None
    """forge mode: engine count, restarts, weight versions, health/eval probes, GPU memory held
    (``forge_replay.runtime.engines.fleet.EngineFleet.report``); None in debug mode."""
    identity: dict = field(default_factory=dict)
    """What the run replayed: job, mode, dump path template, model (config hash or path) and the trainer settings
    that change the numbers (``forge_replay.verdict.identity.identity_of``)."""
    environment: dict = field(default_factory=dict)
    """What a baseline comparison needs to be meaningful: seed, torch / transformers / forge-replay versions,
    device, world size, thread settings and the deterministic settings that were on
    (``forge_replay.runtime.environment.environment``)."""
    warnings: list[str] = field(default_factory=list)
    """What the run says but does not fail on: a plot that could not be written, a baseline of another
    environment or identity."""
    stopped_early: str | None = None
    """Why the run was stopped before its last rollout by an expectation (over spec.expect.maxPeakMemoryGiB)."""
    expectations: list[dict] | None = None
    """The verdict on spec.expect, one entry per check (``forge_replay.verdict.checks.Check``); None without
    spec.expect."""
    enforced: bool | None = None
    """spec.expect.enforce when the verdict was decided: false, shadow mode (recorded, the run still succeeds:
    ``forge_replay.verdict.shadow``); None without a verdict."""
    preflight: dict | None = None
    """What the pre-flight checked before the run: dump files ``verified`` and ``trusted`` (from the verify Job's
    record), ``seconds``, the ``record`` and why it was not used (``note``); None with spec.replay.verify false."""
    outcome: str | None = None
    """How the run ended, as a memory test reads it (set when it ends): fits, overBudget, outOfMemory or failed
    (``forge_replay.verdict.outcome.outcome_of``)."""
    stretch: dict | None = None
    """spec.replay.stretch: ``max_tokens`` and, over the rollouts trained, the longest sample before and after and
    the factors (:func:`stretch_report`); None when the samples are replayed as recorded."""
    sweep: dict | None = None
    """With spec.sweep (the sweep's own report.json): every point and the frontier
    (``forge_replay.verdict.sweep.SweepSearch.summary``), and ``engine_starts``; each point's report is in points/NN."""
    out_of_memory: dict | None = None
    """With outcome outOfMemory, the record of which signal, where, when and how much
    (``forge_replay.api.outcome.OutOfMemory``, snake_case); None otherwise."""

    def to_dict(self) -> dict:
        return asdict(self)


def combine_rank_results(step: int, batch, rank_results: list[dict], data_wait_seconds: float,
                         step_seconds: float) -> RolloutRecord:
    """Merge the ranks' step results and the rollout's metadata into one record."""
    loss_tokens = sum(r["loss_tokens"] for r in rank_results)
    loss = sum(r["loss_sum"] for r in rank_results) / max(loss_tokens, 1.0)
    clip_fraction = sum(r["clipped_tokens"] for r in rank_results) / max(loss_tokens, 1.0)
    record = RolloutRecord(
        step=step,
        rollout_id=batch.rollout_id,
        loss=loss,
        tokens=sum(r["tokens"] for r in rank_results),
        loss_tokens=loss_tokens,
        num_samples=batch.num_samples,
        micro_batches=max(r["micro_batches"] for r in rank_results),
        step_seconds=step_seconds,
        data_wait_seconds=data_wait_seconds,
        fallback_used=batch.fallback_used,
        dump_path=batch.path,
        clip_fraction=clip_fraction,
        grad_norm=rank_results[0]["grad_norm"],
        reward_mean=batch.reward_mean,
        memory=sorted((r["memory"] for r in rank_results), key=lambda m: m["rank"]),
        masked_out_samples=batch.masked_out,
        rollout_id_mismatch=batch.rollout_id_mismatch or None,
        multimodal_ignored_samples=batch.multimodal_ignored,
        stretch=batch.stretch,
    )
    record.non_finite = non_finite_metrics({metric: getattr(record, metric) for metric in FINITE_METRICS})
    return record


def stretch_report(max_tokens: int | None, records: list[RolloutRecord]) -> dict | None:
    """report.json's ``stretch``: spec.replay.stretch.maxTokens and, over the rollouts stretched so far, the longest
    sample before and after, the smallest and largest factor (each rollout's longest reaches maxTokens, so each has
    its own) and the tokens before and after; None without spec.replay.stretch."""
    if max_tokens is None:
        return None
    done = [r.stretch for r in records if r.stretch]

    def most(key: str, pick=max):
        return pick(s[key] for s in done) if done else None

    return {"max_tokens": max_tokens, "rollouts": len(done), "longest_before": most("longest_before"),
            "longest_after": most("longest_after"), "factor_min": most("factor", min), "factor_max": most("factor"),
            "tokens_before": sum(s["tokens_before"] for s in done),
            "tokens_after": sum(s["tokens_after"] for s in done)}


def headline_gib(memory: dict) -> float:
    """CUDA peak allocated on GPU, peak RSS on CPU."""
    allocated = memory.get("peak_allocated_gib")
    return allocated if allocated is not None else memory["peak_rss_gib"]


def memory_source(memory: dict) -> str:
    """What a rank's figures measure: ``cuda`` (torch's peak allocated / reserved) or ``rss`` (the process's
    peak resident set size, on CPU)."""
    return "cuda" if memory.get("peak_allocated_gib") is not None else "rss"


MEMORY_LABELS = {"cuda": "peak CUDA allocated", "rss": "peak RSS"}
"""How the summary line names each source's headline figure."""


def peak_gib(peak: dict) -> float:
    """The headline figure of a ``memory_peak`` summary: CUDA allocated, or RSS on CPU."""
    return peak["peak_allocated_gib"] if peak["source"] == "cuda" else peak["peak_rss_gib"]


def memory_peak(records: list[RolloutRecord]) -> dict | None:
    """The highest per-rank peak over all steps, named by what it measures: ``source`` is ``cuda`` (then
    peak_allocated_gib and peak_reserved_gib) or ``rss`` on CPU (then peak_rss_gib; the CUDA figures are None).
    Also rank, step and device."""
    best = None
    for record in records:
        for mem in record.memory:
            if best is None or headline_gib(mem) > headline_gib(best[1]):
                best = (record.step, mem)
    if best is None:
        return None
    step, mem = best
    source = memory_source(mem)
    return {
        "source": source,
        "peak_allocated_gib": mem.get("peak_allocated_gib"),
        "peak_reserved_gib": mem.get("peak_reserved_gib"),
        "peak_rss_gib": mem["peak_rss_gib"] if source == "rss" else None,
        "rank": mem["rank"],
        "step": step,
        "device": mem["device"],
    }


def progress_memory(peak: dict | None):
    """The ``memory_peak`` summary as progress.json and the status carry it (``MemoryPeak``), or None."""
    from forge_replay.api import MemoryPeak

    if not peak:
        return None
    return MemoryPeak(source=peak["source"], peak_allocated_gib=peak["peak_allocated_gib"],
                      peak_reserved_gib=peak["peak_reserved_gib"], peak_rss_gib=peak["peak_rss_gib"], rank=peak["rank"],
                      device=peak.get("device"))


def summarize(records: list[RolloutRecord], evals: list[EvalRecord], time_to_first_step: float | None) -> dict:
    """Totals and the figures a memory test or a replay check looks at first."""
    step_s = sum(r.step_seconds for r in records)
    wait_s = sum(r.data_wait_seconds for r in records)
    tokens = sum(r.tokens for r in records)
    losses = [r.loss for r in records]
    mismatched = [r.rollout_id for r in records if r.rollout_id_mismatch]
    non_finite = [r.rollout_id for r in records if r.non_finite]
    return {
        "rollouts": len(records),
        "fallbacks": sum(r.fallback_used for r in records),
        "fallback_rollout_ids": [r.rollout_id for r in records if r.fallback_used],
        "masked_out_samples": sum(r.masked_out_samples for r in records),
        "multimodal_ignored_samples": sum(r.multimodal_ignored_samples for r in records),
        "rollout_id_mismatches": len(mismatched),
        "rollout_id_mismatch_rollout_ids": mismatched,
        "all_losses_finite": all(math.isfinite(x) for x in losses),
        "all_finite": not non_finite,
        "non_finite_rollout_ids": non_finite,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "tokens": tokens,
        "train_seconds": step_s,
        "data_wait_seconds": wait_s,
        "data_wait_share": wait_s / (step_s + wait_s) if step_s + wait_s > 0 else 0.0,
        "tokens_per_second": tokens / step_s if step_s > 0 else 0.0,
        "time_to_first_step_seconds": time_to_first_step,
        "weight_sync_seconds": _total_or_none([r.weight_sync_seconds for r in records]),
        "memory_peak": memory_peak(records),
        "evals": len(evals),
        "evals_missing": sum(e.missing for e in evals),
        "evals_skipped": sum(bool(e.skipped) for e in evals),
    }


def _total_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def write_json(report: RunReport, directory: str | Path) -> Path:
    """report.json, written whole (a temporary file and a rename): a run killed or a disk filled mid-write
    leaves the previous version. Strict JSON: a non-finite number is written as null, its rollout's
    ``non_finite`` and the summary's ``all_finite`` say so. Raises OSError."""
    path = Path(directory) / REPORT_JSON
    write_atomically(path, dumps_strict(report.to_dict(), indent=2, sort_keys=False) + "\n")
    return path


def write_plot(report: RunReport, directory: Path) -> Path | None:
    """PNG: memory peak per step per rank (top; dashed = CUDA reserved), loss per step (bottom)."""
    if not report.rollouts:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r.step for r in report.rollouts]
    fig, (ax_mem, ax_loss) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, height_ratios=[2, 1])
    on_gpu = memory_source(report.rollouts[0].memory[0]) == "cuda"
    for rank in range(report.world_size):
        per_step = [next(m for m in r.memory if m["rank"] == rank) for r in report.rollouts]
        line = ax_mem.plot(steps, [headline_gib(m) for m in per_step], marker="o", label=f"rank {rank}")[0]
        if on_gpu:
            ax_mem.plot(steps, [m["peak_reserved_gib"] for m in per_step], linestyle="--", color=line.get_color())
    ax_mem.set_ylabel("peak CUDA allocated GiB (dashed: reserved)" if on_gpu else "peak RSS GiB (CPU, not CUDA)")
    ax_mem.set_title(f"{report.job}: {report.mode} replay, {report.world_size} rank(s) on {report.device}")
    ax_mem.grid(alpha=0.3)
    ax_mem.legend(loc="best", fontsize="small", ncol=max(1, report.world_size // 8))
    ax_loss.plot(steps, [r.loss for r in report.rollouts], marker=".", color="black")
    for r in report.rollouts:
        if r.fallback_used:
            ax_loss.axvline(r.step, color="orange", alpha=0.3)
    ax_loss.set_xlabel("step (orange: rollout 0's dump used as fallback)")
    ax_loss.set_ylabel("policy loss")
    from matplotlib.ticker import MaxNLocator

    ax_loss.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_loss.grid(alpha=0.3)
    fig.tight_layout()
    import io

    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    path = directory / MEMORY_PLOT
    write_atomically(path, png.getvalue())
    return path


def write_report(report: RunReport, directory: str | Path) -> dict:
    """Write memory.png, then report.json, into ``directory`` (each whole); returns their paths.

    A plot that cannot be written (a full disk) is a warning: logged and recorded in the report's ``warnings``,
    ``files.plot`` null; report.json is written all the same. Raises OSError when report.json cannot be."""
    directory = Path(directory)
    try:
        plot = write_plot(report, directory)
    except OSError as exc:
        plot = None
        warning = f"{MEMORY_PLOT} not written: {exc.strerror or exc} ({exc.filename or directory})"
        log.warning("%s", warning)
        report.warnings.append(warning)
    report.files = {**report.files, "report": str(directory / REPORT_JSON), "plot": str(plot) if plot else None}
    write_json(report, directory)
    return report.files


def render_table(report: RunReport):
    """A rich renderable: one row per rollout, then the summary."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    on_gpu = bool(report.rollouts) and memory_source(report.rollouts[0].memory[0]) == "cuda"
    # Fits 80 columns: no outer edge, and no step column (a row's place is its step, the rollout id names it).
    table = Table(title=f"{report.job}: {report.mode} replay on {report.world_size} x {report.device}",
                  show_edge=False)
    for name in ("rollout", "loss", "tokens", "step s", "wait s",
                 "CUDA GiB (rank)" if on_gpu else "RSS GiB (rank)", "fallback"):
        table.add_column(name, justify="right" if name not in ("fallback",) else "center", no_wrap=True)
    for r in report.rollouts:
        top = max(r.memory, key=headline_gib)
        table.add_row(
            str(r.rollout_id), f"{r.loss:.5f}", str(r.tokens), f"{r.step_seconds:.2f}",
            f"{r.data_wait_seconds:.3f}", f"{headline_gib(top):.2f} ({top['rank']})",
            Text("yes", style="bold yellow") if r.fallback_used else "",
        )
    s = report.summary
    peak = s.get("memory_peak") or {}
    lines = [
        f"rollouts {s.get('rollouts', 0)}, fallbacks {s.get('fallbacks', 0)}"
        + (f" (rollouts {s['fallback_rollout_ids']} trained on rollout 0's dump)" if s.get("fallbacks") else ""),
        f"{MEMORY_LABELS[peak['source']]} {peak_gib(peak):.2f} GiB on rank {peak.get('rank')} at rollout "
        f"{report.rollouts[peak['step']].rollout_id}"
        + (f" (reserved {peak['peak_reserved_gib']:.2f} GiB)" if peak.get("peak_reserved_gib") is not None else "")
        if peak else "peak memory: none recorded",
        f"tokens/s {s.get('tokens_per_second', 0):.0f}, data-wait share {100 * s.get('data_wait_share', 0):.2f}%, "
        f"time to first step {s.get('time_to_first_step_seconds') or 0:.1f}s",
    ]
    if s.get("masked_out_samples"):  # data slime accepts, named with the rollouts that held it
        masked = [r.rollout_id for r in report.rollouts if r.masked_out_samples]
        lines.append(f"samples with an all-zero loss mask {s['masked_out_samples']} (rollouts {masked}: no loss token)")
    if s.get("multimodal_ignored_samples"):
        lines.append(f"multimodal inputs ignored in {s['multimodal_ignored_samples']} sample(s): the builtin trainer"
                     " trained their text tokens only")
    if s.get("rollout_id_mismatches"):
        lines.append(f"rollout_id mismatches {s['rollout_id_mismatches']} "
                     f"(rollouts {s['rollout_id_mismatch_rollout_ids']}: the dump's rollout_id is not its file's)")
    if report.stretch and report.stretch["rollouts"]:
        st = report.stretch
        lines.append(f"stretched to maxTokens {st['max_tokens']}: longest sample {st['longest_before']} -> "
                     f"{st['longest_after']} tokens, factor {st['factor_min']:.2f}-{st['factor_max']:.2f}")
    for e in report.evals:
        when = " (before training)" if e.after_rollout_id is None else ""
        lines.append(
            f"eval {e.eval_id}{when}: " + (f"SKIPPED ({e.skipped})" if e.skipped
                                            else "MISSING dump (empty result)" if e.missing
                                            else f"{e.num_samples} samples, reward mean {e.reward_mean}, "
                                                 f"truncated {e.truncated}")
        )
    if report.engines:
        lines.append(engines_line(report.engines))
    if report.outcome:
        lines.append(outcome_line(report))
    lines += [f"warning: {w}" for w in report.warnings]
    if report.files:
        lines.append(f"report: {report.files.get('report')}  plot: {report.files.get('plot')}")
    return Group(table, *(Text(line) for line in lines))


def outcome_line(report: RunReport) -> str:
    """The run's outcome in one line; an out-of-memory says where, when and how much."""
    if report.out_of_memory:
        from forge_replay.api.outcome import OutOfMemory

        return f"outcome: outOfMemory: {OutOfMemory.model_validate(report.out_of_memory).line()}"
    return f"outcome: {report.outcome}"


def engines_line(engines: dict) -> str:
    """One line on the forge-mode engines for the table."""
    versions = engines.get("weight_versions") or []
    memory = engines.get("memory_held_gib")
    return (
        f"engines {engines.get('engines', 0)}, restarts {engines.get('restarts', 0)}, "
        f"weight versions {versions[0] + '..' + versions[-1] if versions else 'none pushed'}"
        + (f" ({engines['weight_sync']})" if engines.get("weight_sync") else "")
        + (f", not served: {' '.join(engines['unsupported_endpoints'])}" if engines.get("unsupported_endpoints") else "")
        + (f", GPU memory held {memory:.2f} GiB" if memory is not None else "")
        + f", health monitors {engines.get('health_monitors', 0)}, router: {engines.get('router')}"
    )
