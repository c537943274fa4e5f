"""spec.sweep and spec.expect.frontier (issue 32): what a sweep may be, every point checked before anything starts
(naming the point and the field), and the job of one point."""

from __future__ import annotations

import io

import pytest
import yaml

from forge_replay.api import SpecInvalid, parse_job
from forge_replay.api.sweep import PointInvalid, SweepAxis, axis_values, engine_key, grid_points, point_job
from forge_replay.commands.validate import validate_files
from tests.unit.spec_factory import byo_job, debug_job, forge_job

MBT = "trainer.microBatchTokens"
MEM = "rollout.engineArgs.mem-fraction-static"


def problems(doc):
    with pytest.raises(SpecInvalid) as info:
        parse_job(doc)
    return [str(p) for p in info.value.problems]


def assert_refused(doc, path, *fragments):
    found = problems(doc)
    assert any(p.startswith(path + ":") and all(f in p for f in fragments) for p in found), found


def sweep(*axes, **settings):
    return {"axes": list(axes), **settings}


def test_a_sweep_parses_and_its_grid_is_in_order():
    job = parse_job(forge_job(spec__sweep=sweep({"field": MEM, "values": [0.5, 0.7]},
                                                {"field": MBT, "min": 1024, "max": 4096, "factor": 2})))
    s = job.spec.sweep
    assert (s.search, s.headroom, s.rollouts_per_point, s.max_points, s.budget_gib) == ("frontier", 0.05, 2, 32, None)
    assert grid_points(s) == [{MEM: v, MBT: t} for v in (0.5, 0.7) for t in (1024, 2048, 4096)]


def test_geometric_values_are_tidy_and_stop_at_max():
    assert axis_values(SweepAxis(field=MBT, min=1024, max=6000, factor=1.5)) == [1024, 1536, 2304, 3456, 5184]
    assert axis_values(SweepAxis(field=MBT, min=1024, max=4096, factor=2)) == [1024, 2048, 4096]
    assert all(isinstance(v, int) for v in axis_values(SweepAxis(field=MBT, min=1024, max=4096, factor=2)))
    assert axis_values(SweepAxis(field=MEM, min=0.5, max=0.7, factor=1.1)) == [0.5, 0.55, 0.605, 0.6655]


def test_unknown_field_is_refused_naming_it():
    assert_refused(forge_job(spec__sweep=sweep({"field": "trainer.gpusPerNode", "values": [1, 2]})),
                   "spec.sweep.axes[0].field", "'trainer.gpusPerNode' cannot be swept", MBT)


def test_an_invalid_point_is_named_with_its_field():
    doc = forge_job(spec__sweep=sweep({"field": MEM, "values": [0.5]}, {"field": MBT, "values": [0, 1024]}))
    [found] = problems(doc)
    assert found.startswith("spec.sweep: point {" + MEM + ": 0.5, " + MBT + ": 0} is invalid: ")
    assert "spec.trainer.microBatchTokens: input should be greater than or equal to 1" in found


def test_an_engine_argument_sglang_lacks_is_named_at_its_point():
    found = problems(forge_job(spec__sweep=sweep({"field": "rollout.engineArgs.mem-fraction-statik", "values": [1]})))
    assert any("spec.rollout.engineArgs.mem-fraction-statik" in p and "did you mean mem-fraction-static" in p
               for p in found), found


def test_a_problem_of_the_spec_itself_is_not_repeated_for_every_point():
    # colocated engines must fit on the trainer's GPUs: the core rule says so once, not once per point
    doc = forge_job(spec__rollout={"numGpus": 16, "numGpusPerEngine": 2, "colocate": True},
                    spec__sweep=sweep({"field": MBT, "values": [1024, 2048]}))
    found = problems(doc)
    assert any(p.startswith("spec.rollout.numGpus:") for p in found)
    assert not any(p.startswith("spec.sweep") for p in found), found


def test_too_many_points_are_refused_with_the_count():
    listed = sweep({"field": MEM, "values": [0.5, 0.6, 0.7]}, {"field": MBT, "values": [1, 2, 3]}, maxPoints=8)
    assert_refused(forge_job(spec__sweep=listed), "spec.sweep.maxPoints", "3 x 3 = 9 points")
    geometric = sweep({"field": MBT, "min": 1, "max": 2**20, "factor": 2}, maxPoints=16)
    assert_refused(forge_job(spec__sweep=geometric), "spec.sweep.maxPoints", "21 points, more than maxPoints 16")
    too_long = sweep({"field": MBT, "min": 1, "max": 2**30, "factor": 1.01}, maxPoints=1024)
    assert_refused(forge_job(spec__sweep=too_long), "spec.sweep.axes[0]", "at most 64")


@pytest.mark.parametrize("backend", ["slime", "miles"])
def test_slime_and_miles_sweeps_are_refused(backend):
    found = problems(byo_job(backend, spec__sweep=sweep({"field": MBT, "values": [1024]})))
    assert found == [f"spec.sweep: only with the builtin trainer: backend {backend} cannot be swept yet (forge-replay "
                     "cannot replace its trainer between points); run one job per point"]


def test_cpu_needs_a_budget_and_gpus_default_to_the_device():
    cpu = {"nodes": 1, "gpusPerNode": 0}
    assert_refused(debug_job(spec__trainer=cpu, spec__sweep=sweep({"field": MBT, "values": [1024]})),
                   "spec.sweep.budgetGiB", "required on CPU")
    assert parse_job(debug_job(spec__trainer=cpu, spec__sweep=sweep({"field": MBT, "values": [1024]},
                                                                    budgetGiB=2))).spec.sweep.budget_gib == 2
    assert parse_job(debug_job(spec__sweep=sweep({"field": MBT, "values": [1024]}))).spec.sweep.budget_gib is None


@pytest.mark.parametrize("axis, fragment", [
    ({"field": MBT, "values": [1024], "min": 1, "max": 2, "factor": 2}, "not both"),
    ({"field": MBT, "min": 1024, "max": 4096}, "all of min, max and factor"),
    ({"field": MBT}, "all of min, max and factor"),
    ({"field": MBT, "min": 4096, "max": 1024, "factor": 2}, "max 1024 is below min 4096"),
    ({"field": MBT, "values": [2048, 1024]}, "strictly increasing"),
    ({"field": MBT, "values": [1024, 1024]}, "strictly increasing"),
])
def test_an_axis_has_one_well_formed_form(axis, fragment):
    assert_refused(forge_job(spec__sweep=sweep(axis)), "spec.sweep.axes[0]", fragment)


@pytest.mark.parametrize("settings, path", [
    ({"headroom": 1}, "spec.sweep.headroom"), ({"rolloutsPerPoint": 1}, "spec.sweep.rolloutsPerPoint"),
    ({"maxPoints": 0}, "spec.sweep.maxPoints"), ({"search": "random"}, "spec.sweep.search"),
    ({"budgetGiB": 0}, "spec.sweep.budgetGiB"), ({"axes": []}, "spec.sweep.axes"),
])
def test_settings_bounds(settings, path):
    assert_refused(forge_job(spec__sweep={"axes": [{"field": MBT, "values": [1024]}], **settings}), path)


def test_a_field_is_swept_once_and_engine_axes_need_engines():
    assert_refused(forge_job(spec__sweep=sweep({"field": MBT, "values": [1]}, {"field": MBT, "values": [2]})),
                   "spec.sweep.axes", "swept by more than one axis")
    assert_refused(debug_job(spec__sweep=sweep({"field": MEM, "values": [0.5]})), "spec.sweep.axes[0].field",
                   "needs spec.rollout")


def test_point_job_sets_the_values_and_is_a_plain_single_job():
    doc = forge_job(spec__sweep=sweep({"field": MEM, "values": [0.5, 0.75]}, {"field": MBT, "values": [1024, 2048]},
                                      rolloutsPerPoint=3),
                    spec__expect={"maxPeakMemoryGiB": 100, "frontier": [{"at": {MEM: 0.5}, "fits": {MBT: 1024}}]})
    job = parse_job(doc)
    point = point_job(job, {MEM: 0.75, MBT: 2048.0})
    assert point.spec.rollout.engine_args == {"mem-fraction-static": "0.75"}
    assert point.spec.trainer.micro_batch_tokens == 2048 and point.spec.replay.num_rollouts == 3
    assert point.spec.sweep is None and point.spec.expect.frontier is None
    assert point.spec.expect.max_peak_memory_gib == 100 and job.spec.trainer.micro_batch_tokens == 65536
    assert point_job(job.spec, {MBT: 4096}).trainer.micro_batch_tokens == 4096  # a spec works too
    only_frontier = parse_job(forge_job(spec__sweep=sweep({"field": MBT, "values": [1024]}),
                                        spec__expect={"frontier": [{"fits": {MBT: 1024}}]}))
    assert point_job(only_frontier, {MBT: 1024}).spec.expect is None
    with pytest.raises(PointInvalid) as info:
        point_job(job, {MEM: 0.5, MBT: 1.5})
    assert info.value.values == {MEM: 0.5, MBT: 1.5}
    assert str(info.value).startswith("spec.trainer.microBatchTokens: at sweep point {" + MEM + ": 0.5, " + MBT)


def test_engine_key_is_the_engine_part_of_a_point():
    assert engine_key({MBT: 1024, MEM: 0.5, "rollout.engineArgs.context-length": 4096}) == (
        ("rollout.engineArgs.context-length", 4096), (MEM, 0.5))
    assert engine_key({MBT: 1024}) == engine_key({MBT: 2048}) == ()


def test_expect_frontier_needs_a_sweep_and_names_its_axes():
    two = sweep({"field": MEM, "values": [0.5, 0.7]}, {"field": MBT, "values": [1024, 2048]})
    ok = {"at": {MEM: 0.7}, "fits": {MBT: 2048}}
    assert parse_job(forge_job(spec__sweep=two, spec__expect={"frontier": [ok]})).spec.expect.frontier[0].fits == {
        MBT: 2048}
    assert_refused(forge_job(spec__expect={"frontier": [ok]}), "spec.expect.frontier", "needs spec.sweep")
    assert_refused(forge_job(spec__sweep=two, spec__expect={"frontier": [{"at": {MBT: 1024}, "fits": {MEM: 0.5}}]}),
                   "spec.expect.frontier[0].fits", f"last axis, {MBT}")
    assert_refused(forge_job(spec__sweep=two, spec__expect={"frontier": [{"fits": {MBT: 1024}}]}),
                   "spec.expect.frontier[0].at", MEM)
    assert_refused(forge_job(spec__sweep=two, spec__expect={"frontier": [{"at": {MEM: 0.6}, "fits": {MBT: 1024}}]}),
                   f"spec.expect.frontier[0].at.{MEM}", "0.6 is not a value of that axis (0.5, 0.7)")


def test_validate_names_the_point_and_the_field(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(forge_job(spec__sweep=sweep({"field": MBT, "values": [0, 1024]}))))
    out = io.StringIO()
    assert validate_files([str(path)], out) == 1
    assert "point {trainer.microBatchTokens: 0}" in out.getvalue()
    assert "spec.trainer.microBatchTokens" in out.getvalue()
