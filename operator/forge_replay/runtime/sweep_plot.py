"""frontier.png: a sweep's peaks against its swept axis, the budget line and the out-of-memory points (drawn with
matplotlib as memory.png is, runtime/report.py)."""

from __future__ import annotations

from pathlib import Path

from forge_replay.dumps.writing import write_atomically


def _label(at: dict) -> str:
    return ", ".join(f"{field.rsplit('.', 1)[-1]}={value:g}" for field, value in at.items()) or "peak"


def plot_series(summary: dict) -> tuple[str, list[tuple[str, float | None, list[tuple[float, float | None, str]]]]]:
    """The swept (last) axis's field, and per line of the sweep (a combination of the other axes): its label, its
    frontier so far, and its measured points (value, peak GiB or None, outcome) in increasing value."""
    swept = summary["axes"][-1]["field"]
    lines = []
    for entry in summary.get("frontier") or []:
        at = {k: float(v) for k, v in (entry.get("at") or {}).items()}
        points = sorted((float(p["values"][swept]), p.get("peak_gib"), p.get("outcome") or "")
                        for p in summary.get("points") or []
                        if {k: float(v) for k, v in p["values"].items() if k != swept} == at)
        lines.append((_label(at), entry.get("value"), points))
    return swept, lines


def write_frontier_plot(summary: dict, path: Path, title: str, on_gpu: bool = False) -> Path | None:
    """Write frontier.png: per combination of the other axes, the measured peak per value of the swept axis (a
    point that ran out of memory is a red cross at the top), the budget and the budget less the headroom (dashed);
    the frontier's value of each line marked. None when no point was measured."""
    swept, lines = plot_series(summary)
    if not any(points for _, _, points in lines):
        return None
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    peaks = [peak for _, _, points in lines for _, peak, _ in points if peak is not None]
    budget, limit = summary.get("budget_gib"), summary.get("limit_gib")
    top = max(peaks + [budget or 0.0, limit or 0.0, 1e-3]) * 1.08
    oom_said = False
    for label, fits, points in lines:
        measured = [(value, peak) for value, peak, outcome in points if peak is not None and outcome != "outOfMemory"]
        line = ax.plot([v for v, _ in measured], [p for _, p in measured], marker="o", label=label)[0]
        oom = [value for value, _, outcome in points if outcome == "outOfMemory"]
        if oom:
            ax.scatter(oom, [top] * len(oom), marker="x", s=80, color="red", zorder=3,
                       label=None if oom_said else "out of memory")
            oom_said = True
        if fits is not None:
            ax.axvline(float(fits), color=line.get_color(), linestyle=":", alpha=0.7)
    if budget is not None:
        ax.axhline(budget, color="black", linewidth=1, label=f"budget {budget:g} GiB")
    if limit is not None and limit != budget:
        ax.axhline(limit, color="black", linestyle="--", linewidth=1, label=f"budget less headroom {limit:.3g} GiB")
    swept_values = [float(v) for v in summary["axes"][-1]["values"]]
    if min(swept_values) > 0 and max(swept_values) / min(swept_values) >= 4:  # token counts: doublings
        ax.set_xscale("log", base=2)
    ax.set_xlabel(f"{swept} (dotted: the frontier, the largest value that fits)")
    ax.set_ylabel("peak GiB per GPU (trainer CUDA reserved, or the engines')" if on_gpu
                  else "peak RSS GiB per trainer rank (CPU)")
    ax.set_ylim(0, top * 1.04)
    ax.set_title(f"{title}: memory frontier ({summary.get('search', 'sweep')}, "
                 f"{summary.get('points_run', len(summary.get('points') or []))} point(s) run)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    write_atomically(path, png.getvalue())
    return path
