"""Dumps as miles and slime write them today (issue 14): miles' adapter / reward_spec dataclasses, numpy MoE
replay arrays, sets and tuples in metadata, the top-level metadata; slime VLM images and tensors; builtins and
tensor dtypes protocol 2 writes as globals. All load with nothing executed, keep their data, and pack
round-trips them. The writers and classes are the stand-ins of tests/doubles/upstream_types.py."""

from __future__ import annotations

import io
import pickle
import zipfile

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from forge_replay.dumps import DumpError, load, load_raw, safe_load
from forge_replay.dumps.inert import DumpImage, DumpRecord, revive
from forge_replay.dumps.packed import identical, load_packed_raw, write_packed
from forge_replay.dumps.refusal import Refused
from forge_replay.dumps.summary import render_text, summarize
from tests.doubles import upstream_types as up


@pytest.fixture(autouse=True)
def _no_calls():
    up.CALLS.clear()
    yield


def _miles(tmp_path, n=6, metadata=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "rollout_2.pt"
    with up.upstream_modules():
        dicts = up.miles_sample_dicts(n)
        up.miles_dump(path, 2, dicts, metadata)
    up.CALLS.clear()  # constructing the dataclasses above ran __post_init__; loading must run nothing
    return path, dicts


def _vlm(tmp_path, n=4):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "rollout_0.pt"
    with up.upstream_modules():
        dicts = up.vlm_sample_dicts(n)
        up.vlm_dump(path, 0, dicts)
    return path, dicts


def test_a_miles_dump_loads_with_its_dataclasses_arrays_sets_and_metadata(tmp_path):
    meta = {"weight_version": 3, "adapters": ("lora-0", "lora-1"), "seen": {1, 2}}
    path, dicts = _miles(tmp_path, metadata=meta)
    dump = load(path)
    assert up.CALLS == []  # nothing of the upstream classes ran
    assert dump.metadata == meta and isinstance(dump.metadata["adapters"], tuple)
    assert load_raw(path)["metadata"] == meta and list(load_raw(path)) == ["rollout_id", "metadata", "samples"]
    for sample, source in zip(dump.samples, dicts):
        adapter = sample.adapter
        assert type(adapter) is DumpRecord and adapter.upstream_class == "miles.utils.types.AdapterRef"
        assert (adapter.name, adapter.slot) == (source["adapter"].name, source["adapter"].slot)
        assert adapter.fields == {"name": source["adapter"].name, "slot": source["adapter"].slot}
        if source["reward_spec"] is None:
            assert sample.reward_spec is None
        else:
            assert sample.reward_spec.fields == {"rm_type": "math", "custom_rm_path": None}
        for name in ("rollout_routed_experts", "rollout_indexer_topk"):
            value = getattr(sample, name)
            assert isinstance(value, np.ndarray) and value.dtype == np.int32 and np.array_equal(value, source[name])
        assert sample.metadata["tools"] == {"search", "python"} and type(sample.metadata["tools"]) is set
        assert type(sample.metadata["span"]) is tuple
        assert set(source) <= set(sample.to_dict())  # miles' own fields (adapter, ...) kept as extras
    assert up.CALLS == []


def test_a_miles_record_is_inert_until_revived(tmp_path):
    path, dicts = _miles(tmp_path, n=2)
    adapter = load(path).samples[1].adapter
    assert adapter == load(path).samples[1].adapter and len({adapter, load(path).samples[1].adapter}) == 1
    assert repr(adapter) == "AdapterRef(name='lora-1', slot=1)"
    with pytest.raises(Refused, match="read-only"):
        adapter.slot = 5
    assert adapter.slot == 1
    with up.upstream_modules():
        real = adapter.revive()  # on request, where miles is importable
        revived = revive(load(path).samples[1].to_dict())
    assert type(real) is up.AdapterRef and real == dicts[1]["adapter"]
    assert type(revived["adapter"]) is up.AdapterRef and revived["reward_spec"] == dicts[1]["reward_spec"]
    assert revived["metadata"]["tools"] == {"search", "python"} and revived["tokens"] == dicts[1]["tokens"]


def test_a_slime_vlm_dump_loads_images_and_tensors(tmp_path):
    path, dicts = _vlm(tmp_path)
    dump = load(path)
    assert up.CALLS == []
    for sample, source in zip(dump.samples, dicts):
        image, expected = sample.multimodal_inputs["images"][0], source["multimodal_inputs"]["images"][0]
        assert type(image) is DumpImage
        assert (image.mode, image.size, image.data) == (expected.mode, expected.size, expected.data)
        assert sample.prompt[0]["content"][0]["image"] == image  # the same image, in the prompt too
        train = sample.multimodal_train_inputs
        assert train["pixel_values"].dtype == torch.bfloat16
        assert torch.equal(train["pixel_values"], source["multimodal_train_inputs"]["pixel_values"])
        assert train["image_grid_thw"].dtype == torch.int64
        assert train["image_grid_thw"].tolist() == source["multimodal_train_inputs"]["image_grid_thw"].tolist()
    classes = [s.multimodal_inputs["images"][0].upstream_class for s in dump.samples]
    assert classes == ["PIL.Image.Image", "PIL.PngImagePlugin.PngImageFile"] * 2
    assert dump.samples[1].multimodal_inputs["images"][0].info == {"dpi": (72.0, 72.0)}
    first = dump.samples[0]
    assert first.prompt[0]["content"][0]["image"] is first.multimodal_inputs["images"][0]  # one object, as pickled


def test_the_stand_in_pickles_as_pillow_does(tmp_path):
    """The stream our stand-in writes is Pillow's, byte for byte; and an inert image becomes a real one again."""
    Image = pytest.importorskip("PIL.Image")
    real = Image.new("RGB", (5, 3))
    real.putdata([(i, 2 * i, 3 * i) for i in range(15)])
    pixels = real.tobytes()
    with up.upstream_modules():
        ours = pickle.dumps(up.Image("RGB", (5, 3), pixels), protocol=2)
    assert ours == pickle.dumps(real, protocol=2)
    buffer = io.BytesIO()
    torch.save({"image": real, "palette": real.convert("P")}, buffer)
    path = tmp_path / "pil.pt"
    path.write_bytes(buffer.getvalue())
    loaded = safe_load(path)
    back = loaded["image"].to_pil()
    assert revive(loaded)["image"].tobytes() == real.tobytes()
    assert isinstance(back, Image.Image) and back.tobytes() == real.tobytes() and back.mode == "RGB"
    paletted = loaded["palette"]
    assert paletted.mode == "P" and paletted.palette and paletted.to_pil().convert("RGB").tobytes() == (
        real.convert("P").convert("RGB").tobytes()
    )


BUILTINS = {
    "set": {3, 1, 2},
    "frozenset": frozenset({"a", ("t", 1)}),
    "complex": 1.5 - 2j,
    "bytearray": bytearray(b"\x00\xffabc"),
    "nested": {frozenset({1}), 2},
    "empty": (set(), bytearray()),
}
DTYPES = [torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16]


def test_builtins_and_v3_tensor_dtypes_load_as_torch_load_reads_them(tmp_path):
    tensors = {str(d): torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]).to(d) for d in DTYPES}
    tensors["view"] = torch.tensor([1, 2, 3, 40000, 5]).to(torch.uint16)[1:4]  # an offset into the storage
    path = tmp_path / "mixed.pt"
    torch.save({**BUILTINS, **tensors}, path)
    reference = torch.load(path, weights_only=False)  # our own file: the reference reader may run here
    loaded = safe_load(path)
    for key in BUILTINS:
        assert type(loaded[key]) is type(reference[key]) and loaded[key] == reference[key], key
    for key, value in tensors.items():
        got = loaded[key]
        assert got.dtype == value.dtype and got.shape == value.shape, key
        assert torch.equal(got.view(torch.uint8), reference[key].contiguous().view(torch.uint8)), key


def _swap_in_pickle(path, old: bytes, new: bytes) -> None:
    with zipfile.ZipFile(path) as src:
        entries = [(info.filename, src.read(info)) for info in src.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as dst:
        for name, data in entries:
            if name.endswith("data.pkl"):
                assert old in data
                data = data.replace(old, new)
            dst.writestr(name, data)


def test_classes_outside_the_allowlist_are_refused_with_their_name(tmp_path):
    path, _ = _miles(tmp_path, n=1)
    _swap_in_pickle(path, b"miles.utils.types\nAdapterRef\n", b"miles.utils.types\nParamInfo\n")
    with pytest.raises(DumpError, match=r"global miles\.utils\.types\.ParamInfo") as info:
        load(path)
    assert "nothing was executed" in str(info.value) and up.CALLS == []


@pytest.mark.parametrize(
    "value, problem",
    [
        ("bytearray-size", "only bytearray(bytes)"),
        ("set-of-string", "only set(list)"),
        ("complex-huge", "does not fit a float"),
        ("image-short", "pixel bytes"),
        ("record-args", "only the pickled field state"),
        ("record-list-state", "expected a dict of field values"),
    ],
)
def test_malformed_upstream_records_are_refused(tmp_path, value, problem):
    """Each stand-in checks what a pickle hands it: sizes, argument shapes, pixel counts, state shapes."""
    streams = {
        "bytearray-size": b"c__builtin__\nbytearray\nJ\x00\xca\x9a;\x85R.",
        "set-of-string": b"c__builtin__\nset\nX\x03\x00\x00\x00abc\x85R.",
        "complex-huge": b"c__builtin__\ncomplex\n\x8a\x82" + b"\xff" * 129 + b"\x7f\x85R.",
        "image-short": b"cPIL.Image\nImage\n)\x81](}X\x03\x00\x00\x00RGBK\x02K\x02\x86NC\x03abceb.",
        "record-args": b"cmiles.utils.types\nAdapterRef\nX\x01\x00\x00\x00a\x85\x81.",
        "record-list-state": b"cmiles.utils.types\nAdapterRef\n)\x81]b.",
    }
    path = tmp_path / "bad.pkl"
    path.write_bytes(b"\x80\x02" + streams[value])
    with pytest.raises(DumpError, match="refused to load") as info:
        safe_load(path)
    assert problem in str(info.value)


def test_a_v3_tensor_may_not_reach_past_its_storage(tmp_path):
    path = tmp_path / "t.pt"
    torch.save(torch.tensor([1, 2, 3]).to(torch.uint16), path)
    _swap_in_pickle(path, b"K\x00K\x03\x85", b"K\x00K\x04\x85")  # size 4 over a 3-element storage
    with pytest.raises(DumpError, match="storage of 3"):
        safe_load(path)


def test_packed_format_round_trips_miles_and_vlm_dumps(tmp_path):
    miles_path, _ = _miles(tmp_path / "m", metadata={"weight_version": 3, "tags": {"a"}})
    vlm_path, _ = _vlm(tmp_path / "v")
    for source in (miles_path, vlm_path):
        blob = load_raw(source)
        out = str(source) + ".pack"
        write_packed(out, blob["rollout_id"], blob["samples"], blob.get("metadata"))
        assert identical(load_packed_raw(out), load_raw(source))
    assert up.CALLS == []


def test_dumps_pack_keeps_the_metadata_and_every_field(tmp_path):
    from forge_replay.cli import main

    miles_path, _ = _miles(tmp_path / "m", metadata={"weight_version": 3, "tags": {"a"}})
    vlm_path, _ = _vlm(tmp_path / "v")
    for source in (miles_path, vlm_path):
        out = source.parent / "packed" / source.name
        result = CliRunner().invoke(main, ["dumps", "pack", str(source), str(out)])
        assert result.exit_code == 0, result.output
        assert identical(load_packed_raw(str(out)), load_raw(source))
        assert identical(load_raw(out), load_raw(source))
    assert load(miles_path.parent / "packed" / miles_path.name).metadata == {"weight_version": 3, "tags": {"a"}}
    assert up.CALLS == []


def test_write_packed_keeps_metadata_only_when_given(tmp_path):
    with_meta, without = tmp_path / "a.pack", tmp_path / "b.pack"
    write_packed(str(with_meta), 1, [{"tokens": [1, 2]}], {"k": (1, 2)})
    write_packed(str(without), 1, [{"tokens": [1, 2]}])
    assert list(load_packed_raw(str(with_meta))) == ["rollout_id", "metadata", "samples"]
    assert load_packed_raw(str(with_meta))["metadata"] == {"k": (1, 2)}
    assert list(load_packed_raw(str(without))) == ["rollout_id", "samples"]


def test_a_bad_top_level_metadata_is_refused(tmp_path):
    path = tmp_path / "r.pt"
    torch.save({"rollout_id": 0, "metadata": [1], "samples": []}, path)
    with pytest.raises(DumpError, match="'metadata' must be a dict"):
        load(path)


def test_inspect_summarizes_miles_and_vlm_dumps(tmp_path):
    path, _ = _miles(tmp_path)
    summary = summarize(load(path))
    assert summary["problem"] is None and summary["samples"] == 6
    assert {"adapter", "reward_spec", "rollout_indexer_topk"} <= set(summary["extra_fields"])
    vlm, _ = _vlm(tmp_path)
    summary = summarize(load(vlm))
    assert summary["optional_fields"]["multimodal_inputs"] == 4 and summary["problem"] is None
    assert summary["multimodal_samples"] == 4
    assert "multimodal inputs: 4 sample(s) (the builtin trainer trains their text tokens only)" in render_text(summary)
    assert summarize(load(path))["multimodal_samples"] == 0 and "multimodal" not in render_text(summarize(load(path)))



def test_a_vlm_sample_says_it_has_multimodal_inputs(tmp_path):
    path, _ = _vlm(tmp_path)
    samples = load(path).samples
    assert all(s.has_multimodal_inputs() for s in samples)
    samples[0].multimodal_inputs = {"images": None, "videos": None}  # a text-only sample of a VLM run
    samples[0].multimodal_train_inputs = None
    samples[1].multimodal_inputs = {"images": [], "videos": None}
    assert [s.has_multimodal_inputs() for s in samples] == [False, True, True, True]
    samples[1].multimodal_train_inputs = {"pixel_values": torch.zeros(0, 4)}
    assert not samples[1].has_multimodal_inputs()
