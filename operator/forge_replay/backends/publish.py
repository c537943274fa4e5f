"""After a slime / miles script ends: its memory report, where the builtin trainer's goes.

The entrypoint (``launch.entrypoint``) runs ``python3 -m forge_replay.backends.publish`` once the team's script has
exited, whatever its exit status. It reads the memory probe's files (``<results>/probe``, backends.probe) and
writes ``<results>/report.json`` (``summary.memory_peak`` as the builtin trainer writes it) and
``<results>/progress.json``; in a pod it also patches the job's progress ConfigMap with the ServiceAccount token the
head pod mounts, so the operator copies the peak into ``status.memory`` as it does for the builtin trainer.

When the verify Job (or `forge-replay run`) left its verify record in the results folder, report.json's
``preflight`` carries the record's notes: what slime / miles would drop of the dumps without a word (slime's
episodes past the last whole step).

With ``--max-peak-memory-gib`` (spec.expect.maxPeakMemoryGiB), the verdict (``forge_replay.verdict.checks``,
the builtin trainer's) is recorded in report.json's ``expectations`` and progress.json's result: a peak over the
budget fails the job (ExpectationsMet=False), as it does for the builtin trainer.

The run's outcome (fits, overBudget, outOfMemory or failed: ``verdict.outcome.outcome_of``, the builtin trainer's)
goes into report.json's ``outcome`` and the result's; an out-of-memory (``backends.out_of_memory``: what the memory
probe recorded, else Ray's memory monitor's error in the job's log) into ``out_of_memory``. With
``--expect-outcome`` (spec.expect.outcome) the verdict has its check: a run that ran out of memory as expected is a
result that succeeded (the operator then says Succeeded whatever the script's status), one that fit is not.

Standard library only: the team's image has no kubernetes client (nor pydantic). Publishing never changes the
script's exit status: a failure to publish is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from forge_replay.backends import out_of_memory as oom
from forge_replay.backends.probe import memory_peak
from forge_replay.dumps.verify_record import MAX_RECORD_BYTES, RECORD_FILE
from forge_replay.dumps.writing import now_rfc3339, write_atomically
from forge_replay.frameworks.flags import BACKENDS
from forge_replay.verdict.checks import Check, Limits, check_report, unmet_line
from forge_replay.verdict.outcome import outcome_check, outcome_of
from forge_replay.verdict.shadow import shadow_line

SERVICEACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PROGRESS_KEY = "progress.json"  # forge_replay.api.progress_report.PROGRESS_KEY (a test keeps them equal)
PROBE_FOLDER = "probe"
"""Where, under the run's results folder, the probe of every Ray worker writes."""

_CAMEL = {"source": "source", "peak_allocated_gib": "peakAllocatedGiB", "peak_reserved_gib": "peakReservedGiB",
          "peak_rss_gib": "peakRssGiB", "rank": "rank", "host": "host", "pid": "pid", "device": "device",
          "processes": "processes"}


def progress_memory(peak: dict[str, Any] | None) -> dict[str, Any] | None:
    """The probe's peak (``probe.memory_peak``) as progress.json and ``status.memory`` carry it (camelCase,
    ``api.status.MemoryPeak``); None when the probe recorded nothing."""
    if not peak:
        return None
    memory = {camel: peak[key] for key, camel in _CAMEL.items() if peak.get(key) is not None}
    if peak.get("gpus"):
        memory["gpus"] = {host: {"source": record["source"], "peakUsedGiB": record["peak_used_gib"]}
                          for host, record in peak["gpus"].items()}
    return memory


def script_result(exit_code: int, script: str, out_of_memory: dict[str, Any] | None = None) -> tuple[str, str]:
    """The run's phase and one-line message from the script's exit status (and its out-of-memory)."""
    if exit_code == 0:
        return "Succeeded", ""
    message = f"{script} exited with status {exit_code}"
    if out_of_memory is not None:
        message += f": out of memory ({out_of_memory['signal']}): {out_of_memory.get('message') or ''}".rstrip(": ")
    return "Failed", message


def preflight(results: str) -> dict[str, Any] | None:
    """report.json's ``preflight`` of a slime / miles run: the verify record in ``results`` and its ``notes`` (what
    the framework would drop of the dumps without a word); None when there is no record (no verify Job, no results
    claim, or spec.replay.verify false)."""
    path = os.path.join(results, RECORD_FILE)
    try:
        if os.path.getsize(path) > MAX_RECORD_BYTES:
            raise ValueError(f"larger than {MAX_RECORD_BYTES // 2**20} MiB")
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"record": path, "notes": [], "note": f"cannot read the verify record: {exc}"}
    notes = document.get("notes") if isinstance(document, dict) else None
    return {"record": path, "notes": [n for n in notes if isinstance(n, str)] if isinstance(notes, list) else []}


def report(job: str, backend: str, script: str, exit_code: int, total: int, peak: dict[str, Any] | None,
           finished_at: str, limits: Limits | None = None, out_of_memory: dict[str, Any] | None = None,
           expect_outcome: str | None = None, checked: dict[str, Any] | None = None) -> dict[str, Any]:
    """report.json of a slime / miles run: the builtin trainer's keys that mean something here, its ``outcome`` and
    ``out_of_memory``, with ``limits`` or ``expect_outcome`` the verdict on them (``expectations``, as the builtin
    trainer's report holds it), and with ``checked`` what verify noted before the run (``preflight``,
    :func:`preflight`)."""
    phase, message = script_result(exit_code, script, out_of_memory)
    document: dict[str, Any] = {"job": job, "backend": backend, "script": script, "exit_code": exit_code,
                                "partial": exit_code != 0, "planned": total, "error": message or None,
                                "finished_at": finished_at, "summary": {"memory_peak": peak},
                                "out_of_memory": out_of_memory}
    if checked is not None:
        document["preflight"] = checked
    document["outcome"] = outcome_of(document, limits.max_peak_memory_gib if limits is not None else None)
    checks: list[Check] | None = None
    if limits is not None and exit_code == 0:  # as the builtin trainer: a run that failed is not judged
        checks = check_report(document, limits, records_losses=False)
    if expect_outcome is not None and (exit_code == 0 or out_of_memory is not None):  # ... but for its outcome
        checks = [*(checks or []), outcome_check(document["outcome"], expect_outcome)]
    if checks is not None:
        document["expectations"] = [c.to_dict() for c in checks]
    return document


def progress(exit_code: int, script: str, total: int, peak: dict[str, Any] | None,
             finished_at: str, expectations: list[dict[str, Any]] | None = None,
             out_of_memory: dict[str, Any] | None = None, outcome: str | None = None,
             enforce: bool = True) -> dict[str, Any]:
    """progress.json (``api.progress_report.ProgressReport``, camelCase) once the script has ended. The script trained
    every rollout when it exited 0 (its ``--num-rollout`` is forge-replay's end bound); otherwise how many it
    trained is not known here, and ``completed`` stays 0. ``expectations``: the verdict (report.json's), which
    fails the result when a check failed (not with ``enforce`` false, shadow mode: it is said in the message), and
    makes an out-of-memory it expected a result that succeeded."""
    phase, message = script_result(exit_code, script, out_of_memory)
    completed = total if phase == "Succeeded" else 0
    why = unmet_line(expectations)
    if why and not enforce:
        message = "; ".join(m for m in (message, shadow_line(why)) if m)
    elif why:
        phase, message = "Failed", why
    elif out_of_memory is not None and any(c.get("name") == "outcome" for c in expectations or []):
        phase = "Succeeded"  # spec.expect.outcome: outOfMemory, and it did
    result: dict[str, Any] = {"phase": phase, "message": message, "finishedAt": finished_at}
    if expectations is not None:
        result["expectations"] = [Check(**c).to_status() for c in expectations]
    if outcome is not None:
        result["outcome"] = outcome
    if out_of_memory is not None:
        result["outOfMemory"] = oom.camel(out_of_memory)
    document: dict[str, Any] = {"completed": completed, "total": total, "updatedAt": finished_at, "result": result}
    memory = progress_memory(peak)
    if memory is not None:
        document["memory"] = memory
    return document


def patch_configmap(server: str, token: str, ca_file: str | None, namespace: str, name: str, text: str,
                    timeout_s: float = 10.0) -> None:
    """Merge ``text`` into the ConfigMap's ``progress.json`` (the runtime's Role allows get/patch of that one)."""
    body = json.dumps({"data": {PROGRESS_KEY: text}}).encode()
    request = urllib.request.Request(
        f"{server}/api/v1/namespaces/{namespace}/configmaps/{name}", data=body, method="PATCH",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/merge-patch+json"})
    context = ssl.create_default_context(cafile=ca_file)
    with urllib.request.urlopen(request, context=context, timeout=timeout_s) as response:
        response.read()


def in_cluster() -> tuple[str, str, str, str] | None:
    """(API server URL, token, CA file, namespace) from the pod's ServiceAccount mount; None outside a pod."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    token_file = SERVICEACCOUNT / "token"
    if not host or not token_file.is_file():
        return None
    namespace = os.environ.get("POD_NAMESPACE") or (SERVICEACCOUNT / "namespace").read_text().strip()
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port}", token_file.read_text().strip(), str(SERVICEACCOUNT / "ca.crt"), namespace


def publish(results: str, job: str, backend: str, script: str, exit_code: int, total: int,
            configmap: str | None, api: tuple[str, str, str | None, str] | None,
            limits: Limits | None = None, expect_outcome: str | None = None, log: str = "",
            enforce: bool = True) -> list[str]:
    """Write report.json and progress.json under ``results`` and patch ``configmap`` through ``api``; returns the
    problems met (each one line), none of which stops the others. ``limits``: spec.expect's, checked here;
    ``expect_outcome``: spec.expect.outcome; ``log``: the job's log so far (where Ray's memory monitor's error is);
    ``enforce``: spec.expect.enforce (false: shadow mode, recorded in report.json's ``enforced``)."""
    probe_folder = os.path.join(results, PROBE_FOLDER)
    peak = memory_peak(probe_folder)  # None when the folder is missing or empty
    out_of_memory = oom.out_of_memory(probe_folder, exit_code, log)
    finished = now_rfc3339()
    document = report(job, backend, script, exit_code, total, peak, finished, limits, out_of_memory, expect_outcome,
                      preflight(results))
    if document.get("expectations") is not None:
        document["enforced"] = enforce
    text = json.dumps(progress(exit_code, script, total, peak, finished, document.get("expectations"),
                               out_of_memory, document["outcome"], enforce), sort_keys=True, allow_nan=False)
    problems = []
    try:
        os.makedirs(results, exist_ok=True)
        write_atomically(Path(results, "report.json"),
                         json.dumps(document, indent=1, sort_keys=True, allow_nan=False) + "\n")
        write_atomically(Path(results, PROGRESS_KEY), text)
    except OSError as exc:
        problems.append(f"cannot write report.json / progress.json under {results}: {exc}")
    if configmap and api is not None:
        server, token, ca_file, namespace = api
        try:
            patch_configmap(server, token, ca_file, namespace, configmap, text)
        except (OSError, urllib.error.URLError, ssl.SSLError) as exc:
            problems.append(f"cannot patch ConfigMap {namespace}/{configmap} with the memory report: {exc}")
    return problems


def main(argv: list[str] | None = None) -> int:
    """``python3 -m forge_replay.backends.publish --results DIR --exit-code N ...``: always exits 0."""
    parser = argparse.ArgumentParser(prog="python3 -m forge_replay.backends.publish", description=__doc__)
    parser.add_argument("--results", required=True, help="the run's results folder (the probe writes under it)")
    parser.add_argument("--exit-code", type=int, required=True, help="the team's script's exit status")
    parser.add_argument("--job", default="", help="the ForgeReplayJob's name")
    parser.add_argument("--backend", required=True, choices=BACKENDS)
    parser.add_argument("--script", default="train.py")
    parser.add_argument("--total", type=int, required=True, help="rollouts the script was asked to train")
    parser.add_argument("--configmap", default=None, help="the job's progress ConfigMap (in a pod)")
    parser.add_argument("--max-peak-memory-gib", type=float, default=None,
                        help="spec.expect.maxPeakMemoryGiB: the verdict on the probe's peak")
    parser.add_argument("--expect-outcome", choices=("fits", "outOfMemory"), default=None,
                        help="spec.expect.outcome: the verdict on the run's outcome")
    parser.add_argument("--shadow", action="store_true",
                        help="spec.expect.enforce: false: the verdict is recorded, a failed check fails nothing")
    parser.add_argument("--log", default=None,
                        help="the script's log (default: the Ray job's own log, found from Ray's job environment)")
    args = parser.parse_args(argv)
    api = in_cluster() if args.configmap else None
    limits = Limits(max_peak_memory_gib=args.max_peak_memory_gib) if args.max_peak_memory_gib is not None else None
    log = ""
    if args.exit_code != 0:  # only a script that failed can have run out of memory
        try:
            log = Path(args.log).read_text(encoding="utf-8", errors="replace") if args.log else oom.job_log()
        except OSError:
            log = ""
    problems = publish(args.results, args.job, args.backend, args.script, args.exit_code, args.total,
                       args.configmap, api, limits, args.expect_outcome, log, enforce=not args.shadow)
    for problem in problems:
        print(f"forge-replay: {problem} (the job's outcome is the script's)", file=sys.stderr)
    if not problems:
        print(f"forge-replay: memory report written to {os.path.join(args.results, 'report.json')}"
              + (f" and ConfigMap {args.configmap}" if api is not None else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
