"""The replay training job on a real local Ray (CPU, a tiny Llama): one Ray for the whole module.

Covers: debug replay end to end with losses that fall when the same data repeats (a literal path
reused for every rollout), the rollout-0 fallback counted in the report and progress, a missing
eval dump reported, the debug-mode rollout manager constructing nothing rollout-side, a 2-rank
FSDP run equal to a 1-rank run, the CLI's errors for a missing dump and an inconsistent sample, a rank's
out-of-memory in forward as the run's answer, and a SIGKILLed rank that is no out-of-memory.
"""

from __future__ import annotations

import json
import math
import os

import pytest

ray = pytest.importorskip("ray")

from click.testing import CliRunner  # noqa: E402

from forge_replay.api import parse_job  # noqa: E402
from forge_replay.api.runtime_config import RuntimeConfig  # noqa: E402
from forge_replay.dumps import save  # noqa: E402
from forge_replay.dumps.synth import synth_samples  # noqa: E402
from forge_replay.commands.run import run as run_command  # noqa: E402
from forge_replay.runtime.driver import ReplayRunError, run_job  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("local_ray")]

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
    "max_position_embeddings": 256,
}


def job_doc(name, path, num_rollouts, *, nodes=1, verify=True, fallback=True, eval_interval=0, lr=1e-3,
            micro_batch_tokens=4096, dtype="float32", checkpointing=False, ft=None):
    spec = {
        "replay": {"mode": "debug", "dumps": {"claimName": "dumps", "path": path, "fallbackToFirst": fallback},
                   "numRollouts": num_rollouts, "verify": verify, "evalInterval": eval_interval},
        "model": {"config": TINY_LLAMA},
        "trainer": {"nodes": nodes, "gpusPerNode": 0, "microBatchTokens": micro_batch_tokens, "dtype": dtype,
                    "learningRate": lr, "gradientCheckpointing": checkpointing, "seed": 7},
    }
    if ft:
        spec["faultTolerance"] = ft
    return {"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob", "metadata": {"name": name},
            "spec": spec}


def config_for(doc, root, results) -> RuntimeConfig:
    return RuntimeConfig(job=parse_job(doc), dumps_root=str(root), results_dir=str(results), model_root=None)


def write_dump(path, rollout_id, *, ragged=False, prompts=2, samples_per_prompt=4, seed=0):
    samples = synth_samples(rollout_id, prompts, samples_per_prompt, prompt_len=8, response_len=24, seed=seed,
                            vocab_size=128, ragged=ragged)
    save(path, rollout_id, samples)
    return samples


def test_literal_path_is_replayed_every_rollout_and_the_loss_falls(tmp_path):
    write_dump(tmp_path / "dumps" / "fixed.pt", 0)
    report = run_job(config_for(job_doc("literal", "fixed.pt", 4, lr=3e-2), tmp_path / "dumps", tmp_path / "out"),
                     show_progress=False)
    losses = [r.loss for r in report.rollouts]
    assert [r.rollout_id for r in report.rollouts] == [0, 1, 2, 3]
    assert {r.dump_path for r in report.rollouts} == {str(tmp_path / "dumps" / "fixed.pt")}
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.01, losses
    assert report.summary["fallbacks"] == 0
    for record in report.rollouts:
        (mem,) = record.memory
        assert mem["device"] == "cpu" and mem["peak_rss_gib"] > 0.05
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [r["loss"] for r in saved["rollouts"]] == pytest.approx(losses)
    assert (tmp_path / "out" / "memory.png").stat().st_size > 1000
    progress = json.loads((tmp_path / "out" / "progress.json").read_text())
    assert progress["completed"] == 4 and progress["total"] == 4 and progress["memory"]["rank"] == 0


def test_fallback_is_counted_and_a_missing_eval_dump_is_reported(tmp_path):
    root = tmp_path / "dumps"
    write_dump(root / "rollout_0.pt", 0)
    write_dump(root / "rollout_1.pt", 1)
    write_dump(root / "rollout_eval_1.pt", 1)  # eval after rollout 1; eval_3 is missing
    report = run_job(config_for(job_doc("fallback", "rollout_{rollout_id}.pt", 4, eval_interval=2), root,
                                tmp_path / "out"), show_progress=False)
    assert [r.fallback_used for r in report.rollouts] == [False, False, True, True]
    assert report.rollouts[3].dump_path == str(root / "rollout_0.pt")
    assert report.summary["fallbacks"] == 2 and report.summary["fallback_rollout_ids"] == [2, 3]
    assert [(e.eval_id, e.missing, e.num_samples) for e in report.evals] == [(1, False, 8), (3, True, 0)]
    progress = json.loads((tmp_path / "out" / "progress.json").read_text())
    assert progress["fallbacks"] == 2


def test_eval_before_train_replays_eval_0_first_and_debug_mode_says_it_evaluates(tmp_path, caplog):
    """spec.replay.evalBeforeTrain: eval 0 (the eval_0 dump) before the first step, as slime; debug mode
    evaluates only because evalInterval asks, and says so."""
    root = tmp_path / "dumps"
    write_dump(root / "rollout_0.pt", 0)
    write_dump(root / "rollout_1.pt", 1)
    write_dump(root / "rollout_eval_0.pt", 0, prompts=1)
    write_dump(root / "rollout_eval_1.pt", 1)
    doc = job_doc("before", "rollout_{rollout_id}.pt", 2, eval_interval=2)
    doc["spec"]["replay"]["evalBeforeTrain"] = True
    with caplog.at_level("INFO", logger="forge_replay.runtime.driver"):
        report = run_job(config_for(doc, root, tmp_path / "out"), show_progress=False)
    assert [(e.eval_id, e.after_rollout_id, e.num_samples, e.skipped) for e in report.evals] == [
        (0, None, 4, ""), (1, 1, 8, "")]
    assert report.evals[0].path == str(root / "rollout_eval_0.pt")
    assert "debug mode evaluates because evalInterval is 2" in caplog.text
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["evals"][0]["after_rollout_id"] is None and saved["summary"]["evals_skipped"] == 0


def test_data_slime_accepts_is_counted_in_the_report_and_progress(tmp_path):
    """An all-zero loss mask and a dump whose rollout_id is not its file's train (slime accepts both) and are
    counted per rollout, in the summary and in progress.json (issue 19)."""
    root = tmp_path / "dumps"
    samples = write_dump(root / "rollout_0.pt", 0)
    samples[2].loss_mask = [0] * samples[2].response_length
    samples[5].loss_mask = [0] * samples[5].response_length
    save(root / "rollout_0.pt", 0, samples)
    write_dump(root / "rollout_1.pt", 0, seed=1)  # rollout 1's file holds rollout_id 0
    write_dump(root / "rollout_2.pt", 2, seed=2)
    doc = job_doc("slime-accepts", "rollout_{rollout_id}.pt", 4)  # rollout 3 falls back to rollout 0's file
    report = run_job(config_for(doc, root, tmp_path / "out"), show_progress=False)
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [r["masked_out_samples"] for r in saved["rollouts"]] == [2, 0, 0, 2]
    assert [r["rollout_id_mismatch"] for r in saved["rollouts"]] == [
        None, "the dump's rollout_id is 0, its file stands for rollout 1", None, None]
    summary = saved["summary"]
    assert summary["masked_out_samples"] == 4 and summary["rollout_id_mismatches"] == 1
    assert summary["rollout_id_mismatch_rollout_ids"] == [1] and summary["fallback_rollout_ids"] == [3]
    assert saved["rollouts"][0]["loss_tokens"] == 6 * samples[0].response_length  # the masked samples add none
    progress = json.loads((tmp_path / "out" / "progress.json").read_text())
    assert progress["maskedOutSamples"] == 4 and progress["rolloutIdMismatches"] == 1
    assert report.summary == summary


def test_debug_mode_constructs_no_engine_router_or_monitor(tmp_path):
    from forge_replay.runtime.rollout_manager import RolloutManager

    write_dump(tmp_path / "rollout_0.pt", 0)
    job = parse_job(job_doc("gate", "rollout_{rollout_id}.pt", 2,
                            ft={"enabled": True, "components": ["train"]}))
    assert job.spec.rollout is None
    manager = ray.remote(RolloutManager).options(num_cpus=0).remote(job, str(tmp_path), world_size=2,
                                                                     use_object_store=False)
    try:
        assert ray.get(manager.start.remote()) == ["replay_source"]
        plan = ray.get(manager.get_plan.remote())
        assert not (plan.start_engines or plan.health_monitors
                    or plan.fault_injection or plan.recover_before_weight_sync or plan.eval_fleet_self_probe)
        batch = ray.get(manager.get_rollout.remote(0))
        assert batch.num_samples == 8 and len(batch.rank_batches) == 2
        assert ray.get(manager.after_train_step.remote(0, None)) is None
        ray.get(manager.before_eval.remote(0))
        assert ray.get(manager.get_construction_log.remote()) == ["replay_source"]
    finally:
        ray.get(manager.shutdown.remote())
        ray.kill(manager)


def test_two_fsdp_ranks_train_like_one(tmp_path):
    root = tmp_path / "dumps"
    for n in range(3):  # 9 ragged samples per rollout: an uneven split, several micro-batches, a dummy one
        write_dump(root / f"rollout_{n}.pt", n, ragged=True, prompts=3, samples_per_prompt=3, seed=n)
    runs = {}
    for nodes in (1, 2):
        doc = job_doc(f"ranks{nodes}", "rollout_{rollout_id}.pt", 3, nodes=nodes, lr=1e-2, micro_batch_tokens=64,
                      checkpointing=True)
        runs[nodes] = run_job(config_for(doc, root, tmp_path / f"out{nodes}"), show_progress=False)
    one, two = runs[1].rollouts, runs[2].rollouts
    assert runs[2].world_size == 2 and all(len(r.memory) == 2 for r in two)
    assert max(r.micro_batches for r in two) >= 2
    assert [r.loss for r in two] == pytest.approx([r.loss for r in one], rel=1e-4, abs=1e-6)
    assert [r.grad_norm for r in two] == pytest.approx([r.grad_norm for r in one], rel=1e-4)
    assert [r.tokens for r in two] == [r.tokens for r in one]


def write_job_file(tmp_path, doc):
    import yaml

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_cli_missing_dump_names_the_rollout_and_the_path(tmp_path):
    root = tmp_path / "dumps"
    write_dump(root / "rollout_0.pt", 0)
    missing = os.path.join(str(root), "rollout_1.pt")
    # verify on: refused before Ray or any trainer starts
    doc = job_doc("missing", "rollout_{rollout_id}.pt", 2, fallback=False)
    result = CliRunner().invoke(run_command, [write_job_file(tmp_path, doc), "--dumps-root", str(root),
                                              "--results", str(tmp_path / "out"), "--no-progress"])
    assert result.exit_code == 2, result.output  # verify refused the dumps before Ray: unusable input
    assert "train 1" in result.output and missing in result.output
    # verify off: the rollout manager meets the missing file at rollout 1 and the run stops there
    doc = job_doc("missing", "rollout_{rollout_id}.pt", 2, fallback=False, verify=False)
    with pytest.raises(ReplayRunError, match=rf"rollout 1: dump {missing} does not exist"):
        run_job(config_for(doc, root, tmp_path / "out2"), show_progress=False)
    assert json.loads((tmp_path / "out2" / "report.json").read_text())["summary"]["rollouts"] == 1


def test_cli_inconsistent_sample_names_the_index_and_field(tmp_path):
    root = tmp_path / "dumps"
    samples = write_dump(root / "bad.pt", 0)
    samples[5].loss_mask = [1] * (samples[5].response_length - 3)
    save(root / "bad.pt", 0, samples)
    doc = job_doc("badsample", "bad.pt", 1, verify=False)
    result = CliRunner().invoke(run_command, [write_job_file(tmp_path, doc), "--dumps-root", str(root),
                                              "--results", str(tmp_path / "out"), "--no-progress"])
    assert result.exit_code == 1, result.output
    assert "sample 5" in result.output and "loss_mask" in result.output
    assert ray.is_initialized()  # the CLI did not shut down a Ray it did not start


def test_entrypoint_runs_a_runtime_config_file_like_the_operator_mounts(tmp_path):
    from forge_replay.runtime.__main__ import main

    from forge_replay.dumps.convert import Conversion
    from forge_replay.dumps.model_limits import model_limits
    from forge_replay.dumps.verify import verify_dumps
    from forge_replay.dumps.verify_record import record_document, write_record

    write_dump(tmp_path / "dumps" / "rollout_0.pt", 0)
    config = config_for(job_doc("entry", "rollout_{rollout_id}.pt", 2), tmp_path / "dumps", tmp_path / "out")
    # what the operator's verify Job records (the job's conversion) is trusted by the pre-flight: no second pass
    checked = verify_dumps(config.dumps_root, "rollout_{rollout_id}.pt", 2,
                           conversion=Conversion.for_job(config.job.spec, model_limits(TINY_LLAMA)[0]))
    record = str(tmp_path / "out" / "verify-record.json")
    write_record(record, record_document(checked.settings.to_dict(), checked.entries))
    config.verify_record = record
    (tmp_path / "config.yaml").write_text(config.to_yaml())
    assert main(["--config", str(tmp_path / "config.yaml"), "--no-progress"]) == 0
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["summary"]["rollouts"] == 2 and saved["summary"]["fallbacks"] == 1
    assert {k: saved["preflight"][k] for k in ("verified", "trusted", "record", "note")} == {
        "verified": 0, "trusted": 1, "record": record, "note": ""}  # rollout 1 falls back to the one file
    assert ray.is_initialized()  # joined the running Ray and left it running

    (tmp_path / "bad.yaml").write_text("job: {kind: ForgeReplayJob}\n")
    assert main(["--config", str(tmp_path / "bad.yaml")]) == 2


def test_vlm_samples_train_their_text_and_the_run_says_once_that_it_ignored_their_images(tmp_path, caplog):
    """The builtin trainer trains a VLM sample's tokens; it says once (log) and counts (report) the samples whose
    images and pixel_values it ignored, never failing silently (issue 14)."""
    import torch

    from tests.doubles import upstream_types as up

    root = tmp_path / "dumps"
    dicts = [s.to_dict() for s in write_dump(root / "rollout_0.pt", 0)]
    with up.upstream_modules():  # written as slime writes a VLM rollout: PIL images by class, bf16 pixel_values
        for d in dicts[:3]:
            d["multimodal_inputs"] = {"images": [up.rgb_image(4, 4)], "videos": None}
            d["multimodal_train_inputs"] = {"pixel_values": torch.ones(4, 8, dtype=torch.bfloat16)}
        torch.save({"rollout_id": 0, "samples": dicts}, root / "rollout_0.pt")
    with caplog.at_level("WARNING", logger="forge_replay.runtime.driver"):
        report = run_job(config_for(job_doc("vlm", "rollout_0.pt", 2), root, tmp_path / "out"), show_progress=False)
    assert [r.multimodal_ignored_samples for r in report.rollouts] == [3, 3]
    assert report.summary["multimodal_ignored_samples"] == 6 and all(math.isfinite(r.loss) for r in report.rollouts)
    said = [r.getMessage() for r in caplog.records if "multimodal inputs" in r.getMessage()]
    assert len(said) == 1 and "3 sample(s)" in said[0], said


def test_a_rank_out_of_memory_in_forward_is_the_runs_answer_and_expected_it_succeeds(tmp_path):
    """Rollout 1 packs 256k tokens into one micro-batch of a model with a 1M vocabulary: its logits (1 TiB of
    float32) are more than any machine's memory and swap, so torch's CPU allocator refuses them at once, in the
    rank's forward (issue 31). The run reports it, keeps rollout 0's step and stops everything it started."""
    from pathlib import Path

    from forge_replay.runtime.run_inputs import EXIT_OK, EXIT_OUT_OF_MEMORY, exit_status

    if Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1":
        pytest.skip("vm.overcommit_memory=1 would grant 1 TiB and let the rank touch it")
    vocab = 2**20
    root = tmp_path / "dumps"
    save(root / "rollout_0.pt", 0, synth_samples(0, 1, 2, 4, 4, vocab_size=vocab))
    save(root / "rollout_1.pt", 1, synth_samples(1, 256, 2, 64, 448, vocab_size=vocab))
    doc = job_doc("oom-forward", "rollout_{rollout_id}.pt", 2, micro_batch_tokens=2**18, verify=False)
    doc["spec"]["model"] = {"config": {**TINY_LLAMA, "vocab_size": vocab, "hidden_size": 8, "intermediate_size": 16,
                                       "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                                       "max_position_embeddings": 512}}
    doc["spec"]["trainer"]["nSamplesPerPrompt"] = 2
    doc["spec"]["expect"] = {"outcome": "outOfMemory"}  # a release test: this configuration must still be refused
    report = run_job(config_for(doc, root, tmp_path / "out"), show_progress=False)  # an answer: not raised
    oom = report.out_of_memory
    assert report.outcome == "outOfMemory" and report.partial and report.completed == 1
    assert (oom["signal"], oom["where"]["rank"], oom["when"]["rollout"], oom["when"]["phase"]) == \
        ("cpuAllocator", 0, 1, "forward")
    assert oom["how_much"]["requested_bytes"] == 2**18 * vocab * 4  # the logits: [1, 256k tokens, 1M] float32
    assert set(oom["how_much"]["last_step_peak_gib"]) == {"0"}
    assert [c["name"] for c in report.expectations] == ["outcome"] and report.expectations[0]["passed"]
    assert exit_status(report) == (EXIT_OK, None)  # expected: forge-replay run exits 0
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["outcome"] == "outOfMemory" and saved["out_of_memory"] == oom and saved["completed"] == 1
    assert [r["rollout_id"] for r in saved["rollouts"]] == [0]
    report.expectations = None  # without spec.expect.outcome the same run exits 4
    assert exit_status(report) == (EXIT_OUT_OF_MEMORY, report.error)
    import time

    deadline = time.monotonic() + 30  # the ranks and their placement group give their CPUs back (asynchronously)
    while ray.available_resources().get("CPU") != ray.cluster_resources()["CPU"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU") == ray.cluster_resources()["CPU"]


def test_a_rank_killed_without_an_oom_kill_in_its_cgroup_is_no_out_of_memory():
    """A SIGKILLed rank looks to Ray like a kernel OOM kill (ActorDiedError, WORKER_DIED); only its cgroup's oom_kill
    count tells them apart: unchanged here, so the run stays failed (issue 31)."""
    import signal

    from forge_replay.runtime.memory_signals import this_process_cgroup
    from forge_replay.runtime.rank_deaths import death_record, dead_ranks

    @ray.remote(num_cpus=0, max_restarts=0)
    class Rank:
        def alive(self):
            return 0

        def watched(self):
            return {"rank": 0, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                    "cgroup": this_process_cgroup()}

        def crash(self):
            os.kill(os.getpid(), signal.SIGKILL)

    victim, bystander = Rank.remote(), Rank.remote()
    watched = ray.get(victim.watched.remote())
    with pytest.raises(ray.exceptions.ActorDiedError) as died:
        ray.get(victim.crash.remote())
    dead = dead_ranks([bystander, victim])
    assert list(dead) == [1] and isinstance(dead[1], ray.exceptions.ActorDiedError)
    if watched["cgroup"] is not None:
        assert death_record(0, died.value, watched, {"rollout": 0, "phase": "forward"}) is None
    ray.kill(bystander)
