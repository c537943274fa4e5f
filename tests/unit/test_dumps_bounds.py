"""Bounded work for any dump file (issue 19): memo DAGs, deep nesting, zip bombs, expanded tensors, FIFOs.

Each attack file is small; without the bounds each one hangs, exhausts memory or prints a huge
message. Those that hung are run in a subprocess with a generous deadline, so a regression fails
instead of blocking the suite.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import zipfile

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from forge_replay.dumps import DumpError, load, safe_load, save
from forge_replay.dumps.bounds import ENV_VAR, LimitError, Limits, check_pickle, default_limits
from forge_replay.dumps.sample import Sample
from forge_replay.dumps.verify import verify_dumps


def _dag(depth: int) -> bytes:
    """Opcodes for a tuple DAG: t0 = (1, 2), t(i+1) = (t(i), t(i)) through the memo; 2^depth leaves, tiny."""
    out = b"K\x01K\x02\x86q\x00"
    for i in range(depth):
        out += b"0h" + bytes([i]) + b"h" + bytes([i]) + b"\x86q" + bytes([i + 1])  # pop t(i), push t(i+1)
    return out


def _dump_pickle(rollout_id: bytes, key: bytes | None = None) -> bytes:
    """A protocol-2 pickle of {"rollout_id": <opcodes>, "samples": [] or [{<key>: 1}]}."""
    samples = b"]" if key is None else b"]}" + key + b"K\x01sa"
    return b"\x80\x02}(X\x0a\x00\x00\x00rollout_id" + rollout_id + b"X\x07\x00\x00\x00samples" + samples + b"u."


def _run_isolated(code: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)


_LOAD_AND_REPORT = (
    "import sys\nfrom forge_replay.dumps import DumpError, SampleError, load\n"
    "try:\n    load(sys.argv[1])\n    print('LOADED')\nexcept (DumpError, SampleError) as e:\n"
    "    print(len(str(e)))\n    print(str(e)[:2000])\n"
)


def test_memo_dag_as_dict_key_is_refused_without_hashing(tmp_path):
    path = tmp_path / "dag-key.pkl"
    path.write_bytes(_dump_pickle(b"K\x00", key=_dag(40)))  # hashing the key visits 2^40 leaves
    result = _run_isolated(_LOAD_AND_REPORT, str(path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "max_expansion" in result.stdout or "max_key_bytes" in result.stdout
    assert str(path) in result.stdout


@pytest.mark.parametrize("depth", [24, 40])
def test_memo_dag_in_a_field_gives_a_short_error(tmp_path, depth):
    """The same DAG as rollout_id: a 117 MB error message at depth 24, MemoryError at 40, before."""
    path = tmp_path / "dag-field.pkl"
    path.write_bytes(_dump_pickle(_dag(depth)))
    assert path.stat().st_size < 1000
    result = _run_isolated(_LOAD_AND_REPORT, str(path))
    assert result.returncode == 0, result.stderr[-2000:]
    length = int(result.stdout.splitlines()[0])
    assert length < 600 and str(path) in result.stdout


def test_a_shared_value_within_the_limit_loads(tmp_path):
    """Sharing itself is fine (slime dumps share dicts between samples); only blow-ups are refused."""
    metadata = {"source": "x" * 100}
    path = tmp_path / "shared.pt"
    save(path, 0, [Sample(tokens=[1, 2], response_length=1, reward=1.0, metadata=metadata) for _ in range(50)])
    samples = load(path).samples
    assert [s.metadata for s in samples] == [metadata] * 50


def _nested_list_pickle(depth: int) -> bytes:
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


def test_nesting_depth_is_bounded_and_can_be_raised(tmp_path):
    path = tmp_path / "deep.pkl"
    path.write_bytes(_nested_list_pickle(150))
    with pytest.raises(DumpError, match=r"nest deeper than 100 levels .*--limit max_depth=N"):
        safe_load(path)
    value = safe_load(path, Limits(max_depth=200))
    for _ in range(149):
        (value,) = value
    assert value == []


def _dump_with_metadata(opcodes: bytes) -> bytes:
    """A one-sample dump pickle whose sample's ``metadata`` value is ``opcodes``."""
    import io

    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=2)
    pickler.fast = True  # no memo opcodes, so the metadata value is easy to find
    pickler.dump({"rollout_id": 0, "samples": [Sample(tokens=[1, 2], response_length=1, reward=1.0).to_dict()]})
    marker = b"X\x08\x00\x00\x00metadata}"
    assert buffer.getvalue().count(marker) == 1
    return buffer.getvalue().replace(marker, marker[:-1] + opcodes)


def test_million_deep_metadata_is_a_clear_error_in_pack(tmp_path):
    """10^6 nested lists in a sample's metadata: RecursionError tracebacks before (pack, inspect)."""
    hostile = _dump_with_metadata(b"]" * 1_000_000 + b"a" * 999_999)
    path = tmp_path / "deep.pkl"
    path.write_bytes(hostile)
    from forge_replay.cli import main

    result = CliRunner().invoke(main, ["dumps", "pack", str(path), str(tmp_path / "deep.pack")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)  # a clean exit, not an exception
    assert "max_depth" in result.stderr and str(path) in result.stderr
    assert "Traceback" not in result.output


def test_zip_bomb_is_refused_before_inflating(tmp_path):
    """A deflated data.pkl (torch.save never compresses) many times the file's size."""
    path = tmp_path / "bomb.pt"
    payload = pickle.dumps({"rollout_id": 0, "samples": [], "pad": b"\x00" * (64 << 20)}, protocol=2)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", payload)
        archive.writestr("archive/version", "3\n")
    assert path.stat().st_size < 1 << 20
    with pytest.raises(DumpError, match="unpack to .* bytes from a .*max_compression_ratio"):
        safe_load(path)


def test_storage_record_larger_than_the_file_allows_is_refused(tmp_path):
    clean = tmp_path / "t.pt"
    torch.save({"rollout_id": 0, "samples": [{"x": torch.zeros(16 << 20, dtype=torch.uint8)}]}, clean)
    bomb = tmp_path / "bomb.pt"
    with zipfile.ZipFile(clean) as src, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(DumpError, match="max_compression_ratio"):
        safe_load(bomb)
    assert safe_load(clean)["samples"][0]["x"].numel() == 16 << 20


@pytest.mark.parametrize("elements", [1 << 18, 1 << 40])
def test_expanded_tensors_are_refused(tmp_path, elements):
    path = tmp_path / "expanded.pt"
    sample = Sample(tokens=[1, 2], response_length=1, reward=1.0, rollout_log_probs=torch.zeros(1).expand(elements))
    save(path, 0, [sample])
    with pytest.raises(DumpError, match=rf"a tensor of {elements} elements .* over a storage of 1: expanded"):
        load(path)


def test_views_of_one_storage_still_load(tmp_path):
    base = torch.arange(12, dtype=torch.float32)
    path = tmp_path / "views.pt"
    torch.save({"a": base[2:5], "b": base.reshape(3, 4).t(), "c": base[::3]}, path)
    loaded = safe_load(path)
    assert loaded["a"].tolist() == [2.0, 3.0, 4.0]
    assert loaded["b"].tolist() == base.reshape(3, 4).t().tolist() and loaded["c"].tolist() == [0.0, 3.0, 6.0, 9.0]


def test_only_regular_files_are_read(tmp_path):
    fifo = tmp_path / "rollout_0.pt"
    os.mkfifo(fifo)
    zero = tmp_path / "rollout_1.pt"
    zero.symlink_to("/dev/zero")
    code = (
        "import sys\nfrom forge_replay.dumps import DumpError, load\nfrom forge_replay.dumps.verify import verify_dumps\n"
        "for p in sys.argv[1:]:\n    try:\n        load(p)\n    except DumpError as e:\n        print(e)\n"
        "r = verify_dumps(None, sys.argv[1].replace('rollout_0', 'rollout_{rollout_id}'), 2)\n"
        "print(r.summary())\n"
    )
    result = _run_isolated(code, str(fifo), str(zero), timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{fifo}: not a regular file (a FIFO)" in result.stdout
    assert f"{zero}: not a regular file (a character device)" in result.stdout
    assert result.stdout.count("UNREADABLE") == 2


def test_packed_reader_reads_only_regular_files(tmp_path):
    fifo = tmp_path / "p.pack"
    os.mkfifo(fifo)
    code = "import sys\nfrom forge_replay.dumps.packed import is_packed\nprint(is_packed(sys.argv[1]))\n"
    result = _run_isolated(code, str(fifo), timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "False"


def test_limits_settings_and_environment(monkeypatch):
    assert Limits().with_overrides(["max_depth=7", "max-expansion=3"]) == Limits(max_depth=7, max_expansion=3)
    for bad in ["max_depth", "depth=3", "max_depth=0", "max_depth=x"]:
        with pytest.raises(LimitError):
            Limits().with_overrides([bad])
    monkeypatch.setenv(ENV_VAR, "max_depth=300, max_key_bytes=10")
    assert default_limits() == Limits(max_depth=300, max_key_bytes=10)
    monkeypatch.setenv(ENV_VAR, "max_depth=-1")
    with pytest.raises(LimitError, match=ENV_VAR):
        default_limits()


def test_cli_limit_flag_raises_a_limit(tmp_path):
    from forge_replay.cli import main

    hostile = _dump_with_metadata(b"]" * 150 + b"a" * 149)
    path = tmp_path / "deep.pkl"
    path.write_bytes(hostile)
    runner = CliRunner()
    refused = runner.invoke(main, ["dumps", "inspect", str(path), "--json"])
    assert refused.exit_code == 1 and "--limit max_depth=N" in refused.stderr
    raised = runner.invoke(main, ["dumps", "inspect", str(path), "--json", "--limit", "max_depth=200"])
    assert raised.exit_code == 0, raised.output
    assert json.loads(raised.stdout)["samples"] == 1
    report = verify_dumps(None, str(path), 1, limits=Limits(max_depth=200))
    assert report.ok
    assert runner.invoke(main, ["dumps", "verify", "--path", str(path), "--num-rollouts", "1", "--limit", "nope=1"]).exit_code == 2


@pytest.mark.parametrize(
    "data",
    [
        b"\x80\x02K\x01K\x02\x86q\x00h\x00h\x00\x86.",  # a small DAG: fine
        b"\x80\x02(K\x01K\x02K\x03l(J\x00\x00\x01\x00M\x02\x01G?\xf0\x00\x00\x00\x00\x00\x00e.",
        b"\x80\x02}(X\x01\x00\x00\x00a]q\x01(K\x01K\x02eX\x01\x00\x00\x00bh\x01u.",
        b"\x80\x02(K\x01K\x020K\x03\x85.",  # POP inside a MARK frame
        b"\x80\x02(0K\x03.",  # POP of a MARK
    ],
)
def test_scan_agrees_with_pickle_on_valid_pickles(data):
    pickle.loads(data)
    check_pickle(data, Limits())


@pytest.mark.parametrize("data", [b"\x80\x02K\x01", b"\x80\x02e.", b"\x80\x02h\x05.", b"\x80\x02X\xff\xff\x00\x00ab."])
def test_scan_refuses_malformed_pickles(data):
    from forge_replay.dumps.bounds import BoundsError

    with pytest.raises(BoundsError, match="malformed pickle"):
        check_pickle(data, Limits())


_plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=6)
    | st.tuples(children, children)
    | st.dictionaries(st.text(max_size=5) | st.integers(), children, max_size=5),
    max_leaves=40,
)


@settings(max_examples=150, deadline=None)
@given(value=_plain, protocol=st.integers(0, pickle.HIGHEST_PROTOCOL), shared=st.booleans())
def test_scan_accepts_every_plain_pickle(value, protocol, shared):
    """The pre-scan's stack simulation follows pickle itself: no valid plain-data pickle is refused."""
    value = [value, value] if shared else value  # memo references too
    data = pickle.dumps(value, protocol=protocol)
    check_pickle(data, Limits())


@settings(max_examples=100, deadline=None)
@given(value=_plain, protocol=st.integers(0, pickle.HIGHEST_PROTOCOL), cut=st.floats(0, 1, exclude_max=True))
def test_scan_refuses_every_truncated_pickle_as_malformed(value, protocol, cut):
    """A pickle cut anywhere (a partly written plain-pickle dump) is a BoundsError, never a crash of the scan."""
    from forge_replay.dumps.bounds import BoundsError

    data = pickle.dumps([value, 2.5, value], protocol=protocol)
    with pytest.raises(BoundsError, match="malformed pickle"):
        check_pickle(data[: int(len(data) * cut)], Limits())


# Each way a structured dump combines values, as a memo DAG: v(i+1) holds v(i) twice (read back with BINGET, or
# LONG_BINGET for the keys over 255), so v(depth) expands to 2^depth leaves from a few bytes per level.
_COMBINE_TWO = {
    "TUPLE2": lambda a, b: a + b + b"\x86",
    "TUPLE": lambda a, b: b"(" + a + b + b"t",
    "APPENDS": lambda a, b: b"](" + a + b + b"e",
    "SETITEMS": lambda a, b: b"}(K\x01" + a + b"K\x02" + b + b"u",
    "REDUCE": lambda a, b: b"c__builtin__\ntuple\n" + a + b + b"\x86R",
    "BUILD": lambda a, b: b"}" + a + b + b"\x86b",
}


def _combined_dag(combine, depth: int, long_keys: bool) -> bytes:
    def get(key: int) -> bytes:
        return b"j" + key.to_bytes(4, "little") if long_keys else b"h" + bytes([key])

    def put(key: int) -> bytes:
        return b"r" + key.to_bytes(4, "little") if long_keys else b"q" + bytes([key])

    out = b"\x80\x02X\x03\x00\x00\x00abc" + put(0)
    for i in range(depth):
        out += b"0" + combine(get(i), get(i)) + put(i + 1)
    return out + b"."


@pytest.mark.parametrize("long_keys", [False, True])
@pytest.mark.parametrize("name", sorted(_COMBINE_TWO))
def test_every_combining_opcode_counts_shared_references(name, long_keys):
    """The scan's fast paths (TUPLE2, APPENDS, SETITEMS, REDUCE, BINGET/LONG_BINGET) and its general path (TUPLE,
    BUILD) expand shared values alike: a shallow DAG passes, a deep one is refused before anything is built."""
    from forge_replay.dumps.bounds import BoundsError

    check_pickle(_combined_dag(_COMBINE_TWO[name], 6, long_keys), Limits())
    with pytest.raises(BoundsError, match="max_expansion"):
        check_pickle(_combined_dag(_COMBINE_TWO[name], 40, long_keys), Limits())


def test_a_large_key_is_refused_in_setitems():
    """SETITEMS checks every key it adds, not only the first."""
    from forge_replay.dumps.bounds import BoundsError

    key = b"X" + (70000).to_bytes(4, "little") + b"k" * 70000
    data = b"\x80\x02}(K\x01K\x02" + key + b"K\x03u."
    with pytest.raises(BoundsError, match="max_key_bytes"):
        check_pickle(data, Limits())
    check_pickle(data, Limits(max_key_bytes=70005))


def test_one_storage_record_is_read_once(tmp_path):
    """Referencing one record under another dtype used to read (allocate) it again each time."""
    clean = tmp_path / "t.pt"
    torch.save({"a": torch.zeros(4, dtype=torch.float32), "b": torch.zeros(4, dtype=torch.int32)}, clean)
    path = tmp_path / "twice.pt"
    with zipfile.ZipFile(clean) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data.pkl"):
                assert data.count(b"X\x01\x00\x00\x001") == 1
                data = data.replace(b"X\x01\x00\x00\x001", b"X\x01\x00\x00\x000")  # b's storage key: a's record
            dst.writestr(info.filename, data)
    with pytest.raises(DumpError, match=r"storage record '0' is referenced as torch.float32 and torch.int32"):
        safe_load(path)
    assert safe_load(clean)["b"].dtype == torch.int32
