"""Hostile dumps (issue 19): a dump cannot poison later loads, and `dumps pack` never writes corruption.

Every attack here is a real pickle, written byte by byte where torch.save cannot produce it, and
every test checks values afterwards against what they must be, including a plain ``torch.load`` of
an unrelated file in the same process.
"""

from __future__ import annotations

import _pickle
import io
import json
import math
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from forge_replay.dumps import DumpError, SampleError, load, safe_load, save
from forge_replay.dumps.packed import identical
from forge_replay.dumps.safe_pickle import ALLOWED_GLOBALS, _SafeUnpickler
from forge_replay.dumps.sample import Sample

LOG_PROBS = [-0.25, -1.5, -3.0]


def _fragment(obj) -> bytes:
    """``obj`` as protocol-2 pickle opcodes without PROTO/STOP and without memo (to splice into a pickle)."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=2)
    pickler.fast = True
    pickler.dump(obj)
    data = buffer.getvalue()
    assert data[:2] == b"\x80\x02" and data[-1:] == b"."
    return data[2:-1]


def _build_on_global(module: str, name: str, state) -> bytes:
    """Opcodes: push global ``module.name``, BUILD ``state`` into it, pop it."""
    return f"c{module}\n{name}\n".encode() + _fragment(state) + b"b0"


def _poisoned_copy(clean, poisoned, prefix: bytes) -> None:
    """A copy of the torch.save archive ``clean`` whose data.pkl first runs ``prefix``."""
    with zipfile.ZipFile(clean) as src, zipfile.ZipFile(poisoned, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data.pkl"):
                data = data[:2] + prefix + data[2:]
            dst.writestr(info.filename, data)


def _clean_dump(path) -> None:
    sample = Sample(tokens=[5, 6, 7, 8], response_length=3, reward=1.0, rollout_log_probs=torch.tensor(LOG_PROBS))
    save(path, 0, [sample])


def _check_later_loads_are_clean(tmp_path) -> None:
    clean = tmp_path / "clean.pt"
    _clean_dump(clean)
    loaded = load(clean).samples[0].rollout_log_probs
    assert loaded.dtype == torch.float32 and loaded.tolist() == LOG_PROBS
    other = tmp_path / "unrelated.pt"
    torch.save({"w": torch.tensor([3.0, 4.0]), "i": torch.tensor([7, -8])}, other)
    plain = torch.load(other, weights_only=False)
    assert plain["w"].tolist() == [3.0, 4.0] and plain["i"].tolist() == [7, -8]
    assert torch.load(other, weights_only=True)["w"].tolist() == [3.0, 4.0]


POISONS = {
    # the storage marker's dtype, through BUILD's dict state and its slot state
    "storage-dtype-dict": ("torch", "FloatStorage", {"dtype": torch.int32}),
    "storage-dtype-slots": ("torch", "FloatStorage", (None, {"dtype": torch.int32})),
    # _rebuild_tensor_v2's default metadata: {"neg": True} negates every tensor loaded afterwards
    "rebuild-defaults": ("torch._utils", "_rebuild_tensor_v2", (None, {"__defaults__": ({"neg": True},)})),
    "rebuild-dict": ("torch._utils", "_rebuild_tensor_v2", {"__defaults__": ({"neg": True},)}),
    "codecs-encode": ("_codecs", "encode", (None, {"__name__": "x"})),
}


@pytest.mark.parametrize("module, name, state", POISONS.values(), ids=POISONS)
def test_a_poisoned_dump_is_refused_and_later_loads_are_clean(tmp_path, module, name, state):
    clean = tmp_path / "source.pt"
    _clean_dump(clean)
    poisoned = tmp_path / "poisoned.pt"
    _poisoned_copy(clean, poisoned, _build_on_global(module, name, state))
    with pytest.raises(DumpError) as info:
        load(poisoned)
    assert str(poisoned) in str(info.value) and "read-only" in str(info.value)
    _check_later_loads_are_clean(tmp_path)


@pytest.mark.parametrize("key", sorted(ALLOWED_GLOBALS), ids=lambda k: ".".join(k))
def test_no_allowlisted_global_takes_state(tmp_path, key):
    """Whatever find_class hands out, BUILD cannot write into it (dict state or slot state)."""
    module, name = key
    value = ALLOWED_GLOBALS[key]
    before = {attr: getattr(value, attr, None) for attr in ("__defaults__", "__kwdefaults__", "dtype")}
    for state in ({"poison": 1, "dtype": torch.int8}, (None, {"poison": 1, "dtype": torch.int8})):
        path = tmp_path / "build.pkl"
        path.write_bytes(b"\x80\x02" + _build_on_global(module, name, state) + b"N.")
        with pytest.raises(DumpError, match="refused to load|malformed pickle data|corrupt pickle data"):
            safe_load(path)
        assert not hasattr(value, "poison")
        assert {attr: getattr(value, attr, None) for attr in before} == before


def test_the_loader_is_the_c_unpickler():
    """The checks above exercise the production path: the C unpickler with overridden hooks."""
    assert _SafeUnpickler.__mro__[1] is _pickle.Unpickler


def test_numpy_dtype_state_cannot_crash_or_change_numpy(tmp_path):
    """numpy's own dtype.__setstate__ segfaults on some states; the loader never hands it one."""
    path = tmp_path / "dtype.pkl"
    crafted = b"cnumpy\ndtype\n" + _fragment(("f2", False, True)) + b"R" + _fragment((3, "<", (), "|", 8, 8)) + b"b"
    path.write_bytes(b"\x80\x02" + crafted + b".")
    script = (
        "import numpy as np, sys\n"
        "from forge_replay.dumps import DumpError, safe_load\n"
        "try:\n    safe_load(sys.argv[1])\nexcept DumpError as e:\n    print('refused:', e)\n"
        "print(np.frombuffer(b'\\x00\\x3c' * 2, dtype='f2').tolist())\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "refused: " in result.stdout and "numpy dtype state" in result.stdout
    assert "[1.0, 1.0]" in result.stdout


def test_numpy_arrays_and_scalars_load_exactly(tmp_path):
    blob = {
        "experts": np.arange(24, dtype=np.int32).reshape(4, 3, 2),  # slime's routed experts
        "big_endian": np.array([1, 256, -2], dtype=">i4"),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
        "bytes": np.array([1, 2], dtype=np.uint8),
        "scalar": np.float64(1.5),
        "flag": np.bool_(True),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    path = tmp_path / "np.pt"
    torch.save(blob, path)
    loaded, reference = safe_load(path), torch.load(path, weights_only=False)  # numpy swaps to native order
    for key, want in reference.items():
        got = loaded[key]
        assert np.array_equal(want, blob[key]), key
        assert got.dtype == want.dtype and np.shape(got) == np.shape(want) and np.array_equal(got, want), key
    # a singleton dtype is untouched by a dump that BUILDs a byte order into it
    path.write_bytes(
        b"\x80\x02cnumpy\ndtype\n" + _fragment(("f8", False, False)) + b"R" + _fragment((3, ">", None, None, None, -1, -1, 0))
        + b"b."
    )
    safe_load(path)
    assert np.dtype("f8").byteorder == "=" and np.zeros(1).dtype.str == "<f8"


@pytest.mark.parametrize(
    "spec", ["O8", "U3", "S2", "V8", "M8[s]", "f8,i4"], ids=["object", "str", "bytes", "void", "datetime", "struct"]
)
def test_numpy_non_numeric_dtypes_are_refused(tmp_path, spec):
    path = tmp_path / "np.pkl"
    path.write_bytes(b"\x80\x02cnumpy\ndtype\n" + _fragment((spec, False, True)) + b"R.")
    with pytest.raises(DumpError, match="refused to load: numpy dtype"):
        safe_load(path)


# --- dumps pack -----------------------------------------------------------------------------------


def _pack(*args):
    from forge_replay.cli import main

    return CliRunner().invoke(main, ["dumps", "pack", *args], catch_exceptions=False)


def test_pack_refuses_a_poisoned_dump_and_later_packs_are_exact(tmp_path):
    clean = tmp_path / "source.pt"
    _clean_dump(clean)
    poisoned = tmp_path / "poisoned.pt"
    _poisoned_copy(clean, poisoned, _build_on_global("torch", "FloatStorage", {"dtype": torch.int32}))
    result = _pack(str(poisoned), str(tmp_path / "poisoned.pack"))
    assert result.exit_code == 1 and str(poisoned) in result.stderr
    assert not (tmp_path / "poisoned.pack").exists()
    assert _pack(str(clean), str(tmp_path / "clean.pack")).exit_code == 0
    assert load(tmp_path / "clean.pack").samples[0].rollout_log_probs.tolist() == LOG_PROBS


def test_pack_reads_back_slime_numpy_experts_and_nan(tmp_path):
    """Routed experts as numpy arrays (as slime stores them) and NaN values pack and check exactly."""
    samples = [
        Sample(
            tokens=[1, 2, 3, 4],
            response_length=2,
            reward=float("nan") if i else 0.5,
            rollout_log_probs=[-0.5, float("nan")],
            rollout_routed_experts=np.arange(6, dtype=np.int32).reshape(3, 1, 2) + i,
            metadata={"t": torch.tensor([float("nan"), 1.0])},
        )
        for i in range(2)
    ]
    source = tmp_path / "r.pt"
    save(source, 0, samples)
    result = _pack(str(source), str(tmp_path / "r.pack"))
    assert result.exit_code == 0, result.output
    packed = load(tmp_path / "r.pack").samples
    assert packed[1].rollout_routed_experts.tolist() == (np.arange(6).reshape(3, 1, 2) + 1).tolist()
    assert math.isnan(packed[0].rollout_log_probs[1]) and packed[0].rollout_log_probs[0] == -0.5


@pytest.mark.parametrize(
    "a, b, same",
    [
        ([1, 2.0, "x"], [1, 2.0, "x"], True),
        ([1], [True], False),  # bool is not int
        ([1.0], [1], False),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}, False),  # key order is part of a sample dict
        (float("nan"), float("nan"), True),
        ([1, 2], [1, 2.0], False),  # a token that became a float
        (torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0]), True),
        (torch.tensor([1.0, 2.0]), torch.tensor([1.0, -2.0]), False),
        (torch.tensor([1, 2], dtype=torch.int32), torch.tensor([1, 2]), False),
        (torch.arange(6).reshape(2, 3).t(), torch.arange(6).reshape(2, 3).t().contiguous(), True),
        (np.array([[1, 2]], dtype=np.int32), np.array([[1, 2]], dtype=np.int32), True),
        (np.array([1, 2], dtype=np.int32), np.array([1, 3], dtype=np.int32), False),
        (np.array([1, 2], dtype=np.int32), np.array([1, 2], dtype=np.int64), False),
        ([np.array([1]), 2], [np.array([1]), 2], True),
        ((1, 2), [1, 2], False),
    ],
)
def test_identical(a, b, same):
    assert identical(a, b) is same
    assert identical(b, a) is same


# --- errors, not tracebacks -----------------------------------------------------------------------


@pytest.mark.parametrize("key", ["__class__", "__dict__", "to_dict", "Status", "__init__"])
def test_extra_keys_that_would_replace_sample_attributes_are_refused(tmp_path, key):
    dicts = [Sample(tokens=[1, 2], response_length=1, reward=1.0).to_dict() for _ in range(2)]
    dicts[1][key] = {"tokens": [9]} if key == "__dict__" else 1
    path = tmp_path / "extra.pt"
    torch.save({"rollout_id": 0, "samples": dicts}, path)
    with pytest.raises(SampleError) as info:
        load(path)
    assert info.value.index == 1 and info.value.field == key and str(path) in str(info.value)


def _inspect(path, *args):
    from forge_replay.cli import main

    return CliRunner().invoke(main, ["dumps", "inspect", str(path), *args])


@pytest.mark.parametrize("reward", [10**400, 1e200, float("nan"), "high"], ids=["10**400", "1e200", "nan", "str"])
def test_inspect_summarizes_bad_rewards_and_names_the_problem(tmp_path, reward):
    samples = [Sample(tokens=[1, 2, 3], response_length=1, reward=r, group_index=0) for r in (reward, 0.5, -1e200)]
    path = tmp_path / "r.pt"
    save(path, 0, samples)
    result = _inspect(path, "--json")
    assert result.exit_code == 0 and result.exception is None, result.output
    summary = json.loads(result.stdout)
    assert summary["samples"] == 3 and summary["reward"]["scalar"] is not None
    problem = summary["problem"] or ""
    if reward != 1e200:
        assert "sample 0, field 'reward'" in problem
    text = _inspect(path)
    assert text.exit_code == 0 and "training" in text.stdout


def test_huge_token_ids_pack_and_are_refused_for_training(tmp_path):
    samples = [Sample(tokens=[1, 2**70, 3], response_length=1, reward=1.0), Sample(tokens=[4, 5], response_length=1, reward=0.0)]
    source = tmp_path / "r.pt"
    save(source, 0, samples)
    result = _pack(str(source), str(tmp_path / "r.pack"))
    assert result.exit_code == 0, result.output
    packed = load(tmp_path / "r.pack").samples
    assert packed[0].tokens == [1, 2**70, 3] and packed[1].tokens == [4, 5]
    summary = json.loads(_inspect(tmp_path / "r.pack", "--json").stdout)
    assert "sample 0, field 'tokens': token 1 is 1180591620717411303424" in summary["problem"]


@pytest.mark.parametrize(
    "template, problem",
    [
        ("bad\x00name/r_{rollout_id}.pt", "the path contains a NUL character"),
        ("x" * 300 + "/r_{rollout_id}.pt", "a path component has 300 bytes, file systems allow 255"),
        ("r_{rollout_id}" + "y" * 250 + ".pt", "file systems allow 255"),
    ],
    ids=["nul", "long-directory", "long-with-eval-id"],
)
def test_synth_refuses_impossible_paths_before_writing(tmp_path, template, problem):
    from forge_replay.cli import main
    from forge_replay.dumps.synth import write_synth_dumps

    out = str(tmp_path / template)
    with pytest.raises(OSError) as info:
        write_synth_dumps(out, 2, 1, 1, 1, 1, eval_ids=[1])
    assert problem in str(info.value) and len(str(info.value)) < 400
    assert list(tmp_path.iterdir()) == []  # nothing half written
    if "\x00" not in template:  # argv cannot hold a NUL
        args = ["dumps", "synth", "--out", out, "--num-rollouts", "1", "--prompts", "1", "--samples-per-prompt", "1",
                "--prompt-len", "1", "--response-len", "1"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1 and problem in result.stderr
        assert isinstance(result.exception, SystemExit)  # a clean exit, not an exception
