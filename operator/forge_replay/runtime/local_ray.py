"""A local Ray in a session of its own, for ``forge-replay run``.

``ray.init(address="local")`` starts Ray's GCS, raylet and agents in the driver's process group, so a signal to the
whole group (Ctrl-C in a terminal, ``timeout``, ``kill -TERM -- -PGID``) reached them too: SIGTERM stopped the GCS
under the driver, which then hung on "Failed to connect to GCS" and exited 1. Here a helper process, started in a
new session, starts the local Ray and holds it; the driver connects to it. A group signal then reaches only the
driver, which stops engines and trainer through Ray and then the helper. The helper ends its Ray when its stdin
closes: when the driver closes it, or when the driver dies in any way (SIGKILL included).

``python -m forge_replay.runtime.local_ray NUM_CPUS`` is the helper: it prints the GCS address once Ray is up.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys


class LocalRayError(RuntimeError):
    """The helper could not start a local Ray; the message carries what it printed."""


class LocalRay:
    """The helper process from the driver's side: :meth:`start` returns the GCS address, :meth:`stop` ends it all."""

    def __init__(self, num_cpus: int):
        self.num_cpus = num_cpus
        self.process: subprocess.Popen | None = None
        self.address: str | None = None

    def start(self) -> None:
        """Start the helper (Ray starts there while this process goes on, e.g. to import ray)."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "forge_replay.runtime.local_ray", str(self.num_cpus)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        )

    def connect(self) -> str:
        """Wait for the helper's address and connect this process (the driver) to its Ray, whose workers' output
        is printed here. The wait is interruptible (a signal handler that raises ends it; :meth:`stop` then ends
        the half-started helper)."""
        import ray

        for raw in self.process.stdout:  # anything Ray prints before the address goes on to the user
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith("address "):
                self.address = line.removeprefix("address ")
                break
            print(line, file=sys.stderr)
        else:
            self.process.wait()
            raise LocalRayError(f"the local Ray did not start (exit status {self.process.returncode}; "
                                "its output is above)")
        ray.init(address=self.address, logging_level=logging.WARNING, log_to_driver=True)
        return self.address

    def stop(self, grace_s: float = 30.0) -> None:
        """End the helper: its Ray shuts down on stdin's end (given ``grace_s`` once it was up), a helper still
        starting or stuck gets SIGTERM, and whatever is left in its session's process group is killed."""
        process = self.process
        if process is None:
            return
        try:
            process.stdin.close()
            process.wait(timeout=grace_s if self.address else 0.5)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        finally:
            try:  # start_new_session: the group id is the helper's pid, held while any member lives
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            process.wait()
            process.stdout.close()
            self.process = None


def main(argv: list[str]) -> int:
    """The helper: start a local Ray with ``argv[0]`` CPUs, print its address, hold it until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # in a session of its own; the driver says when to stop
    import ray

    ray.init(address="local", num_cpus=int(argv[0]), include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False)
    print(f"address {ray.get_runtime_context().gcs_address}", flush=True)
    sys.stdin.buffer.read()  # until the driver closes its end, or exits
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
