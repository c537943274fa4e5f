"""What the benches print and save: a JSON summary that says when and on what machine the figures were taken."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys


def environment() -> dict:
    """Date (UTC), machine (processor, CPUs, OS) and Python version, the head of every bench's summary."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
        "python": sys.version.split()[0],
    }


def emit(summary: dict, json_path: str | None) -> None:
    """Print ``summary`` as JSON, and write it to ``json_path`` when one is given."""
    print(json.dumps(summary, indent=2))
    if json_path:
        with open(json_path, "w") as handle:
            json.dump(summary, handle, indent=2)
