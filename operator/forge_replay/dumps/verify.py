"""Check that every dump a job needs exists, loads safely and converts, before any GPU is requested.

With the job's settings (a :class:`~forge_replay.dumps.convert.Conversion`: the operator's verify Job and
`forge-replay run` always give them), every train dump goes through the trainer's own conversion: dict rewards
without ``replay.rewardKey`` or without that key, token ids outside the model's vocabulary, samples longer than its
positions, response lengths or loss masks that do not fit the tokens, groups that do not split, make the file
unreadable, naming the rollout, file, sample and field. The model's limits come from its config, read without
weights (:func:`~forge_replay.dumps.model_limits.model_limits`); a config that cannot be read is noted and those two checks skipped. Without the
job's settings the per-sample checks run alone (:func:`~forge_replay.dumps.convert.check_samples`). Samples with an
all-zero loss mask and a top-level ``rollout_id`` that is not the file's rollout are counted and noted. Eval trains
nothing: an eval dump's rewards are read as the run reports them (:func:`eval_reward_problem`). For a slime / miles
job, train dumps also pass that framework's own acceptance rules (dumps/acceptance.py), and what the framework would
drop of a dump without a word (slime: episodes past the last whole step) is a note (``VerifyReport.dropped``), kept in
the verify record and in report.json's ``preflight``.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Literal, NamedTuple

from forge_replay.api.dump_path import eval_path, is_template, path_problem, train_path
from forge_replay.dumps.acceptance import UpstreamSettings, dropped_notes, refusals
from forge_replay.dumps.bounds import Limits
from forge_replay.dumps.convert import Conversion, check_samples, rollout_id_note
from forge_replay.dumps.evals import eval_rewards, replayed_eval_ids
from forge_replay.dumps.files import load
from forge_replay.dumps.safe_pickle import DumpError
from forge_replay.dumps.sample import Sample, SampleError
from forge_replay.dumps.verify_record import Entry, Stamp, read_record, record_key, stamp_of

Status = Literal["ok", "missing", "fallback", "unreadable"]


def resolve(root: str | None, relative: str) -> str:
    """The filesystem path of a dump path: under ``root`` when given, else as written."""
    return os.path.join(root, relative) if root else relative


@dataclass
class FileCheck:
    """The verdict on one needed dump file."""

    kind: Literal["train", "eval"]
    rollout_id: int
    path: str
    status: Status
    message: str = ""
    samples: int | None = None
    used_path: str | None = None  # the file actually read (the rollout-0 file on fallback)
    masked_out: int | None = None  # samples whose loss mask is all zeros
    rollout_id_mismatch: bool = False  # the dump's rollout_id is not the rollout its file stands for

    @property
    def problem(self) -> bool:
        """A missing eval dump is reported but is not a problem (it replays as an empty eval result)."""
        if self.status == "unreadable":
            return True
        return self.status == "missing" and self.kind == "train"


@dataclass
class VerifyReport:
    """Per-file verdicts; ``ok`` when every training rollout has a loadable dump and no file is corrupt."""

    template: str
    root: str | None
    checks: list[FileCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # checks that were skipped, and why; the dropped ones too
    dropped: list[str] = field(default_factory=list)  # what slime / miles would drop without a word, per rollout
    settings: FileSettings | None = None
    results: dict[tuple[str, str], FileResult] = field(default_factory=dict, repr=False)  # (path, kind) -> found
    verified: dict[str, str] = field(default_factory=dict)  # files read here -> why ("" without a record)
    trusted: list[str] = field(default_factory=list)  # files a verify record vouched for, unchanged since
    entries: dict = field(default_factory=dict, repr=False)  # what a new verify record holds (files that passed)
    record: str | None = None  # the verify record given to trust
    record_note: str = ""  # why it was not used, when it was not
    seconds: float = 0.0
    workers: int = 1  # worker processes that verified the files read here

    @property
    def ok(self) -> bool:
        return not any(c.problem for c in self.checks)

    @property
    def fallbacks(self) -> list[FileCheck]:
        return [c for c in self.checks if c.status == "fallback"]

    @property
    def problems(self) -> list[FileCheck]:
        return [c for c in self.checks if c.problem]

    @property
    def rollout_id_mismatches(self) -> int:
        return sum(1 for c in self.checks if c.rollout_id_mismatch)

    @property
    def masked_out(self) -> int:
        """Samples with an all-zero loss mask, over every distinct file read."""
        seen = {c.used_path: c.masked_out or 0 for c in self.checks if c.used_path}
        return sum(seen.values())

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "template": self.template,
            "root": self.root,
            "fallbacks": len(self.fallbacks),
            "problems": len(self.problems),
            "rollout_id_mismatches": self.rollout_id_mismatches,
            "masked_out_samples": self.masked_out,
            "notes": list(self.notes),
            "files": [asdict(c) | {"problem": c.problem} for c in self.checks],
        }

    def preflight(self) -> dict:
        """What a pre-flight did, for report.json's ``preflight`` and its log line: files verified here (by
        ``workers`` processes) and trusted from the verify record, the seconds it took, the record, why it was
        not used (``note``), and what the framework would drop (``notes``)."""
        return {"verified": len(self.verified), "trusted": len(self.trusted), "seconds": round(self.seconds, 3),
                "workers": self.workers,
                "record": self.record, "note": self.record_note, "notes": list(self.dropped),
                "verified_files": [record_key(p, self.root) for p in self.verified],
                "trusted_files": [record_key(p, self.root) for p in self.trusted]}

    def preflight_line(self) -> str:
        """One log line: ``preflight: verified 1 file(s), trusted 3 file(s) from the verify record R (0.52 s)``, then
        which files were verified and why, or why the record was not used."""
        source = f" from the verify record {self.record}" if self.record else ""
        line = (f"preflight: verified {len(self.verified)} file(s), trusted {len(self.trusted)} file(s){source}"
                f" ({self.seconds:.2f} s)")
        if self.record_note:
            return f"{line}; {self.record_note}"
        why = [f"{record_key(p, self.root)} ({reason})" for p, reason in self.verified.items() if reason]
        return f"{line}; verified: {', '.join(why[:8])}{' ...' if len(why) > 8 else ''}" if why else line

    def summary(self) -> str:
        """One line per file plus a verdict, for humans and status messages."""
        lines = [f"note: {note}" for note in self.notes]
        for c in self.checks:
            label = f"{c.kind} {c.rollout_id}"
            masked = f", {c.masked_out} with an all-zero loss mask" if c.masked_out else ""
            detail = f" ({c.samples} samples{masked})" if c.samples is not None else ""
            note = f": {c.message}" if c.message else ""
            lines.append(f"{c.status.upper():10} {label:12} {c.path}{detail}{note}")
        verdict = "OK" if self.ok else f"{len(self.problems)} problem(s)"
        lines.append(
            f"{verdict}; {len(self.fallbacks)} fallback(s) to rollout 0; {self.rollout_id_mismatches} rollout_id"
            f" mismatch(es); {self.masked_out} sample(s) with an all-zero loss mask"
        )
        return "\n".join(lines)


def eval_reward_problem(samples: list, reward_key: str | None, dicts_need_key: bool) -> str:
    """Why an eval dump's rewards cannot be read as the run reads them (None is 0.0, dicts under ``reward_key``),
    or "". Dict rewards without a key are left alone unless ``dicts_need_key`` says the key is the job's."""
    unread = Sample(reward=None)  # a dict reward whose key verify does not know: not read
    readable = samples if reward_key or dicts_need_key else [
        unread if isinstance(s.reward, dict) else s for s in samples]
    try:
        rewards = eval_rewards(readable, reward_key)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        return str(exc).strip("'\"")
    bad = next((i for i, r in enumerate(rewards) if not math.isfinite(r)), None)
    return "" if bad is None else f"eval sample {bad}: reward {rewards[bad]} is not a finite number"


@dataclass(frozen=True)
class FileSettings:
    """What a file's verdict depends on besides its bytes: the conversion (reward key, samples per prompt, the model's
    limits), the keys eval rewards are read under, and the loader's bounds. Recorded with every verify record."""

    conversion: Conversion | None
    reward_key: str | None
    eval_reward_key: str | None
    limits: Limits
    upstream: UpstreamSettings | None = None  # a slime / miles job's acceptance rules (dumps/acceptance.py)

    def to_dict(self) -> dict:
        c = self.conversion
        conversion = None if c is None else {
            "n_samples_per_prompt": c.n_samples_per_prompt, "normalize_std": c.normalize_std,
            "reward_key": c.reward_key, "vocab_size": c.limits.vocab_size,
            "max_position_embeddings": c.limits.max_positions,
        }
        if c is not None and c.stretch_max_tokens is not None:  # only then: unstretched jobs' records stay as they were
            conversion["stretch_max_tokens"] = c.stretch_max_tokens
        upstream = None if self.upstream is None else {
            k: sorted(v) if isinstance(v, frozenset) else v for k, v in asdict(self.upstream).items()}
        return {"conversion": conversion, "reward_key": self.reward_key, "eval_reward_key": self.eval_reward_key,
                "limits": asdict(self.limits), "upstream": upstream}


@dataclass(frozen=True)
class FileResult:
    """What verifying one file found: its samples, the dump's own rollout_id and masked-out samples, or an error; and
    what the framework would drop of it (``dropped``, a slime / miles train dump's)."""

    samples: int | None = None
    error: str = ""
    rollout_id: int | None = None
    masked_out: int | None = None
    dropped: tuple[str, ...] = ()


def verify_file(path: str, kind: str, settings: FileSettings) -> FileResult:
    """Load one dump safely and check it as ``kind``: a train dump through the conversion (or the per-sample checks
    without the job's settings), an eval dump's rewards as the run reads them. Runs in a worker process too."""
    conversion = settings.conversion
    try:
        dump = load(path, settings.limits)
        if kind == "train" and conversion is not None:
            masked_out = conversion(dump.samples).masked_out
        elif kind == "train":
            masked_out = check_samples(dump.samples, settings.reward_key)
        else:  # eval trains nothing: only its rewards are read, under eval's own key
            masked_out = None
            problem = eval_reward_problem(dump.samples, settings.eval_reward_key or settings.reward_key,
                                          conversion is not None)
            if problem:
                raise SampleError(None, "reward", problem)
        upstream = settings.upstream if kind == "train" else None
        refused = refusals(dump.samples, upstream) if upstream else []
        if refused:  # the framework's own acceptance, stricter than forge-replay's trainer here
            raise SampleError(refused[0].index, refused[0].field, refused[0].problem)
        dropped = tuple(dropped_notes(dump.samples, upstream)) if upstream else ()
        return FileResult(len(dump.samples), "", dump.rollout_id, masked_out, dropped)
    except SampleError as exc:
        return FileResult(error=str(exc) if exc.where else f"{path}: {exc}")
    except DumpError as exc:
        return FileResult(error=str(exc))


class VerifyWorkerDied(RuntimeError):
    """A worker process died while verifying (the kernel's OOM killer, usually); the message names the files."""


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity, bounded by its cgroup's CPU quota (a container's CPU limit)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(_read("/sys/fs/cgroup/cpu.max"), _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
                             _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))
    return max(1, min(cpus, quota) if quota is not None else cpus)


def cgroup_cpu_quota(cpu_max: str | None, cfs_quota_us: str | None = None,
                     cfs_period_us: str | None = None) -> int | None:
    """Whole CPUs of a cgroup quota (at least 1), from cgroup v2's ``cpu.max`` ("200000 100000", "max 100000") or
    v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: none); None without a quota."""
    try:
        if cpu_max is not None:
            quota, _, period = cpu_max.strip().partition(" ")
            if quota == "max":
                return None
            return max(1, int(quota) // int(period or 100000))
        if cfs_quota_us is not None and cfs_period_us is not None and int(cfs_quota_us) > 0:
            return max(1, int(cfs_quota_us) // int(cfs_period_us))
    except ValueError:
        pass
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read()
    except (OSError, ValueError):
        return None


LOADED_BYTES_PER_FILE_BYTE = 8
"""A dump in memory while it is verified, per byte of its file: Python ints and floats for every token id and log prob
(measured: a 201.6 MB dump of 64k-token samples peaks at 1.5 GB above the imports, docs/benchmarks.md)."""


def worker_count(jobs: int, files: int, largest_bytes: int, available_bytes: int | None) -> tuple[int, str]:
    """How many worker processes verify ``files``: ``jobs``, no more than the files, and no more than the memory
    available holds of the largest dump loaded (:data:`LOADED_BYTES_PER_FILE_BYTE`); and a note when memory capped it
    ("" otherwise). A container without a CPU limit sees every CPU of its node: its memory limit is what binds."""
    workers = max(1, min(jobs, files))
    if available_bytes is None or largest_bytes <= 0:
        return workers, ""
    fits = max(1, available_bytes // (LOADED_BYTES_PER_FILE_BYTE * largest_bytes))
    if fits >= workers:
        return workers, ""
    return fits, (f"verify ran {fits} worker(s), not {workers}: the {available_bytes / 2**30:.1f} GiB of memory"
                  f" available hold about {fits} of the largest dump ({largest_bytes / 1e6:.0f} MB, about"
                  f" {LOADED_BYTES_PER_FILE_BYTE}x that once loaded)")


def available_memory() -> int | None:
    """Bytes this process may still take: the least of MemAvailable and its cgroup's headroom (v2 memory.max less
    memory.current, v1 memory.limit_in_bytes less memory.usage_in_bytes); None when none can be read."""
    found = []
    meminfo = _read("/proc/meminfo") or ""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:") and line.split()[1].isdigit():
            found.append(int(line.split()[1]) * 1024)
    v1 = "/sys/fs/cgroup/memory/memory."
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         (f"{v1}limit_in_bytes", f"{v1}usage_in_bytes")):
        limit_text, usage_text = (_read(limit) or "").strip(), (_read(usage) or "").strip()
        if limit_text.isdigit() and usage_text.isdigit():
            found.append(max(0, int(limit_text) - int(usage_text)))
    return min(found) if found else None


def _verify_files(files: list[tuple[str, str]], sizes: dict[str, int], settings: FileSettings, workers: int,
                  progress: bool) -> dict[tuple[str, str], FileResult]:
    """Verify each (path, kind), ``workers`` processes at a time, one file per worker (so memory stays within the
    largest file's times the workers); in this process when one worker is enough."""
    from forge_replay.dumps.progress_bars import byte_progress

    results: dict[tuple[str, str], FileResult] = {}
    total = sum(sizes.get(path, 0) for path, _ in files)
    if workers <= 1:
        with byte_progress(progress, len(files), total, "verifying") as advance:
            for path, kind in files:
                results[(path, kind)] = verify_file(path, kind, settings)
                advance(path, sizes.get(path, 0))
        return results
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    # fork: workers share the parent's imports (torch) instead of importing them again; they are all forked at the
    # first submit, before the progress bar starts its thread. A process connected to Ray (its threads and sockets
    # are not fork-safe) starts them from a fresh server process instead. Largest files first: the last to finish
    # are small ones.
    ray = sys.modules.get("ray")
    method = "forkserver" if ray is not None and getattr(ray, "is_initialized", lambda: False)() else "fork"
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method))
    finished = False
    try:
        ordered = sorted(files, key=lambda f: -sizes.get(f[0], 0))
        futures = {pool.submit(verify_file, path, kind, settings): (path, kind) for path, kind in ordered}
        with byte_progress(progress, len(files), total, f"verifying ({workers} workers)") as advance:
            for future in as_completed(futures):
                path, kind = futures[future]
                try:
                    results[(path, kind)] = future.result()
                except BrokenProcessPool:
                    unfinished = [p for f, (p, _) in futures.items()
                                  if not f.done() or f.cancelled() or f.exception() is not None]
                    raise VerifyWorkerDied(
                        f"a verify worker process died while reading one of {', '.join(unfinished[:4])}"
                        f"{' ...' if len(unfinished) > 4 else ''} (killed for memory? each of the {workers} workers"
                        " holds one whole dump: lower --jobs or give verify more memory)") from None
                advance(path, sizes.get(path, 0))
        finished = True
    finally:
        if not finished:  # interrupted or failed: no worker goes on reading a file nobody waits for
            for process in list(getattr(pool, "_processes", {}).values()):
                process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
    return results


def verify_dumps(
    root: str | None,
    template: str,
    num_rollouts: int,
    start_rollout_id: int = 0,
    eval_interval: int = 0,
    eval_before_train: bool = False,
    fallback: bool = True,
    progress: bool = False,
    limits: Limits | None = None,
    reward_key: str | None = None,
    eval_reward_key: str | None = None,
    conversion: Conversion | None = None,
    notes: tuple[str, ...] = (),
    backend: str = "builtin",
    upstream: UpstreamSettings | None = None,
    jobs: int = 1,
    trust: str | None | Literal[False] = False,
) -> VerifyReport:
    """Check every train (and eval) dump a job reads; each distinct file is loaded once, safely.

    ``root`` is the PVC mount (``template`` must then be relative), or None to use ``template``
    as a filesystem path; ``limits`` bound the work per file (default: :func:`~forge_replay.dumps.bounds.default_limits`).
    With ``conversion`` (the job's settings) every train dump is converted as the trainer converts it, and eval dumps'
    dict rewards are read under ``eval_reward_key`` or the job's reward key (a dict without a key is refused); without
    it the per-sample checks run alone and dict rewards are checked only under ``reward_key``. With
    ``eval_before_train`` (spec.replay.evalBeforeTrain) the eval replayed before the first step is checked too, where
    ``backend``'s train.py evaluates it (miles: at ``start_rollout_id``; slime and builtin: only at 0). ``notes``
    (checks skipped, e.g. an unreadable model config) are carried into the report. With ``upstream`` (a slime / miles
    job's settings) every train dump must also pass that framework's own acceptance rules (dumps/acceptance.py),
    which are stricter than forge-replay's trainer in places. ``jobs`` worker processes verify files in
    parallel. ``trust``: the path of a verify record (:mod:`~forge_replay.dumps.verify_record`; None: there is none)
    whose files are not verified again when unchanged; False (the default) verifies everything without a word.
    Raises ValueError for an invalid template or counts, VerifyWorkerDied when a worker process dies.
    """
    from forge_replay.dumps.bounds import default_limits

    _check_arguments(root, template, num_rollouts, start_rollout_id, eval_interval)
    began = time.perf_counter()
    if conversion is not None:
        reward_key = conversion.reward_key
    settings = FileSettings(conversion, reward_key, eval_reward_key, limits or default_limits(), upstream)
    report = VerifyReport(template=template, root=root, notes=list(notes), settings=settings)
    rollout_ids = range(start_rollout_id, start_rollout_id + num_rollouts)
    eval_ids = replayed_eval_ids(start_rollout_id, num_rollouts, eval_interval, eval_before_train, backend)
    planned = _plan(root, template, rollout_ids, eval_ids, fallback)
    files = list(dict.fromkeys((p.used, p.kind) for p in planned if p.used is not None))
    stamps = {path: stamp_of(path) for path, _ in files}
    to_verify = _take_trusted(report, files, stamps, trust)
    _verify_the_rest(report, to_verify, stamps, jobs, progress)
    report.entries = {
        (record_key(path, root), kind): Entry(stamps[path], result.samples, result.rollout_id, result.masked_out,
                                              result.dropped)
        for (path, kind), result in report.results.items()
        if not result.error and result.samples is not None and stamps[path] is not None
    }
    report.checks.extend(_file_check(p, report.results) for p in planned)
    report.dropped = _dropped(planned, report.results)
    report.notes.extend(report.dropped)
    report.seconds = time.perf_counter() - began
    return report


def _check_arguments(root: str | None, template: str, num_rollouts: int, start_rollout_id: int,
                     eval_interval: int) -> None:
    """Raise ValueError for an invalid dump path or counts."""
    problem = path_problem(template if root else template.lstrip("/"))
    if problem:
        raise ValueError(f"dump path {template!r} {problem}")
    if num_rollouts < 1 or start_rollout_id < 0 or eval_interval < 0:
        raise ValueError("need num_rollouts >= 1, start_rollout_id >= 0, eval_interval >= 0")
    if eval_interval > 0 and not is_template(template):
        raise ValueError(f"eval_interval > 0 needs a {{rollout_id}} template; {template!r} is a literal path")


class PlannedFile(NamedTuple):
    """What one rollout or eval reads, before any file is: its path, its status so far, the file it reads (the
    rollout-0 file on a fallback; None: none) and the rollout_id that file stands for (None: any)."""

    kind: Literal["train", "eval"]
    rollout_id: int
    path: str
    status: Status
    message: str
    used: str | None
    expected: int | None


def _plan(root: str | None, template: str, rollout_ids: range, eval_ids: list[int],
          fallback: bool) -> list[PlannedFile]:
    """The file each training rollout reads (its own, rollout 0's on a fallback, or none) and each eval's."""
    planned: list[PlannedFile] = []
    first = resolve(root, train_path(template, 0))
    for n in rollout_ids:
        path = resolve(root, train_path(template, n))
        expected = n if is_template(template) else None  # a literal path is every rollout's file
        if os.path.exists(path):
            planned.append(PlannedFile("train", n, path, "ok", "", path, expected))
        elif fallback and is_template(template) and os.path.exists(first):
            message = f"missing; rollout 0's file {first} is used instead"
            planned.append(PlannedFile("train", n, path, "fallback", message, first, 0))
        else:
            hint = "" if fallback or not is_template(template) else " (fallback to rollout 0 is off)"
            planned.append(PlannedFile("train", n, path, "missing", f"file does not exist{hint}", None, None))
    for n in eval_ids:
        path = resolve(root, eval_path(template, n) or "")
        if os.path.exists(path):
            planned.append(PlannedFile("eval", n, path, "ok", "", path, n))
        else:
            message = "file does not exist: eval replays as an empty result"
            planned.append(PlannedFile("eval", n, path, "missing", message, None, None))
    return planned


def _take_trusted(report: VerifyReport, files: list[tuple[str, str]], stamps: dict[str, Stamp | None],
                  trust: str | None | Literal[False]) -> list[tuple[str, str]]:
    """Take into ``report`` the results the verify record ``trust`` holds for files unchanged since; the (path, kind)
    left to verify, each noted in ``report.verified`` with why it was not trusted."""
    if trust is not False:
        record = read_record(trust, report.settings.to_dict())
        report.record, report.record_note = record.path, record.note
    to_verify = []
    for path, kind in files:
        entry, reason = ((None, "") if trust is False
                         else record.entry_for(record_key(path, report.root), kind, stamps[path]))
        if entry is not None:
            report.results[(path, kind)] = FileResult(entry.samples, "", entry.rollout_id, entry.masked_out,
                                                      entry.dropped)
            report.trusted.append(path)
        else:
            to_verify.append((path, kind))
            report.verified[path] = reason
    return to_verify


def _verify_the_rest(report: VerifyReport, to_verify: list[tuple[str, str]], stamps: dict[str, Stamp | None],
                     jobs: int, progress: bool) -> None:
    """Verify ``to_verify`` into ``report.results``, with as many of ``jobs`` worker processes as memory holds."""
    sizes = {path: stamp.size for path, stamp in stamps.items() if stamp is not None}
    largest = max((sizes.get(path, 0) for path, _ in to_verify), default=0)
    workers, capped = worker_count(jobs, len(to_verify), largest, available_memory() if jobs > 1 else None)
    if capped:
        report.notes.append(capped)
    report.workers = workers
    report.results.update(_verify_files(to_verify, sizes, report.settings, workers, progress))


def _file_check(planned: PlannedFile, results: dict[tuple[str, str], FileResult]) -> FileCheck:
    """The verdict on one planned file, from what reading the file it reads found."""
    kind, n, path, status, message, used, expected = planned
    if used is None:
        return FileCheck(kind, n, path, status, message)
    result = results[(used, kind)]
    if result.error:
        status, message = "unreadable", result.error
    note = "" if result.error or result.rollout_id is None else rollout_id_note(result.rollout_id, expected)
    if note:
        message = f"{message}; {note}" if message else note
    return FileCheck(kind, n, path, status, message, result.samples, used, result.masked_out, bool(note))


def _dropped(planned: list[PlannedFile], results: dict[tuple[str, str], FileResult]) -> list[str]:
    """What the framework would drop of the train dumps the run reads, one line per distinct note with the rollouts
    it holds for (``rollouts 0, 1: slime trains 8 of its 12 episodes ...``)."""
    rollouts: dict[str, list[int]] = {}
    for p in planned:
        result = results.get((p.used, p.kind)) if p.kind == "train" and p.used is not None else None
        for note in result.dropped if result is not None and not result.error else ():
            rollouts.setdefault(note, []).append(p.rollout_id)
    lines = []
    for note, ids in rollouts.items():
        shown = ", ".join(map(str, ids[:8])) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
        lines.append(f"{'rollouts' if len(ids) > 1 else 'rollout'} {shown}: {note}")
    return lines
