"""Argument types the benches share: a bad value is an argparse error naming the option (exit 2), not a
traceback minutes into a run.

Used as ``parser.add_argument("--repeats", type=positive_int)``; argparse prints
``error: argument --repeats: must be an integer >= 1 (got '0')``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable


def _int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low} (got {text!r})")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


positive_int = _int_at_least(1)
non_negative_int = _int_at_least(0)


def existing_dir(text: str) -> str:
    """A folder that exists."""
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"no such folder: {text}")
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"not a folder: {text}")
    return text


def writable_dir(text: str) -> str:
    """A folder that exists and this process may write in."""
    if not os.access(existing_dir(text), os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"folder not writable: {text}")
    return text


def output_dir(text: str) -> str:
    """A folder that exists and is writable, or can be created (its nearest existing parent is writable)."""
    if os.path.exists(text):
        return writable_dir(text)
    parent = os.path.dirname(os.path.abspath(text))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot create {text}: {parent} is not a writable folder")
    return text


def output_file(text: str) -> str:
    """A file path whose folder exists and is writable (checked before the run, not after it)."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"is a folder, expected a file: {text}")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"no such folder for {text}: {folder}")
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(text) and not os.access(text, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text}")
    return text


def choices_list(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    """A comma-separated list of names from ``allowed``, each once."""

    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in allowed]
        if not names or unknown or len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {', '.join(allowed)}, each once (got {text!r})")
        return names

    parse.__name__ = "list"
    return parse
