"""The memory probe of foreign trainers' Ray workers (backends.probe): what a process records, and the peak read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from forge_replay.backends.probe import PROBE_DIR_ENV, memory_peak


def _probe_in_child(tmp_path, code: str) -> None:
    env = {**os.environ, PROBE_DIR_ENV: str(tmp_path), "FORGE_REPLAY_PROBE_INTERVAL_S": "60"}
    subprocess.run([sys.executable, "-c", "from forge_replay.backends.probe import setup_hook; setup_hook()\n" + code],
                   env=env, check=True, timeout=120)


def test_a_process_without_torch_records_nothing(tmp_path) -> None:
    _probe_in_child(tmp_path, "x = bytearray(50 * 2**20)")
    assert list(tmp_path.glob("probe-*.json")) == [] and memory_peak(str(tmp_path)) is None


def test_a_torch_process_records_its_peak_rss_at_exit(tmp_path) -> None:
    _probe_in_child(tmp_path, "import torch\nt = torch.ones(200 * 2**20, dtype=torch.uint8)\ndel t")
    [path] = tmp_path.glob("probe-*.json")
    figures = json.loads(path.read_text())
    assert figures["source"] == "rss" and figures["peak_allocated_gib"] is None
    assert figures["peak_rss_gib"] >= 200 / 1024  # the tensor was freed before exit: a peak, not the current RSS


def test_the_peak_prefers_cuda_figures_and_names_the_process(tmp_path) -> None:
    rows = [
        {"source": "rss", "peak_rss_gib": 9.0, "peak_allocated_gib": None, "peak_reserved_gib": None, "pid": 1,
         "host": "a", "device": "cpu"},
        {"source": "cuda", "peak_rss_gib": None, "peak_allocated_gib": 70.0, "peak_reserved_gib": 75.0, "pid": 2,
         "host": "b", "device": "cuda:0"},
        {"source": "cuda", "peak_rss_gib": None, "peak_allocated_gib": 71.5, "peak_reserved_gib": 74.0, "pid": 3,
         "host": "b", "device": "cuda:1"},
    ]
    for row in rows:
        (tmp_path / f"probe-{row['host']}-{row['pid']}.json").write_text(json.dumps(row))
    (tmp_path / "probe-c-4.json").write_text("{not json")  # a half-written file is skipped
    peak = memory_peak(str(tmp_path))
    assert (peak["source"], peak["peak_allocated_gib"], peak["pid"], peak["device"]) == ("cuda", 71.5, 3, "cuda:1")
    assert peak["processes"] == 3


def test_nvidia_smi_lines_are_read_per_gpu() -> None:
    from forge_replay.backends.probe import gpu_used_from_smi

    # nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits prints "<index>, <MiB>" per GPU
    assert gpu_used_from_smi("0, 81920\n1, 1024\n\n") == {"0": 80.0, "1": 1.0}


def test_gpu_peaks_only_grow() -> None:
    from forge_replay.backends.probe import merge_peaks

    assert merge_peaks({"0": 70.0, "1": 10.0}, {"0": 60.0, "1": 12.5, "2": 3.0}) == {"0": 70.0, "1": 12.5, "2": 3.0}


def test_device_level_peaks_are_reported_per_host(tmp_path) -> None:
    (tmp_path / "gpus-node-a.json").write_text(json.dumps({"host": "node-a", "source": "nvml",
                                                          "peak_used_gib": {"0": 131.5}}))
    assert memory_peak(str(tmp_path)) == {"gpus": {"node-a": {"source": "nvml", "peak_used_gib": {"0": 131.5}}}}


def test_on_a_node_without_gpus_the_sampler_gives_up_quietly(tmp_path) -> None:
    from forge_replay.backends.probe import _GpuSampler, read_gpus

    sampler = _GpuSampler(str(tmp_path))
    sampler.tick()
    if read_gpus() is None:  # this CPU machine: nothing written, and no further attempts
        assert not sampler.usable and not list(tmp_path.glob("gpus-*.json"))
    else:  # a GPU machine: one figure per GPU
        assert json.loads(next(tmp_path.glob("gpus-*.json")).read_text())["peak_used_gib"]
