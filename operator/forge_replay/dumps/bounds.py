"""Bounded work for any dump file: limits derived from the file, regular files only, short quotes.

A small file must not make a reader hang or exhaust memory. Before the C unpickler runs,
:func:`check_pickle` walks the pickle's opcodes once (runs of plain numbers at regex speed) and
simulates its stack and memo, so it knows every value's nesting depth and its size with shared
references counted each time they are used (what hashing, printing or copying it costs). A value
deeper than ``max_depth``, or larger than ``max_expansion`` times the pickle's own bytes (a
memo DAG: 1.5 KB that hashes or prints as 2^40 elements), or a dict key larger than
``max_key_bytes``, is refused before anything is built. Zip records may not decompress to more
than ``max_compression_ratio`` times the file size (torch.save stores, never compresses), and
tensors may not hold more elements than their storage (stride-0 expansion).

Defaults are generous for real 64k-token dumps. Raise them with ``--limit NAME=VALUE`` on
``forge-replay dumps inspect|verify|pack``, or for every reader in a process (the runtime's
replay included) with ``FORGE_REPLAY_DUMP_LIMITS="max_depth=400,max_expansion=32"``.
"""

from __future__ import annotations

import dataclasses
import os
import pickletools
import re
import reprlib
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

from forge_replay.errors import Portable

ENV_VAR = "FORGE_REPLAY_DUMP_LIMITS"


class LimitError(ValueError):
    """A limit setting is malformed (unknown name, not a positive number)."""


@dataclass(frozen=True)
class Limits:
    """Bounds on the work one dump may cause; every one derives from the file or is a plain count."""

    max_depth: int = 100  # nesting of containers (a real sample: about 6)
    max_expansion: int = 8  # any value's size with shared references expanded, in pickle bytes, per pickle byte
    max_key_bytes: int = 65536  # a dict key's expanded size (hashing cost)
    max_compression_ratio: int = 8  # zip records' total uncompressed size per byte of file

    def with_overrides(self, settings: Iterable[str]) -> Limits:
        """A copy with ``NAME=VALUE`` settings applied (positive integers); raises LimitError."""
        names = {f.name for f in dataclasses.fields(self)}
        changes: dict[str, int] = {}
        for setting in settings:
            name, sep, value = setting.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in names:
                raise LimitError(f"{setting!r}: expected NAME=VALUE with NAME one of {', '.join(sorted(names))}")
            try:
                number = int(value)
            except ValueError:
                number = 0
            if number < 1:
                raise LimitError(f"{setting!r}: the value must be a positive integer")
            changes[name] = number
        return dataclasses.replace(self, **changes)


def default_limits() -> Limits:
    """The defaults, with ``$FORGE_REPLAY_DUMP_LIMITS`` (comma-separated NAME=VALUE) applied."""
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return Limits()
    try:
        return Limits().with_overrides(part for part in raw.split(",") if part.strip())
    except LimitError as exc:
        raise LimitError(f"${ENV_VAR}: {exc}") from None


def raise_hint(name: str) -> str:
    return f"if the file is genuine, raise it with --limit {name}=N or ${ENV_VAR}"


# --- short quotes -----------------------------------------------------------------------------------

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 120, 80, 40


def quote(value: Any, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters, whatever a dump holds (deep, shared, huge)."""
    try:
        text = _REPR.repr(value)
    except Exception:  # a huge int's repr raises, a hostile object's repr may fail
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- regular files only ------------------------------------------------------------------------------


def open_regular(path: str) -> IO[bytes]:
    """Open ``path`` for reading only if it is a regular file (not a FIFO, device or socket).

    The check is made on the opened descriptor, so a symlink to /dev/zero or a FIFO swapped in
    after a check cannot block or feed a reader forever. Raises OSError (ENOENT, ...) or
    ValueError naming the kind of file.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"not a regular file ({_kind(mode)}); dumps are read only from regular files")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a plain file"


# --- the pickle pre-scan -----------------------------------------------------------------------------


class BoundsError(Portable, Exception):
    """The pickle would cost more than the limits allow; ``limit`` names the setting to raise."""

    def __init__(self, problem: str, limit: str | None = None):
        self.limit = limit
        super().__init__(problem + (f" ({raise_hint(limit)})" if limit else ""))


# Runs of plain numbers, None and bools (token ids, masks, log probs): BININT, BININT2, BINFLOAT,
# BININT1, NONE, NEWTRUE, NEWFALSE. They are skipped at regex speed.
_NUMBER_RUN = re.compile(rb"(?s:J....|M..|G........|K.|[N\x88\x89])++")
_RUN_START = frozenset(b"JKMGN\x88\x89")
# Opcodes that pop everything down to a MARK: after one of them a run's item count does not matter.
_MARK_CONSUMERS = frozenset(b"ledut\x90\x911")
_TWO_LINES = frozenset({"GLOBAL", "INST"})
_MEMO_PUT, _MEMO_GET, _MEMOIZE, _MARK_OP, _POP, _POP_MARK, _DUP, _NOTHING, _IN_PLACE, _NEW, _STOP = range(11)


def _op_table() -> dict[int, tuple[str, int, int, bool, int, int]]:
    """opcode byte -> (name, arg kind (pickletools' n), prefix pops, pops to MARK, pushes, category)."""
    table = {}
    for op in pickletools.opcodes:
        name, before = op.name, op.stack_before
        marked = pickletools.markobject in before
        prefix = before.index(pickletools.markobject) if marked else len(before)
        if name in ("PUT", "BINPUT", "LONG_BINPUT"):
            category = _MEMO_PUT
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            category = _MEMO_GET
        else:
            category = {
                "MEMOIZE": _MEMOIZE, "MARK": _MARK_OP, "POP": _POP, "POP_MARK": _POP_MARK, "DUP": _DUP,
                "PROTO": _NOTHING, "FRAME": _NOTHING, "STOP": _STOP, "APPEND": _IN_PLACE, "APPENDS": _IN_PLACE,
                "SETITEM": _IN_PLACE, "SETITEMS": _IN_PLACE, "ADDITEMS": _IN_PLACE, "BUILD": _IN_PLACE,
            }.get(name, _NEW)
        arg = 0 if op.arg is None else op.arg.n
        table[op.code.encode("latin-1")[0]] = (name, arg, prefix, marked, len(op.stack_after), category)
    return table


_OPS = _op_table()
_LENGTH_PREFIX = {-2: (1, False), -3: (4, True), -4: (4, False), -5: (8, False)}


_WIDTHS = {ord("J"): 5, ord("M"): 3, ord("G"): 9, ord("K"): 2, ord("N"): 1, 0x88: 1, 0x89: 1}
_CHUNK = 4096
# The opcodes with a fast path in check_pickle.
_BINGET, _LONG_BINGET, _BINPUT, _LONG_BINPUT = b"hjqr"
_BINUNICODE, _SHORT_BINUNICODE, _MARK, _SETITEMS, _APPENDS = b"X\x8c(ue"
_EMPTY = frozenset(b"])}")  # EMPTY_LIST, EMPTY_TUPLE, EMPTY_DICT: leaves
# TUPLE1-3, REDUCE and NEWOBJ replace the top N values with one value holding them.
_COMBINE_TOP = {0x85: 1, 0x86: 2, 0x87: 3, ord("R"): 2, 0x81: 2}


def _run_end(data: bytes, pos: int) -> int:
    """End of the run of number opcodes starting at ``pos``.

    A run of one opcode (log probs: BINFLOAT after BINFLOAT) is measured with a strided slice:
    every ``width``-th byte must be that opcode, which is exactly a parse of it. Mixed runs (token
    ids switch between BININT and BININT2) go through the regex.
    """
    end = len(data)
    while pos < end:
        code = data[pos]
        width = _WIDTHS[code]
        stride = data[pos : pos + width * _CHUNK : width]
        count = len(stride) - len(stride.lstrip(stride[:1]))
        if pos + width * count > end:  # the last opcode's argument is cut off: let the slow path say so
            count -= 1
        pos += width * count
        if count == _CHUNK:
            continue
        if pos < end and data[pos] in _RUN_START:
            run = _NUMBER_RUN.match(data, pos)  # None: that opcode's argument is cut off
            return run.end() if run else pos
        return pos
    return pos


def _arg_end(data: bytes, pos: int, name: str, kind: int) -> int:
    """Where the argument of the opcode at ``pos`` ends (pickletools' argument kinds)."""
    start = pos + 1
    if kind >= 0:
        return start + kind
    if kind == -1:  # newline-terminated text, two lines for GLOBAL and INST
        end = data.find(b"\n", start)
        if end >= 0 and name in _TWO_LINES:
            end = data.find(b"\n", end + 1)
        if end < 0:
            raise BoundsError(f"malformed pickle: unterminated {name} argument at byte {pos}")
        return end + 1
    width, signed = _LENGTH_PREFIX[kind]
    length = int.from_bytes(data[start : start + width], "little", signed=signed)
    if length < 0:
        raise BoundsError(f"malformed pickle: negative {name} length at byte {pos}")
    return start + width + length


def _memo_key(data: bytes, pos: int, end: int, kind: int) -> int:
    """The memo key of a PUT/GET opcode at ``pos`` whose argument ends at ``end``."""
    if kind == -1:  # PUT / GET: decimal text
        try:
            return int(data[pos + 1 : end - 1])
        except ValueError:
            raise BoundsError(f"malformed pickle: memo key at byte {pos}") from None
    return int.from_bytes(data[pos + 1 : end], "little")


class _Within:
    """The bounds of one pickle's values: its limits, with the expansion as bytes of this pickle."""

    __slots__ = ("max_size", "max_depth", "max_key", "expansion", "pickle_bytes")

    def __init__(self, limits: Limits, pickle_bytes: int):
        self.max_size = max(limits.max_expansion * pickle_bytes, 1 << 20)
        self.max_depth, self.max_key = limits.max_depth, limits.max_key_bytes
        self.expansion, self.pickle_bytes = limits.max_expansion, pickle_bytes

    def check(self, value: list[int]) -> None:
        """Raise BoundsError when ``value`` ([expanded size, depth]) nests or expands beyond the limits."""
        if value[0] > self.max_size or value[1] > self.max_depth:
            if value[1] > self.max_depth:
                raise BoundsError(f"values nest deeper than {self.max_depth} levels", "max_depth")
            raise BoundsError(
                f"a value expands to more than {self.max_size} bytes through shared references "
                f"({self.expansion}x the pickle's {self.pickle_bytes} bytes)",
                "max_expansion",
            )

    def check_keys(self, keys: list[list[int]]) -> None:
        """Raise BoundsError when a dict key expands beyond ``max_key_bytes``."""
        if any(key[0] > self.max_key for key in keys):
            raise self.key_too_big()

    def key_too_big(self) -> BoundsError:
        return BoundsError(f"a dict key expands to more than {self.max_key} bytes", "max_key_bytes")


def check_pickle(data: bytes, limits: Limits) -> None:
    """Refuse (BoundsError) a pickle whose values nest or expand beyond ``limits``, without building it."""
    within = _Within(limits, len(data))
    stack: list[list[int]] = []  # one [expanded size, depth] per value; containers' entries grow in place
    push = stack.append
    marks: list[int] = []  # stack positions of the MARKs
    memo: dict[int, list[int]] = {}
    pos, end, run_end = 0, len(data), 0
    fast_end = end - 9  # the fast paths below read at most 9 bytes without checking the end

    while pos < end:
        code = data[pos]
        # Fast paths for the opcodes that make up a structured dump (numbers, memo reads and writes, strings, marks,
        # tuples, dict and list items): the same rules as the general path (_general_step), without its table
        # lookups. Anything malformed, rare or near the end of the data takes the general path, which names the
        # problem.
        if code in _RUN_START:
            width = _WIDTHS[code]
            if pos < run_end or (pos + width < end and data[pos + width] not in _RUN_START):
                push([width, 0])  # inside a run measured earlier, or a lone number
                pos += width
                continue
            after = _run_end(data, pos)
            if after > pos:
                if marks and after < end and data[after] in _MARK_CONSUMERS:
                    push([after - pos, 0])  # one entry for the run: a mark consumer takes all
                else:
                    run_end = after  # not followed by a mark consumer: go through it opcode by opcode
                    push([width, 0])
                    after = pos + width
                pos = after
                continue
        elif pos < fast_end:
            if code == _BINGET or code == _LONG_BINGET:
                key = data[pos + 1] if code == _BINGET else int.from_bytes(data[pos + 1 : pos + 5], "little")
                value = memo.get(key)
                if value is not None:
                    push(value)
                    pos += 2 if code == _BINGET else 5
                    continue
            elif code == _BINPUT or code == _LONG_BINPUT:
                if stack and not (marks and marks[-1] == len(stack)):
                    if code == _BINPUT:
                        memo[data[pos + 1]] = stack[-1]
                        pos += 2
                    else:
                        memo[int.from_bytes(data[pos + 1 : pos + 5], "little")] = stack[-1]
                        pos += 5
                    continue
            elif code == _BINUNICODE or code == _SHORT_BINUNICODE:
                if code == _BINUNICODE:
                    after = pos + 5 + int.from_bytes(data[pos + 1 : pos + 5], "little")
                else:
                    after = pos + 2 + data[pos + 1]
                if after <= end:
                    push([after - pos, 0])
                    pos = after
                    continue
            elif code == _MARK:
                marks.append(len(stack))
                pos += 1
                continue
            elif code in _EMPTY:
                push([1, 0])
                pos += 1
                continue
            elif code == _SETITEMS or code == _APPENDS:
                if _add_marked_items(code == _SETITEMS, stack, marks, within):
                    pos += 1
                    continue
            elif code in _COMBINE_TOP:
                if _combine_top(_COMBINE_TOP[code], stack, marks, within):
                    pos += 1
                    continue
        after = _general_step(data, pos, code, stack, marks, memo, within)
        if after is None:
            return
        pos = after
    raise BoundsError("malformed pickle: no STOP opcode")


def _add_marked_items(dict_items: bool, stack: list[list[int]], marks: list[int], within: _Within) -> bool:
    """SETITEMS / APPENDS: the items above the last MARK go into the container below it; False (nothing done) when
    the stack does not have that shape (the general path then says what is wrong)."""
    if not (marks and marks[-1] > (marks[-2] if len(marks) > 1 else 0)):
        return False
    bottom = marks.pop()
    items = stack[bottom:]
    del stack[bottom:]
    container = stack[-1]
    if items:
        if dict_items:
            max_key = within.max_key
            for key in items[0::2]:
                if key[0] > max_key:
                    raise within.key_too_big()
        size, depth = container[0] + 1, container[1]
        for item in items:
            size += item[0]
            if item[1] >= depth:
                depth = item[1] + 1
        container[0], container[1] = size, depth
        if size > within.max_size or depth > within.max_depth:  # compared here: a call would cost on every container
            within.check(container)
    return True


def _combine_top(count: int, stack: list[list[int]], marks: list[int], within: _Within) -> bool:
    """TUPLE1-3, REDUCE, NEWOBJ: the top ``count`` values become one value holding them; False (nothing done) when
    fewer are above the last MARK."""
    if len(stack) - count < (marks[-1] if marks else 0):
        return False
    size, depth = 1, 0
    for item in stack[len(stack) - count :]:
        size += item[0]
        if item[1] >= depth:
            depth = item[1] + 1
    value = [size, depth]
    if size > within.max_size or depth > within.max_depth:
        within.check(value)
    stack[len(stack) - count :] = [value]
    return True


def _general_step(data: bytes, pos: int, code: int, stack: list[list[int]], marks: list[int],
                  memo: dict[int, list[int]], within: _Within) -> int | None:
    """Simulate the opcode at ``pos`` on the stack, marks and memo, by its entry in pickletools' table; where the
    next opcode starts, or None at STOP. Raises BoundsError for a value beyond the limits or a malformed pickle."""
    entry = _OPS.get(code)
    if entry is None:
        raise BoundsError(f"malformed pickle: unknown opcode {bytes([code])!r} at byte {pos}")
    name, kind, prefix, marked, pushes, category = entry
    arg_end = pos + 1 + kind if kind >= 0 else _arg_end(data, pos, name, kind)  # fixed-size args inline
    if arg_end > len(data):
        raise BoundsError(f"malformed pickle: {name} at byte {pos} runs past the end")
    size = arg_end - pos
    if category == _NEW and not prefix and not marked:  # a leaf: number, string, empty container, global
        stack.append([size, 0])
    elif category == _MEMO_PUT or category == _MEMOIZE:
        if not stack or (marks and marks[-1] == len(stack)):
            raise BoundsError(f"malformed pickle: memo store on an empty stack at byte {pos}")
        memo[len(memo) if category == _MEMOIZE else _memo_key(data, pos, arg_end, kind)] = stack[-1]
    elif category == _MEMO_GET:
        value = memo.get(_memo_key(data, pos, arg_end, kind))
        if value is None:
            raise BoundsError(f"malformed pickle: memo key read before it is set at byte {pos}")
        stack.append(value)
    elif category == _MARK_OP:
        marks.append(len(stack))
    elif category == _POP and marks and marks[-1] == len(stack):
        marks.pop()
    elif category == _NOTHING:
        pass
    elif category == _STOP:
        return None
    else:
        _pop_and_push(data, pos, name, size, prefix, marked, pushes, category, stack, marks, within)
    return arg_end


def _pop_and_push(data: bytes, pos: int, name: str, size: int, prefix: int, marked: bool, pushes: int,
                  category: int, stack: list[list[int]], marks: list[int], within: _Within) -> None:
    """An opcode that takes values off the stack (down to its MARK when ``marked``, then ``prefix`` more) and puts
    back what it makes of them: the container it filled, nothing, a copy, or a new value holding them."""
    items = []
    if marked:
        if not marks:
            raise BoundsError(f"malformed pickle: {name} without a MARK at byte {pos}")
        bottom = marks.pop()
        items = stack[bottom:]
        del stack[bottom:]
    floor = marks[-1] if marks else 0
    if len(stack) - prefix < floor:
        raise BoundsError(f"malformed pickle: stack underflow at {name}, byte {pos}")
    popped = stack[len(stack) - prefix :] if prefix else []
    if prefix:
        del stack[len(stack) - prefix :]
    if category == _IN_PLACE:
        container, others = popped[0], popped[1:] + items
        if name in ("SETITEM", "SETITEMS"):
            within.check_keys(others[0::2])
        if others:
            container[0] += size + sum(v[0] for v in others)
            container[1] = max(container[1], 1 + max(v[1] for v in others))
            within.check(container)
        stack.append(container)
    elif category == _POP or category == _POP_MARK:
        pass
    elif category == _DUP:
        stack.extend(popped * 2)
    else:
        children = popped + items
        if name == "DICT":
            within.check_keys(items[0::2])
        value = [size + sum(v[0] for v in children), 1 + max((v[1] for v in children), default=-1)]
        within.check(value)
        stack.extend([value] * pushes)
