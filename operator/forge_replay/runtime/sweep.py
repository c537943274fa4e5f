"""A sweep (``spec.sweep``): one job's points run one after another on one Ray cluster.

The search (which point next, what fits, the frontier) is :class:`forge_replay.verdict.sweep.SweepSearch`; this module
only runs its points: each with :func:`~forge_replay.runtime.driver.run_job` on engines kept warm for as long as the
engine configuration (:func:`~forge_replay.api.sweep.engine_key`) stays the same, with trainer actors of its own (a
point's memory peak is its own, whatever ran before it). A point that runs out of memory is recorded and the sweep
goes on; one that fails otherwise stops the sweep, named. Each point writes its report into ``points/NN/`` of the
results folder; ``sweep.json`` there holds the finished points, so that a rerun of the same job (or a resumed
cluster job) continues from the first unfinished point. The sweep's own report.json carries ``sweep``, beside
``frontier.png``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from forge_replay.dumps.writing import now_rfc3339, write_atomically
from forge_replay.runtime.driver import ReplayRunError, WarmEngines, place_and_manage, preflight, run_job
from forge_replay.runtime.report import RunReport, write_json

log = logging.getLogger(__name__)

SWEEP_STATE = "sweep.json"
"""The finished points of a sweep, in the results folder: what a rerun continues from."""
POINTS_DIR = "points"
"""Each point's own report.json, memory.png and progress.json: ``points/01``, ``points/02``, ..."""
FRONTIER_PLOT = "frontier.png"


def run_replay(config, **options) -> RunReport:
    """The job's run: :func:`run_sweep` when it has ``spec.sweep``, else :func:`run_job` (same options)."""
    if getattr(config.job.spec, "sweep", None) is not None:
        return run_sweep(config, **options)
    return run_job(config, **options)


def sweep_identity(job) -> str:
    """What a sweep's finished points belong to: the spec without what may change across a suspend and resume
    (``suspend``) or does not change a point's measure (``expect``, judged at the end)."""
    spec = job.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    for name in ("suspend", "expect"):
        spec.pop(name, None)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def values_key(values: dict) -> str:
    """A point's values as one comparable text (its order in the state file does not matter)."""
    return json.dumps(values, sort_keys=True)


@dataclass
class SweepState:
    """``sweep.json``: the identity of the job and every finished point (values, result, folder)."""

    identity: str
    points: list[dict] = field(default_factory=list)
    engine_starts: int = 0

    def save(self, directory: str | None) -> None:
        if directory:
            write_atomically(Path(directory) / SWEEP_STATE, json.dumps(
                {"identity": self.identity, "points": self.points, "engine_starts": self.engine_starts},
                indent=1) + "\n")


def load_state(directory: str | None, identity: str) -> SweepState:
    """The finished points a previous run of this sweep left in ``directory``; a state of another spec (or an
    unreadable one) is set aside as ``sweep.previous.json`` with its points folder, and the sweep starts over."""
    state = SweepState(identity)
    if not directory:
        return state
    path = Path(directory) / SWEEP_STATE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return state
    except (OSError, ValueError) as exc:
        doc = {"unreadable": str(exc)}
    if doc.get("identity") == identity and isinstance(doc.get("points"), list):
        state.points = doc["points"]
        state.engine_starts = int(doc.get("engine_starts") or 0)
        return state
    why = doc.get("unreadable") or "it belongs to another spec"
    log.warning("sweep: %s set aside as sweep.previous.json (%s): the sweep starts over", path, why)
    os.replace(path, path.with_name("sweep.previous.json"))
    points = Path(directory) / POINTS_DIR
    if points.is_dir():
        import shutil

        aside = points.with_name("points.previous")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(points, aside)
    return state


def point_result(report: RunReport, values: dict):
    """The :class:`~forge_replay.verdict.sweep.PointResult` of one point's run (its report): outcome, the largest
    trainer rank's peak (CUDA reserved on GPU, RSS on CPU), the engines' memory held, each step's time."""
    from forge_replay.verdict.sweep import PointResult

    peaks = [m.get("peak_reserved_gib") if m.get("peak_reserved_gib") is not None else m.get("peak_rss_gib")
             for record in report.rollouts for m in record.memory]
    peaks = [p for p in peaks if p is not None]
    return PointResult(
        values=dict(values), outcome=report.outcome or "failed", peak_rank_gib=max(peaks) if peaks else None,
        peak_engine_gib=(report.engines or {}).get("memory_held_gib"),
        step_seconds=[round(r.step_seconds, 4) for r in report.rollouts], message=report.error or "",
    )


class SweepRun:
    """One sweep: its search, its finished points (resumed from ``sweep.json``), the warm engines, the report."""

    def __init__(self, config, prepared, console, show_progress: bool, stopped_by, fixed_cluster: bool,
                 prefetch: bool = True):
        from forge_replay.api.sweep import engine_key
        from forge_replay.runtime.progress_publish import ProgressPublisher
        from forge_replay.runtime.trainer.rank import trainer_settings
        from forge_replay.verdict.identity import identity_of

        self.config, self.prepared, self.console = config, prepared, console
        self.show_progress, self.stopped_by, self.fixed_cluster, self.prefetch = (
            show_progress, stopped_by, fixed_cluster, prefetch)
        job = config.job
        self.spec = job.spec
        self.sweep = self.spec.sweep
        self.engine_key = engine_key
        self.settings = trainer_settings(self.spec.trainer, deterministic=prepared.plan.deterministic)
        self.state = load_state(config.results_dir, sweep_identity(job))
        self.publisher = ProgressPublisher(config.results_dir, config.progress_configmap, job.metadata.namespace)
        self.report = RunReport(
            job=job.metadata.name or "forge-replay", mode=prepared.plan.mode, world_size=self.settings.world_size,
            device="cuda" if self.settings.use_gpu else "cpu", num_params=0, started_at=now_rfc3339(),
        )
        self.report.identity = identity_of(self.report.job, self.spec)
        self.report.preflight = prepared.preflight
        self.search = None
        self.warm: WarmEngines | None = None
        self.warm_key: tuple | None = None
        self.rollouts_done = 0

    # -- the search --------------------------------------------------------------------------
    def budget_gib(self) -> float:
        """spec.sweep.budgetGiB, or (GPUs) the total memory of the trainer's device, read in its first bundle."""
        if self.sweep.budget_gib is not None:
            return float(self.sweep.budget_gib)
        if not self.settings.use_gpu:  # the API refuses this; said here too for a config written by hand
            raise ReplayRunError("spec.sweep.budgetGiB is required on CPU (gpusPerNode: 0): the budget per rank")
        self._warm_for(None)
        return device_total_gib(self.warm.placement)

    def start_search(self):
        from forge_replay.verdict.sweep import SweepSearch

        self.search = SweepSearch(self.sweep, self.budget_gib())
        if self.state.points:
            log.info("sweep: %d point(s) finished by an earlier run of this job in %s are kept", len(self.state.points),
                     self.config.results_dir)
        return self.search

    def next_point(self) -> tuple[dict | None, dict | None]:
        """The search's next point to run, and its finished record when an earlier run of this sweep ran it."""
        values = self.search.next_point()
        if values is None:
            return None, None
        done = {values_key(p["values"]): p for p in self.state.points}
        return values, done.get(values_key(values))

    # -- running a point ---------------------------------------------------------------------
    def _warm_for(self, key: tuple | None, job=None) -> None:
        """Engines (and the trainer's placement) for engine configuration ``key``: kept when it is the current one,
        else the current ones stopped and new ones placed (the engines start with the point's trainer)."""
        if self.warm is not None and (key is None or key == self.warm_key or not self.warm.used):
            if key is not None:  # placed before any point (to read the device's memory): its engines start now
                self.warm_key = key
            return
        self.stop_engines()
        config = self.config if job is None else self.config.model_copy(update={"job": job})
        placement, manager = place_and_manage(config, self.prepared, self.fixed_cluster)
        self.warm, self.warm_key = WarmEngines(placement, manager), key
        if self.prepared.plan.start_engines:
            self.state.engine_starts += 1

    def stop_engines(self) -> None:
        if self.warm is not None:
            warm, self.warm, self.warm_key = self.warm, None, None
            warm.stop()

    def run_point(self, index: int, values: dict):
        """Run one point (``rolloutsPerPoint`` rollouts) into ``points/NN``; returns its PointResult. Raises
        :class:`ReplayRunError` naming the point when it failed otherwise than by running out of memory."""
        from forge_replay.api.sweep import point_job

        job = point_job(self.config.job, values)
        spec = job.spec.model_copy(update={"expect": None, "sweep": None})  # judged by the sweep, not per point
        job = job.model_copy(update={"spec": spec})
        folder = os.path.join(POINTS_DIR, f"{index:02d}")
        directory = os.path.join(self.config.results_dir, folder) if self.config.results_dir else None
        if directory:
            from forge_replay.runtime.results import set_previous_aside

            os.makedirs(directory, exist_ok=True)
            set_previous_aside(directory)  # a point a stopped run left half done: its files kept, one run back
        config = self.config.model_copy(update={"job": job, "results_dir": directory, "progress_configmap": None,
                                                "baseline_path": None})
        self._warm_for(self.engine_key(values), job)
        named = describe(values)
        self.console.print(f"[bold]sweep point {index}[/]: {named}")
        began = time.perf_counter()
        try:
            report = run_job(config, fixed_cluster=self.fixed_cluster, console=self.console,
                             show_progress=self.show_progress, prepared=self.prepared, prefetch=self.prefetch,
                             stopped_by=self.stopped_by, warm=self.warm)
        except ReplayRunError as exc:
            raise ReplayRunError(f"sweep point {index} ({named}) failed: {exc}") from None
        if report.interrupted:
            raise KeyboardInterrupt
        if report.out_of_memory is not None and (report.out_of_memory.get("where") or {}).get("component") != "trainer":
            log.warning("sweep point %d (%s): out of memory outside the trainer: the engines start anew", index, named)
            self.stop_engines()  # an engine (or the head) that ran out is not one to keep using
        elif report.out_of_memory is not None and self.warm is not None and not self.warm.alive():
            log.warning("sweep point %d (%s): the rollout manager died with the rank that ran out of memory (Ray's "
                        "memory monitor stops several workers at once): it and its engines start anew", index, named)
            self.stop_engines()
        self.rollouts_done += report.completed
        result = point_result(report, values)
        log.info("sweep point %d (%s): %s in %.1f s", index, named, getattr(result, "outcome", "?"),
                 time.perf_counter() - began)
        if report.num_params:
            self.report.num_params = report.num_params
            self.report.environment = report.environment
        return result

    def record(self, index: int, values: dict, result) -> None:
        """The search learns the point; sweep.json keeps it; progress says it."""
        self.search.record(values, result)
        folder = os.path.join(POINTS_DIR, f"{index:02d}")
        self.state.points.append({"index": index, "values": values, "folder": folder, "result": result_dict(result)})
        self.state.save(self.config.results_dir)
        self.publish()

    def publish(self) -> None:
        """The sweep's progress (progress.json, and the ConfigMap in-cluster): points done, the frontier so far."""
        from forge_replay.api.progress_report import ProgressReport
        summary = self.search.summary()
        self.publisher.publish(ProgressReport(
            completed=self.rollouts_done, total=self.rollouts_done, sweep=sweep_progress(summary)))


def result_dict(result) -> dict:
    """A PointResult as sweep.json keeps it."""
    from dataclasses import asdict

    return asdict(result)


def result_from(doc: dict):
    """A PointResult read back from sweep.json (fields it does not know are left out)."""
    from dataclasses import fields

    from forge_replay.verdict.sweep import PointResult

    known = {f.name for f in fields(PointResult)}
    return PointResult(**{name: value for name, value in doc.items() if name in known})


def sweep_progress(summary: dict):
    """status.sweep from report.json's ``sweep`` (:meth:`SweepSearch.summary`)."""
    from forge_replay.api.status import SweepFrontierEntry, SweepProgress

    frontier = [SweepFrontierEntry(at={k: float(v) for k, v in f["at"].items()}, field=f["field"],
                                   value=None if f["value"] is None else float(f["value"]), complete=f["complete"])
                for f in summary["frontier"]]
    return SweepProgress(
        points_done=summary["points_run"], grid_points=summary["grid_points"], finished=summary["finished"],
        out_of_memory=sum(p["outcome"] == "outOfMemory" for p in summary["points"]),
        frontier=frontier, summary=frontier_line(summary)[:512])


def frontier_line(summary: dict) -> str:
    """The frontier in one line: ``replay.stretch.maxTokens <= 65536 at trainer.microBatchTokens=4096; ...``."""
    parts = []
    for f in summary["frontier"]:
        value = "none fits" if f["value"] is None else f"<= {f['value']}"
        at = f" at {describe(f['at'])}" if f["at"] else ""
        parts.append(f"{f['field'].rsplit('.', 1)[-1]} {value}{at}{'' if f['complete'] else ' (so far)'}")
    return "; ".join(parts)


def describe(values: dict) -> str:
    """A point in one line: ``trainer.microBatchTokens=4096, rollout.engineArgs.mem-fraction-static=0.7``."""
    return ", ".join(f"{name}={value}" for name, value in values.items())


def device_total_gib(placement) -> float:
    """The total memory of the GPU in the placement group's first bundle (before the trainer takes it)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    def total() -> float:
        import torch

        return torch.cuda.get_device_properties(0).total_memory / 1024**3

    strategy = PlacementGroupSchedulingStrategy(placement_group=placement, placement_group_bundle_index=0)
    return ray.get(ray.remote(total).options(num_cpus=1, num_gpus=1, scheduling_strategy=strategy).remote())


def run_sweep(config, *, fixed_cluster: bool = False, console=None, show_progress: bool = True, prepared=None,
              prefetch: bool = True, stopped_by=None) -> RunReport:
    """Run ``config.job``'s sweep on the connected Ray: every point the search asks for (those a previous run of the
    same job finished in this results folder are taken from ``sweep.json``), then report.json ``sweep``,
    frontier.png, the table and the verdict on ``spec.expect.frontier``. Raises :class:`ReplayRunError` naming the
    point that failed otherwise than by running out of memory (the points before it are kept)."""
    from rich.console import Console

    console = console or Console(stderr=True)
    prepared = prepared or preflight(config)
    run = SweepRun(config, prepared, console, show_progress, stopped_by, fixed_cluster, prefetch)
    report = run.report
    try:
        run.start_search()
        index = 0
        while True:
            if stopped_by is not None and stopped_by():
                raise KeyboardInterrupt
            values, done = run.next_point()
            if values is None:
                break
            if done is not None:  # finished by an earlier run of this sweep: taken as it was
                run.search.record(values, result_from(done["result"]))
                index = max(index, int(done.get("index", index)))
                continue
            index = max(index, max((int(p.get("index", 0)) for p in run.state.points), default=0)) + 1
            run.record(index, values, run.run_point(index, values))
    except ReplayRunError as exc:
        report.error = str(exc)
        raise
    except BaseException as exc:
        report.error = str(exc) or type(exc).__name__
        raise
    finally:
        run.stop_engines()
        finish_sweep(run, stopped_by)
    from forge_replay.verdict.sweep import sweep_table

    console.print(sweep_table(report.sweep), markup=False, highlight=False, soft_wrap=True)
    if report.expectations is not None:
        from forge_replay.verdict.run import render_verdict

        console.print(render_verdict(report.expectations))
    return report


def finish_sweep(run: SweepRun, stopped_by) -> None:
    """However the sweep ended: report.json (``sweep``, the verdict on ``spec.expect.frontier`` when it finished),
    frontier.png, the last progress. A problem writing them is logged (the run's own error, if any, is raised)."""
    from forge_replay.runtime.sweep_plot import write_frontier_plot

    report, spec = run.report, run.spec
    signal_name = stopped_by() if stopped_by is not None else None
    if signal_name:
        report.interrupted = signal_name
        report.error = report.error or f"interrupted by {signal_name}"
    if run.search is None:
        return
    report.sweep = run.search.summary()
    report.sweep["engine_starts"] = run.state.engine_starts
    report.completed = report.planned = report.sweep.get("points_run", len(run.state.points))
    report.partial = report.error is not None
    report.outcome = "failed" if report.error else None
    expected = getattr(spec.expect, "frontier", None) if spec.expect is not None else None
    if expected and report.error is None:
        from forge_replay.verdict.sweep import frontier_check

        report.expectations = [frontier_check(expected, report.sweep).to_dict()]
    directory = run.config.results_dir
    if not directory:
        return
    try:
        plot = write_frontier_plot(report.sweep, Path(directory) / FRONTIER_PLOT, report.job, run.settings.use_gpu)
        report.files = {"report": str(Path(directory) / "report.json"), "frontier_plot": str(plot) if plot else None,
                        "sweep_state": str(Path(directory) / SWEEP_STATE)}
        write_json(report, directory)
    except OSError as exc:
        log.error("cannot write the sweep's report to %s: %s", directory, exc.strerror or exc)
    run.publish()
