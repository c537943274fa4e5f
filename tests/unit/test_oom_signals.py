"""Each out-of-memory signal the builtin trainer reads, from what the upstream code itself produces (issue 31): torch's
CPU allocator error (a real one), Ray's memory monitor's error (its class, with the message Ray 2.60's raylet wrote),
a memory cgroup's files (this host's own v1 cgroup; v2's files as the kernel documents them)."""

from __future__ import annotations

import pickle

import pytest

torch = pytest.importorskip("torch")

from forge_replay.api.outcome import RanOutOfMemory  # noqa: E402
from forge_replay.runtime.memory_signals import (MemoryCgroup, held_by_others_bytes, memory_cgroup,  # noqa: E402
                                                 this_process_cgroup)
from forge_replay.runtime.trainer.oom import RankWatch, allocator_error  # noqa: E402


def cpu_allocator_error() -> RuntimeError:
    """torch's own: 2**50 bytes is more than any machine's memory and swap, so the allocator refuses at once."""
    try:
        torch.empty(2**50, dtype=torch.uint8)
    except RuntimeError as exc:
        return exc
    raise AssertionError("torch allocated 1 PiB")


def test_torchs_cpu_allocator_error_is_recognized_with_the_bytes_it_names():
    exc = cpu_allocator_error()
    assert type(exc) is RuntimeError  # no type of its own (c10/core/impl/alloc_cpu.cpp): the message is the handle
    assert allocator_error(exc) == ("cpuAllocator", 2**50)
    assert allocator_error(RuntimeError("Expected all tensors to be on the same device")) is None
    assert allocator_error(ValueError("DefaultCPUAllocator")) is None


def test_a_phase_turns_the_allocator_error_into_the_runs_record_which_crosses_processes():
    watch = RankWatch(rank=3)
    with pytest.raises(RanOutOfMemory) as raised:
        with watch.phase("backward", rollout=7):
            torch.empty(2**50, dtype=torch.uint8)
    record = raised.value.record
    assert (record.signal, record.where.component, record.where.rank, record.where.device) == \
        ("cpuAllocator", "trainer", 3, "cpu")
    assert (record.when.rollout, record.when.phase) == (7, "backward") and record.when.at.endswith("Z")
    assert record.how_much.requested_bytes == 2**50 and record.where.pid > 0 and record.where.node
    assert "DefaultCPUAllocator: can't allocate memory" in record.message
    back = pickle.loads(pickle.dumps(raised.value))  # as Ray hands it to the driver (Portable)
    assert type(back) is RanOutOfMemory and back.record == record and str(back) == record.line()
    with pytest.raises(ValueError):  # anything else passes through untouched
        with watch.phase("forward"):
            raise ValueError("not memory")
    with pytest.raises(RanOutOfMemory) as nested:  # an inner phase's record is kept, not wrapped again
        with watch.phase("weightSync"), watch.phase("weightSync"):
            torch.empty(2**50, dtype=torch.uint8)
    assert nested.value.record.when.phase == "weightSync" and nested.value.record.when.rollout == 7


RAY_MONITOR_MESSAGE = (
    # ray.exceptions.OutOfMemoryError's message as Ray 2.60.0's raylet wrote it (its memory monitor, threshold 0.2)
    "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 192.0.2.2, ID: "
    "4dc47e801b46dfaaa60b38205a63ebdf03e789f5dfee4eae83d51c3d) was 4.73GB used / 23.54GB limit (0.200834)\n"
    "OOM kill reason: Memory usage 5079146496B exceeded threshold of 5055212032B (20.0% of 25276059648B limit)\n"
    "Object store memory usage: [- objects spillable: 0\n"
    "Ray killed 1 worker(s) based on the killing policy\n"
    "Selected to kill: (Actor(e7337374e0dd9c240212968e01000000): job ID=01000000, task name=Rank.__init__, "
    "required resources={}, pid=10883, actual memory used=1.55GB, worker ID=228f5e97a753b18008f3a1069918498409f6)\n")


def test_rays_memory_monitor_is_recognized_by_its_type_and_its_figures_read_from_its_message():
    ray = pytest.importorskip("ray")
    from forge_replay.runtime.rank_deaths import death_record, monitor_figures

    error = ray.exceptions.OutOfMemoryError(RAY_MONITOR_MESSAGE)  # exceptions.py:655: not a RayActorError
    assert not isinstance(error, ray.exceptions.RayActorError)
    watched = {"rank": 1, "pid": 10883, "node": "worker-1", "device": "cpu", "cgroup": None}
    record = death_record(1, error, watched, {"rollout": 4, "phase": "backward"})
    assert (record.signal, record.where.rank, record.where.pid, record.where.node) == \
        ("rayMemoryMonitor", 1, 10883, "worker-1")
    assert (record.when.rollout, record.when.phase) == (4, "backward")
    assert (record.how_much.max_usage_bytes, record.how_much.limit_bytes) == (5079146496, 5055212032)
    assert record.message.startswith("1 worker(s) were killed due to the node running low on memory.")
    assert monitor_figures("some other text") == {}


def test_this_hosts_memory_cgroup_is_read_with_its_oom_kill_count():
    cgroup = memory_cgroup()
    if cgroup is None:
        pytest.skip("no memory cgroup to read here")
    figures = cgroup.read()
    assert isinstance(figures.oom_kills, int) and figures.oom_kills >= 0
    assert figures.limit_bytes is None or figures.limit_bytes > 0
    mine = this_process_cgroup()
    assert mine["directory"] == cgroup.directory and mine["oom_kills"] == figures.oom_kills


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v1_and_v2_files_and_a_containers_own_cgroup_at_the_mount_root(tmp_path):
    # v1 (Documentation/admin-guide/cgroup-v1/memory.rst): memory.oom_control's oom_kill line, limit LLONG_MAX paged
    root, proc = tmp_path / "sys", tmp_path / "proc"
    write(proc / "7" / "cgroup", "12:pids:/a\n4:memory:/kubepods/pod1/c1\n0::/\n")
    v1 = root / "memory" / "kubepods" / "pod1" / "c1"
    write(v1 / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    write(v1 / "memory.limit_in_bytes", "3221225472\n")
    write(v1 / "memory.max_usage_in_bytes", "3221225472\n")
    write(root / "memory" / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")
    found = memory_cgroup(7, str(root), str(proc))
    assert found == MemoryCgroup(1, str(v1))
    assert found.read().to_dict() == {"oom_kills": 2, "limit_bytes": 3 * 2**30, "max_usage_bytes": 3 * 2**30}
    # in a container the mount is its own cgroup while /proc says the host's path: the mount root
    write(proc / "8" / "cgroup", "4:memory:/kubepods/pod2/c9\n")
    assert memory_cgroup(8, str(root), str(proc)) == MemoryCgroup(1, str(root / "memory"))
    assert MemoryCgroup(1, str(root / "memory")).read().limit_bytes is None  # unlimited
    # v2 (Documentation/admin-guide/cgroup-v2.rst): memory.events' oom_kill, memory.max, memory.peak
    root2 = tmp_path / "sys2"
    write(root2 / "cgroup.controllers", "cpuset cpu io memory pids\n")
    write(proc / "9" / "cgroup", "0::/job.slice/run\n")
    v2 = root2 / "job.slice" / "run"
    write(v2 / "memory.events", "low 0\nhigh 0\nmax 31\noom 1\noom_kill 1\noom_group_kill 0\n")
    write(v2 / "memory.max", "max\n")
    write(v2 / "memory.peak", "1048576\n")
    found = memory_cgroup(9, str(root2), str(proc))
    assert found == MemoryCgroup(2, str(v2))
    assert found.read().to_dict() == {"oom_kills": 1, "limit_bytes": None, "max_usage_bytes": 1048576}
    assert memory_cgroup(10, str(root2), str(proc)) is None  # no such process


def test_what_else_held_the_device_is_its_used_memory_less_this_process_reserved():
    # torch's observer gives (device_total, device_free); memory_stats this process's reserved bytes
    assert held_by_others_bytes(140 << 30, 1 << 30, 100 << 30) == 39 << 30
    assert held_by_others_bytes(140 << 30, 1 << 30, 140 << 30) == 0  # never negative (figures read apart)
    assert held_by_others_bytes(140 << 30, None, 100 << 30) is None
