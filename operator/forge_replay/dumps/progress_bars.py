"""Progress bars (rich) for long loads and writes, off in library use unless asked for."""

from __future__ import annotations


class progress_bar:
    """Context manager yielding ``advance(label)``: a rich progress bar when enabled, a no-op otherwise."""

    def __init__(self, enabled: bool, total: int, description: str = "writing dumps"):
        self._enabled = enabled
        self._total = total
        self._description = description
        self._bar = None

    def __enter__(self):
        if not self._enabled:
            return lambda _label: None
        from rich.console import Console
        from rich.progress import Progress

        # stderr, so that --json output on stdout stays parseable.
        self._bar = Progress(console=Console(stderr=True), transient=False)
        self._bar.__enter__()
        task = self._bar.add_task(self._description, total=self._total)
        return lambda label: self._bar.update(task, advance=1, description=f"{self._description}: {label}")

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False


class byte_progress:
    """Context manager yielding ``advance(label, nbytes)``: a rich bar of files and bytes done (with the rate), or a
    no-op when disabled."""

    def __init__(self, enabled: bool, files: int, total_bytes: int, description: str):
        self._enabled = enabled and files > 0
        self._files = files
        self._total = total_bytes
        self._description = description
        self._bar = None

    def __enter__(self):
        if not self._enabled:
            return lambda _label, _nbytes: None
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TransferSpeedColumn)

        self._bar = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=10),
            TextColumn("{task.fields[done]}/{task.fields[files]} files"),
            DownloadColumn(), TransferSpeedColumn(), TimeElapsedColumn(),
            console=Console(stderr=True), transient=False,  # stderr: --json output on stdout stays parseable
        )
        self._bar.__enter__()
        task = self._bar.add_task(self._description, total=max(self._total, 1), done=0, files=self._files)
        count = [0]

        def advance(label: str, nbytes: int) -> None:
            count[0] += 1
            self._bar.update(task, advance=nbytes, done=count[0])

        return advance

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False
