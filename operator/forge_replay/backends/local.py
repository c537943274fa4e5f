"""``forge-replay run FILE --trainer-root DIR`` for backend slime / miles: the team's script as a Ray job on a local Ray.

``workingDir`` maps to DIR, the dumps claim to the local dumps root; the entrypoint and the runtime env are the
operator's (backends.launch), with this machine's forge_replay on PYTHONPATH in place of the init container's copy.
The job's output is printed as it comes and kept in ``<results>/trainer.log``; ``<results>/job.json`` records the
entrypoint, the Ray job id, how it ended and the memory probe's peak over the job's Ray workers (backends.probe);
``<results>/report.json`` is what the entrypoint's publish step wrote (backends.publish), as in a pod.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forge_replay.backends import launch, probe
from forge_replay.backends.publish import PROBE_FOLDER
from forge_replay.runtime.ports import free_ports

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def package_root() -> str:
    """The folder holding this forge_replay package (what the init container's volume holds in a pod)."""
    return str(Path(__file__).resolve().parent.parent.parent)


def local_plan(spec: Any, trainer_root: str, dumps_root: str, results_dir: str,
               job_name: str = "") -> dict[str, Any]:
    """The entrypoint and runtime env of a local run (the memory probe writing under ``<results>/probe``, its
    report in ``<results>/report.json`` once the script has ended): pure, so a test can read what would be run."""
    env = {"env_vars": launch.env_vars(spec, forge_lib=package_root())}
    results = os.path.abspath(results_dir)
    return {
        "entrypoint": launch.entrypoint(spec, os.path.abspath(dumps_root), working_dir=os.path.abspath(trainer_root),
                                        results_dir=results, job_name=job_name),
        "runtime_env": launch.with_probe(env, os.path.join(results, PROBE_FOLDER)),
    }


PORT_OPTIONS = (
    "--port", "--dashboard-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
    "--metrics-export-port", "--node-manager-port", "--object-manager-port", "--runtime-env-agent-port",
    "--ray-client-server-port",
)  # fmt: skip
"""Every fixed port of a Ray head, given a free one: another Ray on this machine (a default port) cannot collide."""


class LocalHead:
    """``ray start --head --block`` in a session of its own, on free ports; :meth:`stop` ends that session."""

    def __init__(self, num_cpus: int, log_path: str):
        self.ports = dict(zip(PORT_OPTIONS, free_ports(len(PORT_OPTIONS), "127.0.0.1"), strict=True))
        self.dashboard = f"http://127.0.0.1:{self.ports['--dashboard-port']}"
        argv = ["ray", "start", "--head", "--block", "--num-cpus", str(num_cpus), "--include-dashboard=true",
                "--dashboard-host", "127.0.0.1", "--disable-usage-stats"]
        for option, port in self.ports.items():
            argv += [option, str(port)]
        self._log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self, grace_s: float = 30.0) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        try:  # whatever Ray left in the session
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._log.close()


def _submit(head: LocalHead, plan: dict[str, Any], wait_s: float = 180.0) -> tuple[Any, str]:
    """A client of ``head`` and the submitted job's id, once the head's dashboard and agent answer."""
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + wait_s
    while True:
        if head.process.poll() is not None:
            raise RuntimeError(f"the local Ray head exited ({head.process.returncode}); see ray-head.log")
        try:
            client = JobSubmissionClient(head.dashboard)
            return client, client.submit_job(entrypoint=plan["entrypoint"], runtime_env=plan["runtime_env"])
        except (ConnectionError, RuntimeError) as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the local Ray's job server did not take the job in {wait_s:.0f} s: {exc}") from exc
            time.sleep(1.0)


def run_local(spec: Any, trainer_root: str, dumps_root: str, results_dir: str, echo: Callable[[str], None],
              poll_s: float = 0.5, job_name: str = "") -> str:
    """Run the team's script as a Ray job on a new local Ray head; returns the job's final status (SUCCEEDED, ...)."""
    plan = local_plan(spec, trainer_root, dumps_root, results_dir, job_name)
    os.makedirs(results_dir, exist_ok=True)
    cpus = max(2, spec.trainer.nodes)
    echo(f"starting a local Ray ({cpus} CPUs), then {spec.trainer.backend}'s {spec.trainer.script} as a Ray job")
    head = LocalHead(cpus, os.path.join(results_dir, "ray-head.log"))
    client = job_id = None
    try:
        client, job_id = _submit(head, plan)
        echo(f"Ray job {job_id}: {plan['entrypoint']}")
        shown, status = 0, "PENDING"
        with open(os.path.join(results_dir, "trainer.log"), "w", encoding="utf-8") as log:
            while True:
                status = str(client.get_job_status(job_id).value)
                logs = client.get_job_logs(job_id)
                if len(logs) > shown:
                    echo(logs[shown:].rstrip("\n"))
                    log.write(logs[shown:])
                    log.flush()
                    shown = len(logs)
                if status in TERMINAL:
                    break
                time.sleep(poll_s)
        info = client.get_job_info(job_id)
        record = {"backend": spec.trainer.backend, "jobId": job_id, "status": status, "message": info.message,
                  "memory_peak": probe.memory_peak(os.path.join(results_dir, PROBE_FOLDER)), **plan}
        Path(results_dir, "job.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return status
    except BaseException:  # a stop (Ctrl-C, SIGTERM) or an error mid-run: the script first, then its Ray
        if job_id is not None:
            _stop_job(client, job_id)
        raise
    finally:
        head.stop()


def _stop_job(client: Any, job_id: str, wait_s: float = 20.0) -> None:
    """Stop the team's script (Ray's job supervisor signals its process group) and wait for it to end. Stopping the
    head alone left the script running: the supervisor starts it in a session of its own."""
    deadline = time.monotonic() + wait_s
    try:
        client.stop_job(job_id)
        while str(client.get_job_status(job_id).value) not in TERMINAL and time.monotonic() < deadline:
            time.sleep(0.2)
    except Exception:  # noqa: BLE001 - the head may be gone already: nothing left to ask
        pass


def input_problem(file: str, job: Any, trainer_root: str | None, dumps_root: str, synth_missing: bool,
                  err: Callable[[str], None]) -> str | None:
    """Why ``forge-replay run`` cannot run this slime / miles job (unusable input, exit 2), or None; said before
    anything is written. Prints the job's notes (as validate says them) on the way."""
    spec = job.spec
    if spec.trainer.backend == "builtin":
        return f"{file}: --trainer-root runs a slime or miles script; spec.trainer.backend is builtin"
    if not trainer_root:
        return (f"{file}: backend {spec.trainer.backend} runs the team's {spec.trainer.script}: pass --trainer-root "
                f"DIR, the local folder standing in for spec.trainer.workingDir ({spec.trainer.working_dir})")
    from forge_replay.api.job_notes import job_notes

    for note in job_notes(spec):  # as validate says them: the upstream loader unpickles; no GPUs, a stand-in only
        err(f"{file}: note: {note}")
    script = Path(trainer_root, spec.trainer.script)
    if not script.is_file():
        return f"{file}: {script} does not exist (spec.trainer.script under --trainer-root)"
    if not synth_missing and not Path(dumps_root).is_dir():  # as run_inputs.missing_input for the builtin trainer
        return f"{file}: dumps root {dumps_root} does not exist; pass --dumps-root DIR, or --synth-missing"
    return None


def run_cli(file: str, job: Any, trainer_root: str, dumps_root: str, results_dir: str, synth_missing: bool,
            err: Callable[[str], None], model_root: str | None = None) -> int:
    """``forge-replay run`` for a slime / miles job whose input :func:`input_problem` accepted, with its results
    folder held (the caller's lock, the previous run's files set aside): its exit status (0 succeeded, 1 failed,
    2 unusable input or dumps that verify refused, 3 an unmet spec.expect, 4 out of memory; 0 when
    spec.expect.outcome expects it)."""
    from forge_replay.runtime.run_inputs import (EXIT_FAILED, EXIT_OUT_OF_MEMORY, EXIT_UNUSABLE, Unusable,
                                                 synthesize_if_absent)

    spec = job.spec
    if synth_missing:
        try:
            synthesize_if_absent(job, dumps_root, err)
        except Unusable as exc:
            err(f"{file}: {exc}")
            return EXIT_UNUSABLE
    _set_record_aside(results_dir)  # a previous run's: its notes are not this run's (report.json's preflight)
    if spec.replay.verify and not verified(job, dumps_root, model_root, err, results_dir):
        err(f"{file}: dumps verify refused the dumps under {dumps_root} (above), as the verify Job of this job would "
            f"in a cluster; nothing was started (spec.replay.verify: false skips the check)")
        return EXIT_UNUSABLE
    status = run_local(spec, trainer_root, dumps_root, results_dir, err, job_name=job.metadata.name or "")
    err(f"forge-replay run {file}: {spec.trainer.backend} job {status.lower()}; trainer.log, job.json and the memory "
        f"report (report.json) in {results_dir}")
    try:
        ran_out = json.loads(Path(results_dir, "report.json").read_text(encoding="utf-8")).get("out_of_memory")
    except (OSError, ValueError, AttributeError):
        ran_out = None
    if ran_out:  # the publish step's record (backends.out_of_memory)
        err(f"forge-replay run {file}: out of memory ({ran_out.get('signal')}): {ran_out.get('message', '')}")
        expected = spec.expect is not None and spec.expect.outcome == "outOfMemory"
        return _verdict_exit(file, results_dir, spec, err) if expected else EXIT_OUT_OF_MEMORY
    if status != "SUCCEEDED":
        return EXIT_FAILED
    return _verdict_exit(file, results_dir, spec, err)


def _set_record_aside(results_dir: str) -> None:
    """Rename a previous run's verify record in ``results_dir`` to its ``previous`` name, as the run's other files are
    (runtime.results.set_previous_aside, which the builtin runtime also runs where the verify Job's record must stay)."""
    from forge_replay.dumps.verify_record import RECORD_FILE

    record = Path(results_dir, RECORD_FILE)
    try:
        os.replace(record, record.with_name("verify-record.previous.json"))
    except FileNotFoundError:
        pass


def verified(job: Any, dumps_root: str, model_root: str | None, err: Callable[[str], None],
             results_dir: str | None = None) -> bool:
    """Run the verify Job's check (`forge-replay dumps verify` with the job's settings and the framework's acceptance
    rules) here, on the local dumps; what it prints goes to the user, and its record to ``results_dir`` (whose notes
    the publish step copies into report.json's preflight). A model folder missing here leaves the model's limits
    unchecked (the team's script loads the model, not forge-replay), with a note."""
    from forge_replay.dumps.verify_record import RECORD_FILE
    from forge_replay.dumps.verify_request import EXIT_OK, VerifyRequest, run_verify

    model_path = job.spec.model.path
    if model_path and not (model_root and Path(model_root, model_path).is_dir()):
        err(f"note: spec.model.path {model_path} is not under --model-root here: dumps are checked without the model's "
            "vocabulary and positions")
        model_root = None
    request = VerifyRequest.for_job(job, dumps_root=os.path.abspath(dumps_root),
                                    model_root=os.path.abspath(model_root) if model_root else None, in_pod=False,
                                    record=os.path.join(results_dir, RECORD_FILE) if results_dir else None)
    return run_verify(request) == EXIT_OK


def _verdict_exit(file: str, results_dir: str, spec: Any, err: Callable[[str], None]) -> int:
    """0, or 3 (``run``'s status for an unmet spec.expect) when the publish step's verdict failed or is missing."""
    from forge_replay.runtime.run_inputs import EXIT_EXPECTATIONS, EXIT_OK
    from forge_replay.verdict.checks import missing_verdict, unmet_line
    from forge_replay.verdict.shadow import shadow_line

    if spec.expect is None:
        return EXIT_OK
    try:
        document = json.loads(Path(results_dir, "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        err(f"forge-replay run {file}: spec.expect not checked: no readable report.json in {results_dir} ({exc})")
        return EXIT_EXPECTATIONS
    expectations = document.get("expectations")
    why = missing_verdict(spec.expect is not None, expectations, finished=True) or unmet_line(expectations)
    if why and expectations is not None and not spec.expect.enforce:  # shadow mode: said, not enforced
        err(f"forge-replay run {file}: warning: {shadow_line(why)}")
        return EXIT_OK
    if why:
        err(f"forge-replay run {file}: {why}")
        return EXIT_EXPECTATIONS
    return EXIT_OK
