"""``python3 -m forge_replay.backends.entry PAYLOAD``: a slime / miles job's shell line, run by bash on the Ray head.

KubeRay v1.5.0 (K8sJobMode) pastes a RayJob's entrypoint unquoted into its submitter's bash command line
(controllers/ray/common/job.go BuildJobSubmitCommand: ``... --no-wait -- <entrypoint> ; fi ; ray job logs ...``,
run with ``bash -ce``), and ``ray job submit`` re-quotes the words after ``--`` for ``sh -c`` with
``subprocess.list2cmdline`` (ray/dashboard/modules/job/cli.py): a line with ``&&``, ``;`` or ``$?`` would be cut
at its first operator, the rest run in the submitter pod. So the RayJob's entrypoint is this module and one word,
the line as URL-safe base64 (letters, digits, ``-``, ``_``, ``=``: unchanged through both shells), which it decodes
and hands to bash. Standard library only: the team's image needs nothing but forge_replay on its PYTHONPATH.
"""

from __future__ import annotations

import base64
import os
import sys

MODULE = "forge_replay.backends.entry"


def encode(line: str) -> str:
    """The RayJob entrypoint that runs shell ``line`` on the Ray head: ``python3 -m <MODULE> <payload>``."""
    return f"python3 -m {MODULE} {base64.urlsafe_b64encode(line.encode()).decode()}"


def decode(payload: str) -> str:
    """The shell line a payload of :func:`encode` carries."""
    return base64.urlsafe_b64decode(payload.encode()).decode()


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit(f"usage: python3 -m {MODULE} PAYLOAD (a shell line as URL-safe base64)")
    line = decode(argv[0])
    print(f"forge-replay: running {line}", flush=True)
    os.execvp("bash", ["bash", "-c", line])  # the line's own exit status is the job's


if __name__ == "__main__":
    main(sys.argv[1:])
