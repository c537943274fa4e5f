"""Safe loading, corrupt files, the packed format, synth and verify, on real torch.save files."""

from __future__ import annotations

import io
import json
import os
import pickle
import threading
import time
import zipfile

import pytest
import torch
from click.testing import CliRunner

from forge_replay.dumps import DumpError, Sample, SampleError, load, load_raw, safe_load
from forge_replay.dumps.packed import is_packed, open_packed, write_packed
from forge_replay.dumps.prefetch import Prefetcher
from forge_replay.dumps.synth import synth_samples, write_synth_dumps
from forge_replay.dumps.evals import eval_rollout_ids
from forge_replay.dumps.verify import verify_dumps
from tests.unit.test_dumps_slime_format import assert_same, save_debug_rollout_data, slime_samples

# --- the safe loader ------------------------------------------------------------------------------


class _RunsCode:
    """Unpickling this calls ``func(*args)``: the classic pickle code-execution payload."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _malicious_dump(path, payload) -> None:
    samples = [s.to_dict() for s in slime_samples(n_groups=1, group_size=2)]
    samples[1]["metadata"] = {"innocent": payload}
    torch.save({"rollout_id": 0, "samples": samples}, path)


@pytest.mark.parametrize(
    "make_payload, refused",
    [
        (lambda marker: _RunsCode(os.system, f"touch {marker}"), "posix.system"),
        (lambda marker: _RunsCode(exec, f"open({str(marker)!r}, 'w').close()"), "builtins.exec"),
        (lambda marker: _RunsCode(open, str(marker), "w"), "io.open"),
    ],
    ids=["os.system", "exec", "open"],
)
def test_malicious_dump_is_refused_and_nothing_runs(tmp_path, make_payload, refused):
    marker = tmp_path / "pwned"
    path = tmp_path / "rollout_0.pt"
    _malicious_dump(path, make_payload(marker))
    with pytest.raises(DumpError) as info:
        load(path)
    assert refused in str(info.value) and str(path) in str(info.value)
    assert not marker.exists()
    # The reference loader would have run it: proof the payload was real.
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_torch_load_gadget_is_refused(tmp_path):
    """torch.storage._load_from_bytes calls torch.load(weights_only=False): it must not be reachable."""
    marker = tmp_path / "pwned"
    inner = io.BytesIO()
    torch.save(_RunsCode(os.system, f"touch {marker}"), inner)
    path = tmp_path / "gadget.pt"
    _malicious_dump(path, _RunsCode(torch.storage._load_from_bytes, inner.getvalue()))
    with pytest.raises(DumpError, match="torch.storage._load_from_bytes"):
        safe_load(path)
    assert not marker.exists()


def test_storage_types_cannot_be_called(tmp_path):
    path = tmp_path / "alloc.pt"
    _malicious_dump(path, _RunsCode(torch.LongStorage, 10))
    with pytest.raises(DumpError, match="malformed pickle data"):
        safe_load(path)


def test_plain_pickle_with_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "plain.pkl"
    path.write_bytes(pickle.dumps({"rollout_id": 0, "samples": [_RunsCode(os.system, f"touch {marker}")]}))
    with pytest.raises(DumpError, match="posix.system"):
        load(path)
    assert not marker.exists()


def test_safe_load_matches_torch_load_on_tensors_in_lists(tmp_path):
    blob = {
        "rollout_id": 1,
        "samples": [
            {"t": [torch.arange(6, dtype=torch.int32).reshape(2, 3), torch.ones(2, dtype=torch.bfloat16)]},
            {"view": torch.arange(10)[2:7], "f": torch.rand(3, 4).t(), "b": torch.tensor([True, False])},
        ],
    }
    shared = torch.arange(8)
    blob["samples"].append({"a": shared, "b": shared[4:]})  # two views of one storage
    path = tmp_path / "tensors.pt"
    torch.save(blob, path)
    ours, reference = safe_load(path), torch.load(path, weights_only=False)
    assert_same(ours, reference)
    assert ours["samples"][2]["a"].untyped_storage().data_ptr() == ours["samples"][2]["b"].untyped_storage().data_ptr()
    assert ours["samples"][1]["f"].stride() == reference["samples"][1]["f"].stride()


def test_cuda_location_loads_on_cpu(tmp_path, monkeypatch):
    """A dump written from GPU tensors records location "cuda:0"; it must load on a CPU-only machine."""
    monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
    path = tmp_path / "cuda.pt"
    torch.save({"x": torch.arange(4)}, path)
    monkeypatch.undo()
    with zipfile.ZipFile(path) as archive:
        assert b"cuda:0" in archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    loaded = safe_load(path)["x"]
    assert loaded.device.type == "cpu" and loaded.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("cut", [0, 10, 100, -200, -30])
def test_truncated_files_give_a_clear_error(tmp_path, cut):
    path = tmp_path / "rollout_0.pt"
    save_debug_rollout_data(path, 0, slime_samples())
    data = path.read_bytes()
    path.write_bytes(data[:cut] if cut >= 0 else data[:cut])
    with pytest.raises(DumpError) as info:
        load(path)
    assert str(path) in str(info.value)
    assert "Traceback" not in str(info.value) and "\n" not in str(info.value)


def test_missing_storage_record_is_reported(tmp_path):
    path = tmp_path / "t.pt"
    torch.save({"x": torch.arange(4)}, path)
    broken = tmp_path / "broken.pt"
    _rewrite_zip(path, broken, lambda name, data: None if "/data/" in name else data)
    with pytest.raises(DumpError, match="missing from the archive"):
        safe_load(broken)


def _rewrite_zip(src_path, dst_path, change) -> None:
    """Copy a torch zip archive, passing each (name, data) through ``change`` (None drops it)."""
    with zipfile.ZipFile(src_path) as src, zipfile.ZipFile(dst_path, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = change(info.filename, src.read(info))
            if data is not None:
                dst.writestr(info.filename, data)


def test_storage_size_mismatch_is_refused_before_reading(tmp_path):
    path = tmp_path / "t.pt"
    torch.save({"x": torch.arange(4)}, path)
    short = tmp_path / "short.pt"
    _rewrite_zip(path, short, lambda name, data: data[:8] if "/data/" in name else data)
    with pytest.raises(DumpError, match="has 8 bytes, the pickle expects 32"):
        safe_load(short)


def test_big_endian_dump_is_byteswapped(tmp_path):
    path = tmp_path / "t.pt"
    torch.save({"x": torch.tensor([1, 256, -2], dtype=torch.int32)}, path)
    swapped = tmp_path / "big.pt"

    def to_big_endian(name, data):
        if name.endswith("/byteorder"):
            return b"big"
        if "/data/" in name:
            return torch.frombuffer(bytearray(data), dtype=torch.int32).numpy().byteswap().tobytes()
        return data

    _rewrite_zip(path, swapped, to_big_endian)
    assert safe_load(swapped)["x"].tolist() == [1, 256, -2]


def test_packed_rest_section_is_loaded_safely(tmp_path):
    marker = tmp_path / "pwned"
    dicts = [s.to_dict() for s in slime_samples(n_groups=1, group_size=2)]
    dicts[0]["metadata"] = {"x": _RunsCode(os.system, f"touch {marker}")}
    path = tmp_path / "evil.pack"
    write_packed(str(path), 0, dicts)
    with pytest.raises(DumpError, match="posix.system"):
        load(path)
    assert not marker.exists()


def test_garbage_and_wrong_shapes(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"hello world, not a dump")
    with pytest.raises(DumpError, match="not a torch.save zip archive"):
        load(garbage)
    with pytest.raises(DumpError, match="cannot open"):
        load(tmp_path / "absent.pt")
    wrong = tmp_path / "wrong.pt"
    torch.save({"samples": []}, wrong)
    with pytest.raises(DumpError, match=r"missing top-level key\(s\) \['rollout_id'\]"):
        load(wrong)
    torch.save([1, 2], wrong)
    with pytest.raises(DumpError, match="expected a dict"):
        load(wrong)


def test_bad_sample_names_file_index_and_field(tmp_path):
    dicts = [s.to_dict() for s in slime_samples(n_groups=1, group_size=3)]
    dicts[2]["status"] = "exploded"
    path = tmp_path / "bad.pt"
    torch.save({"rollout_id": 0, "samples": dicts}, path)
    with pytest.raises(SampleError) as info:
        load(path)
    message = str(info.value)
    assert str(path) in message and "sample 2" in message and "'status'" in message and "exploded" in message


def test_numpy_arrays_load_but_object_arrays_do_not_smuggle_code(tmp_path):
    import numpy as np

    path = tmp_path / "np.pt"
    torch.save({"rollout_id": 0, "samples": [{"experts": np.arange(6, dtype=np.int32).reshape(3, 2)}]}, path)
    loaded = safe_load(path)["samples"][0]["experts"]
    assert loaded.dtype == np.int32 and loaded.tolist() == [[0, 1], [2, 3], [4, 5]]
    marker = tmp_path / "pwned"
    evil = np.empty(1, dtype=object)
    evil[0] = _RunsCode(os.system, f"touch {marker}")
    torch.save({"x": evil}, path)
    with pytest.raises(DumpError, match="refused to load: numpy dtype 'O8'"):
        safe_load(path)
    assert not marker.exists()


# --- packed format --------------------------------------------------------------------------------


def test_packed_round_trips_exactly_and_loads_transparently(tmp_path):
    slime = slime_samples(dict_rewards=True)
    dicts = [s.to_dict() for s in slime]
    dicts[0]["tokens"] = [True, 1, 2]  # not a plain int list: must stay in the rest section
    path = tmp_path / "rollout_3.pt"
    write_packed(str(path), 3, dicts)
    assert is_packed(str(path))
    blob = load_raw(path)
    assert blob["rollout_id"] == 3
    for got, want in zip(blob["samples"], dicts):
        assert_same(got, want)
        assert list(got) == list(want)
    packed = open_packed(str(path))
    values, offsets, flags = packed.column("tokens")
    assert flags.tolist()[0] == 0 and values.dtype.itemsize == 4  # 50k vocab fits int32
    assert values[offsets[1] : offsets[2]].tolist() == dicts[1]["tokens"]
    assert [s.to_dict()["loss_mask"] for s in load(path).samples] == [d["loss_mask"] for d in dicts]


def test_packed_truncated_is_a_clear_error(tmp_path):
    path = tmp_path / "p.pt"
    write_packed(str(path), 0, [s.to_dict() for s in slime_samples()])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DumpError, match=str(path)):
        load(path)


# --- synth + verify -------------------------------------------------------------------------------


def test_synth_shapes_and_determinism(tmp_path):
    samples = synth_samples(2, prompts=3, samples_per_prompt=4, prompt_len=5, response_len=6, seed=1, vocab_size=17)
    assert len(samples) == 12
    assert all(len(s.tokens) == 11 and s.response_length == 6 for s in samples)
    assert all(0 <= t < 17 for s in samples for t in s.tokens)
    assert [s.group_index for s in samples] == [g for g in range(3) for _ in range(4)]
    assert all(len(s.rollout_log_probs) == 6 for s in samples)
    # an episode each, as the frameworks' data sources number them; the rollout they were made for in metadata
    assert [s.rollout_id for s in samples] == [s.index for s in samples] == list(range(12))
    assert {s.metadata["rollout_id"] for s in samples} == {2}
    again = synth_samples(2, 3, 4, 5, 6, seed=1, vocab_size=17)
    assert [s.to_dict() for s in again] == [s.to_dict() for s in samples]
    assert synth_samples(3, 3, 4, 5, 6, seed=1)[0].tokens != samples[0].tokens
    ragged = synth_samples(0, 4, 4, 2, 30, ragged=True)
    assert len({s.response_length for s in ragged}) > 1
    # the same prompt tokens within a group
    assert samples[0].tokens[:5] == samples[3].tokens[:5]


def test_verify_reports_ok_fallback_missing_unreadable(tmp_path):
    write_synth_dumps(str(tmp_path / "r_{rollout_id}.pt"), 2, 1, 2, 2, 2, eval_ids=[1])
    (tmp_path / "r_3.pt").write_bytes(b"PK\x03\x04 corrupt")
    report = verify_dumps(str(tmp_path), "r_{rollout_id}.pt", 4, eval_interval=2)
    statuses = [(c.kind, c.rollout_id, c.status) for c in report.checks]
    assert statuses == [
        ("train", 0, "ok"),
        ("train", 1, "ok"),
        ("train", 2, "fallback"),
        ("train", 3, "unreadable"),
        ("eval", 1, "ok"),
        ("eval", 3, "missing"),
    ]
    assert not report.ok and len(report.problems) == 1 and len(report.fallbacks) == 1
    assert report.checks[2].used_path == str(tmp_path / "r_0.pt")
    (tmp_path / "r_3.pt").unlink()
    assert verify_dumps(str(tmp_path), "r_{rollout_id}.pt", 4).ok
    strict = verify_dumps(str(tmp_path), "r_{rollout_id}.pt", 4, fallback=False)
    assert not strict.ok and [c.rollout_id for c in strict.problems] == [2, 3]
    assert "fallback to rollout 0 is off" in strict.problems[0].message
    json.dumps(strict.to_dict())


def test_verify_checks_the_eval_before_the_first_step(tmp_path):
    write_synth_dumps(str(tmp_path / "r_{rollout_id}.pt"), 4, 1, 2, 2, 2, eval_ids=[1, 3])
    (tmp_path / "r_eval_1.pt").rename(tmp_path / "r_eval_0.pt")
    evals = lambda **kw: [(c.rollout_id, c.status) for c in verify_dumps(  # noqa: E731
        str(tmp_path), "r_{rollout_id}.pt", 4, eval_interval=2, **kw).checks if c.kind == "eval"]
    assert evals() == [(1, "missing"), (3, "ok")]
    assert evals(eval_before_train=True) == [(0, "ok"), (1, "missing"), (3, "ok")]
    # slime evaluates before training only in a run that starts at rollout 0
    shifted = verify_dumps(str(tmp_path), "r_{rollout_id}.pt", 2, start_rollout_id=2, eval_interval=2,
                           eval_before_train=True)
    assert [c.rollout_id for c in shifted.checks if c.kind == "eval"] == [3]


def test_verify_literal_path_and_bad_inputs(tmp_path):
    write_synth_dumps(str(tmp_path / "only.pt"), 1, 1, 1, 1, 1)
    report = verify_dumps(str(tmp_path), "only.pt", 5)
    assert report.ok and {c.status for c in report.checks} == {"ok"} and len(report.checks) == 5
    with pytest.raises(ValueError, match="literal path"):
        verify_dumps(str(tmp_path), "only.pt", 5, eval_interval=1)
    with pytest.raises(ValueError, match=r"\{x\}"):
        verify_dumps(str(tmp_path), "r_{x}.pt", 1)
    with pytest.raises(ValueError, match="'..'"):
        verify_dumps(str(tmp_path), "../r.pt", 1)


def test_eval_rollout_ids():
    assert eval_rollout_ids(0, 8, 0) == []
    assert eval_rollout_ids(0, 8, 3) == [2, 5]
    assert eval_rollout_ids(4, 4, 2) == [5, 7]


# --- prefetch -------------------------------------------------------------------------------------


def test_prefetcher_loads_next_while_current_trains():
    started = {i: threading.Event() for i in range(3)}

    def loader(rollout_id):
        started[rollout_id].set()
        if rollout_id == 2:
            raise DumpError(f"r_{rollout_id}.pt", "boom")
        time.sleep(0.05)
        return f"rollout-{rollout_id}"

    with Prefetcher(loader, [0, 1, 2]) as prefetcher:
        assert prefetcher.get(0) == "rollout-0"
        # while "training" on rollout 0, rollout 1 is already being loaded in the background
        assert started[1].wait(timeout=10)
        assert not started[2].is_set()
        assert prefetcher.get(1) == "rollout-1"
        with pytest.raises(DumpError, match="boom"):
            prefetcher.get(2)
        assert len(prefetcher.waits) == 3 and prefetcher.wait_seconds >= 0
        with pytest.raises(KeyError):
            prefetcher.get(7)


# --- CLI ------------------------------------------------------------------------------------------


def _cli(*args):
    from forge_replay.cli import main

    return CliRunner().invoke(main, ["dumps", *args], catch_exceptions=False)


def test_cli_synth_inspect_verify_pack(tmp_path):
    template = str(tmp_path / "d" / "rollout_{rollout_id}.pt")
    result = _cli("synth", "--out", template, "--num-rollouts", "2", "--prompts", "2", "--samples-per-prompt", "3",
                  "--prompt-len", "4", "--response-len", "5", "--eval-ids", "1", "--seed", "7")
    assert result.exit_code == 0, result.output
    result = _cli("inspect", str(tmp_path / "d" / "rollout_1.pt"), "--json")
    summary = json.loads(result.stdout)
    assert summary["samples"] == 6 and summary["groups"] == 2 and summary["group_sizes"] == {"3": 2}
    assert summary["response_tokens"]["max"] == 5 and summary["prompt_tokens"]["min"] == 4
    assert summary["optional_fields"]["rollout_log_probs"] == 6 and summary["format"] == "torch"
    ok = _cli("verify", "--path", "rollout_{rollout_id}.pt", "--root", str(tmp_path / "d"), "--num-rollouts", "3",
              "--eval-interval", "2", "--json")
    assert ok.exit_code == 0 and json.loads(ok.stdout)["fallbacks"] == 1
    strict = _cli("verify", "--path", template, "--num-rollouts", "3", "--no-fallback")
    assert strict.exit_code == 1 and "MISSING" in strict.stdout
    usage = _cli("verify", "--path", "r_{oops}.pt", "--num-rollouts", "1")
    assert usage.exit_code == 2
    assert _cli("verify", "--path", template).exit_code == 2
    packed = str(tmp_path / "p" / "rollout_{rollout_id}.pt")
    result = _cli("pack", template, packed, "--num-rollouts", "2", "--eval-ids", "1")
    assert result.exit_code == 0 and "packed 3 dump(s)" in result.stdout
    again = json.loads(_cli("inspect", str(tmp_path / "p" / "rollout_1.pt"), "--json").stdout)
    assert again["format"] == "packed" and {k: v for k, v in again.items() if k not in ("path", "format", "file_bytes")} == {
        k: v for k, v in summary.items() if k not in ("path", "format", "file_bytes")
    }


def test_cli_inspect_slime_dump_and_malicious(tmp_path):
    path = tmp_path / "slime.pt"
    save_debug_rollout_data(path, 4, slime_samples(dict_rewards=True))
    summary = json.loads(_cli("inspect", str(path), "--json").stdout)
    assert summary["rollout_id"] == 4 and summary["samples"] == 12
    assert set(summary["reward"]["by_key"]) == {"accuracy", "format"}
    assert summary["status"] == {"aborted": 4, "completed": 4, "truncated": 4}
    assert summary["extra_fields"] == ["group_id", "trace"] and summary["removed_samples"] == 1
    assert summary["optional_fields"]["rollout_routed_experts"] == 3
    text = _cli("inspect", str(path)).stdout
    assert "reward['accuracy']" in text
    evil = tmp_path / "evil.pt"
    _malicious_dump(evil, _RunsCode(os.system, f"touch {tmp_path / 'pwned'}"))
    result = _cli("inspect", str(evil))
    assert result.exit_code == 1 and "posix.system" in result.stderr
    assert not (tmp_path / "pwned").exists()


def test_sample_from_dict_rejects_non_identifier_extra():
    with pytest.raises(SampleError, match="extra key"):
        Sample.from_dict({"status": "completed", "not valid": 1}, index=3)


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_dumps_take_the_umask_like_open_does(tmp_path, umask):
    """Issue 18: mkstemp made every dump 0600, so runtime pods (uid 10001) could not read dumps another uid wrote
    to a shared PVC. synth, save and pack now write 0666 less the umask, as open() would."""
    import stat

    previous = os.umask(umask)
    try:
        write_synth_dumps(str(tmp_path / "r_{rollout_id}.pt"), 1, 1, 2, 2, 2)
        write_packed(str(tmp_path / "r.pack"), 0, [s.to_dict() for s in slime_samples()])
    finally:
        os.umask(previous)
    for name in ("r_0.pt", "r.pack"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name


def test_inspect_shows_many_sample_rollout_ids_by_count_and_ends(tmp_path):
    # A real dump numbers its episodes: thousands of rollout_ids were printed in full.
    from forge_replay.dumps import save
    from forge_replay.dumps.summary import render_text, summarize

    save(tmp_path / "r.pt", 0, synth_samples(0, prompts=4, samples_per_prompt=4, prompt_len=2, response_len=2))
    assert "sample rollout_ids: 16 distinct, 0 ... 15\n" in render_text(summarize(load(tmp_path / "r.pt")))
    save(tmp_path / "s.pt", 0, synth_samples(0, prompts=1, samples_per_prompt=2, prompt_len=2, response_len=2))
    assert "sample rollout_ids: [0, 1]\n" in render_text(summarize(load(tmp_path / "s.pt")))
