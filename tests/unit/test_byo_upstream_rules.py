"""What slime's and miles' own code refuses, we refuse first (issue 26): the rules data read from their sources
(frameworks/upstream_rules.json, the flag tables' required rows), the spec rules and argv built on them, and verify's
acceptance rules for backend slime / miles."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import io
import json
import re
from pathlib import Path

import pytest
import yaml

from forge_replay.api import SpecInvalid, parse_job
from forge_replay.commands.validate import validate_files
from forge_replay.frameworks.flags import BACKENDS, INJECTED_UNLESS_GIVEN, flag_table, required_flags
from forge_replay.backends.argv import injected_argv
from forge_replay.dumps.acceptance import UpstreamSettings, refusals
from forge_replay.backends.launch import command
from forge_replay.frameworks.rules import MEGATRON, RULE_IDS, argv_problems, upstream_rule, upstream_rules
from forge_replay.dumps.files import save
from forge_replay.dumps.synth import synth_samples
from forge_replay.dumps.verify import verify_dumps
from forge_replay.dumps.evals import eval_before_train_id
from tests.unit.spec_factory import REQUIRED_ARGS, byo_job

ROOT = Path(__file__).resolve().parents[2]
EVAL_DATA = ["--eval-prompt-data", "aime", "/data/aime.jsonl"]


def problems(doc) -> list[str]:
    with pytest.raises(SpecInvalid) as info:
        parse_job(doc)
    return [str(p) for p in info.value.problems]


def argv(doc) -> list[str]:
    return injected_argv(parse_job(doc).spec, "/mnt/dumps")


# ------------------------------------------------------------------------------------- the data


@pytest.mark.parametrize("backend", BACKENDS)
def test_rules_cite_upstream_at_the_flag_tables_commit(backend: str) -> None:
    rules = upstream_rules(backend)
    assert rules and {r.rule_id for r in rules} <= set(RULE_IDS)
    for rule in rules:
        assert (rule.repository, rule.commit) == (flag_table(backend).repository, flag_table(backend).commit)
        assert rule.what and rule.cites
        for cite in rule.cites:
            assert re.fullmatch(r"[0-9a-f]{16}", cite["anchor"]) and cite["line"] >= 1, cite
            assert cite.get("end", cite["line"]) >= cite["line"]
    assert re.fullmatch(r".+:\d+.* \((THUDM/slime|radixark/miles)@[0-9a-f]{8}\)", rules[0].where)


def test_every_rule_forge_replay_reads_is_in_the_data() -> None:
    read = {rule_id for rule_id in RULE_IDS if any(upstream_rule(b, rule_id) for b in (*BACKENDS, MEGATRON))}
    assert read == set(RULE_IDS)
    assert upstream_rule("miles", "upstream-forge-loader") is None  # miles has no forge_load
    assert upstream_rule("slime", "rollout-shares-reward") is None
    with pytest.raises(KeyError):
        upstream_rule("slime", "no-such-rule")


@pytest.mark.parametrize("backend", BACKENDS)
def test_required_flags_come_from_the_flag_table(backend: str) -> None:
    """slime arguments.py:693, miles :1084 (required=True): read by scripts/backend-flags."""
    assert required_flags(backend) == ["--rollout-batch-size"]
    row = flag_table(backend).options["--rollout-batch-size"]
    assert row["required"] is True and row["line"] > 0
    assert all("line" in r for r in flag_table(backend).options.values())


def _script(name: str):
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(ROOT / "scripts" / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_megatron_rules_are_read_at_the_commit_slime_pins() -> None:
    """The third repository: Megatron-LM at the commit slime's image builds (docker/Dockerfile), cited as the others."""
    pin = upstream_rule("slime", "megatron-pin")
    rules = upstream_rules(MEGATRON)
    assert {r.rule_id for r in rules} == {"data-parallel-size", "default-global-batch-size"}
    for rule in rules:
        assert (rule.repository, rule.commit) == ("NVIDIA/Megatron-LM", pin["commit"])
        assert all(re.fullmatch(r"[0-9a-f]{16}", c["anchor"]) for c in rule.cites)
    assert pin.cites[0]["file"] == "docker/Dockerfile"
    assert "megatron" in _script("backend-rules").REPOSITORIES


def test_backend_rules_finds_moved_lines_and_says_when_code_changed() -> None:
    rules = _script("backend-rules")
    source = ["def f(args):", "    if args.eval_interval is not None:", "        assert args.eval_datasets",
              "    x = 1"]
    cite = {"file": "a.py", "line": 2, "end": 3, "anchor": rules.anchor(source[1:3])}
    assert rules.find(source, cite) == 2
    assert rules.find(["# new first line", *source], cite) == 3  # moved down one line: found again
    assert rules.find([source[0], source[1], "        assert args.eval_sets", source[3]], cite) is None  # changed
    data = json.loads((ROOT / "operator/forge_replay/frameworks/upstream_rules.json").read_text())
    assert json.loads(rules.dumps(data)) == data  # the committed layout round-trips


# ------------------------------------------------------------- 1. eval needs datasets; debug mode never evaluates


@pytest.mark.parametrize("backend", BACKENDS)
def test_debug_mode_eval_refused_for_byo(backend: str) -> None:
    found = problems(byo_job(backend, "debug", spec__replay__evalInterval=2))
    cite = upstream_rule(backend, "debug-skips-eval").cites[0]
    assert any(p.startswith(f"spec.replay.evalInterval: {backend} never evaluates in debug mode")
               and f"{cite['file']}:{cite['line']}" in p for p in found), found


@pytest.mark.parametrize("backend", BACKENDS)
def test_forge_eval_needs_eval_datasets_in_args(backend: str) -> None:
    found = problems(byo_job(backend, spec__replay__evalInterval=2))
    assert any(p.startswith(f"spec.replay.evalInterval: {backend} refuses --eval-interval") for p in found), found
    for given in (EVAL_DATA, ["--eval-config=/data/eval.yaml"]):
        ok = argv(byo_job(backend, spec__replay__evalInterval=2, spec__trainer__args=given))
        assert ok[ok.index("--eval-interval") + 1] == "2"


def test_builtin_debug_eval_is_still_allowed() -> None:
    from tests.unit.spec_factory import debug_job

    assert parse_job(debug_job(spec__replay__evalInterval=2)).spec.replay.eval_interval == 2


# ------------------------------------------------------------- 2. required flags; examples and goldens run upstream


@pytest.mark.parametrize("backend", BACKENDS)
def test_required_flag_missing_is_refused(backend: str) -> None:
    doc = byo_job(backend)
    doc["spec"]["trainer"]["args"] = ["--lr", "1e-6"]
    found = problems(doc)
    assert found == [f"spec.trainer.args: --rollout-batch-size is required by {backend}'s parser "
                     f"({backend}/utils/arguments.py:{flag_table(backend).options['--rollout-batch-size']['line']}, "
                     f"{flag_table(backend).repository}@{flag_table(backend).commit[:8]}), which exits 2 without it: "
                     "give it in args, as the run that wrote the dumps did"]
    doc["spec"]["trainer"]["args"] = ["--rollout-batch-size=8"]
    assert parse_job(doc).spec.trainer.args == ["--rollout-batch-size=8"]


BYO_FILES = sorted([*ROOT.glob("examples/byo-*.yaml"), *ROOT.glob("tests/unit/golden/byo/*.in.yaml")])


@pytest.mark.parametrize("path", BYO_FILES, ids=lambda p: p.name)
def test_every_byo_example_and_golden_argv_satisfies_the_framework(path: Path) -> None:
    spec = parse_job(yaml.safe_load(path.read_text())).spec
    full = command(spec, "/mnt/forge-replay/dumps")[2:]  # python3 <script>: the rest is what the parser reads
    assert argv_problems(spec.trainer.backend, full) == []


def test_argv_problems_names_what_the_framework_refuses() -> None:
    assert argv_problems("slime", []) == ["--rollout-batch-size is required (slime/utils/arguments.py:"
                                          f"{flag_table('slime').options['--rollout-batch-size']['line']})"]
    miles = argv_problems("miles", ["--rollout-batch-size", "8", "--eval-interval", "2"])
    assert [p.split(" (")[0] for p in miles] == [
        "--eval-interval without --eval-prompt-data or --eval-config",
        "the global dataset loads --prompt-data, which is not given: pass --disable-rollout-global-dataset"]
    assert argv_problems("slime", ["--rollout-batch-size", "8"]) == []  # slime guards a missing --prompt-data


# ------------------------------------------------------------- 3. miles' data source without prompt data


@pytest.mark.parametrize("mode", ["forge", "debug"])
def test_miles_global_dataset_is_turned_off_unless_args_give_prompts(mode: str) -> None:
    assert INJECTED_UNLESS_GIVEN == (upstream_rule("miles", "global-dataset")["off_flag"],)
    assert "--disable-rollout-global-dataset" in argv(byo_job("miles", mode))
    given = argv(byo_job("miles", mode, spec__trainer__args=["--prompt-data", "/data/p.jsonl"]))
    assert "--disable-rollout-global-dataset" not in given
    own = byo_job("miles", mode, spec__trainer__args=["--disable-rollout-global-dataset"])
    assert "--disable-rollout-global-dataset" not in argv(own)  # not refused, not doubled
    assert "--disable-rollout-global-dataset" not in argv(byo_job("slime", mode))  # slime guards it


# ------------------------------------------------------------- 4. slime's and miles' debug loader has no fallback


@pytest.mark.parametrize("backend", BACKENDS)
def test_upstream_debug_loader_cannot_fall_back(backend: str) -> None:
    found = problems(byo_job(backend, "debug", spec__replay__loader="upstream"))
    cite = upstream_rule(backend, "upstream-debug-loader").cites[0]
    assert [p for p in found if p.startswith("spec.replay.dumps.fallbackToFirst: true cannot be honoured")
            and f"{cite['file']}:{cite['line']}" in p], found
    no_fallback = byo_job(backend, "debug", spec__replay__loader="upstream", spec__replay__dumps__fallbackToFirst=False)
    assert parse_job(no_fallback).spec.replay.dumps.fallback_to_first is False
    literal = byo_job(backend, "debug", spec__replay__loader="upstream", spec__replay__dumps__path="run/rollout_0.pt")
    assert parse_job(literal).spec.replay.loader == "upstream"  # one file for every rollout: nothing to fall back to


def test_slime_forge_load_always_falls_back() -> None:
    found = problems(byo_job("slime", spec__replay__loader="upstream", spec__replay__dumps__fallbackToFirst=False))
    assert any("slime/rollout/forge_load.py:61-65" in p for p in found), found


# ------------------------------------------------------------- 5. eval before training, as each framework does


@pytest.mark.parametrize("backend,start,expected", [
    ("slime", 0, 0), ("slime", 2, None), ("builtin", 2, None), ("miles", 0, 0), ("miles", 2, 2),
])
def test_eval_before_train_follows_each_framework(backend: str, start: int, expected: int | None) -> None:
    assert eval_before_train_id(start, 2, True, backend) == expected
    assert eval_before_train_id(start, 2, False, backend) is None


def _dumps(tmp_path: Path, ids: list[int], evals: list[int], one_episode: bool = False) -> str:
    """Synthesized dumps (an episode per sample); ``one_episode``: every sample of a dump in one episode (one
    rollout_id), whose rewards differ: what miles' GRPO conversion refuses."""
    for n in ids:
        samples = synth_samples(n, 2, 2, 3, 2)
        for s in samples if one_episode else ():
            s.rollout_id = n
        save(tmp_path / f"rollout_{n}.pt", n, samples)
    for n in evals:
        save(tmp_path / f"rollout_eval_{n}.pt", n, synth_samples(n, 1, 2, 3, 2))
    return "rollout_{rollout_id}.pt"


def test_verify_reads_the_eval_miles_runs_before_training(tmp_path) -> None:
    template = _dumps(tmp_path, [2, 3], [])
    report = verify_dumps(str(tmp_path), template, 2, start_rollout_id=2, eval_interval=4, eval_before_train=True,
                          backend="miles")
    assert [(c.kind, c.rollout_id) for c in report.checks if c.kind == "eval"] == [("eval", 2), ("eval", 3)]
    slime = verify_dumps(str(tmp_path), template, 2, start_rollout_id=2, eval_interval=4, eval_before_train=True,
                         backend="slime")
    assert [c.rollout_id for c in slime.checks if c.kind == "eval"] == [3]


# ------------------------------------------------------------- 6. gpusPerNode 0 runs only a stand-in


def test_validate_notes_that_no_gpus_runs_only_a_stand_in(tmp_path) -> None:
    outputs = {}
    for gpus in (0, 8):
        path = tmp_path / f"{gpus}.yaml"
        path.write_text(yaml.safe_dump(byo_job("slime", "debug", spec__trainer__gpusPerNode=gpus)))
        out = io.StringIO()
        assert validate_files([str(path)], out) == 0
        outputs[gpus] = out.getvalue()
    assert "note: spec.trainer.gpusPerNode 0 injects --actor-num-gpus-per-node 0" in outputs[0]
    assert "note:" not in outputs[8]


# ------------------------------------------------------------- verify: what the framework refuses in a dump


def _settings(backend: str, args=(), reward_key=None) -> UpstreamSettings:
    return UpstreamSettings.from_args(backend, [*REQUIRED_ARGS, *args], reward_key)


def test_settings_read_the_team_args_with_upstream_defaults() -> None:
    got = _settings("miles", ["--advantage-estimator=ppo", "--n-samples-per-prompt", "4",
                              "--disable-rewards-normalization"])
    assert (got.advantage_estimator, got.n_samples_per_prompt, got.rollout_batch_size, got.rewards_normalization) == (
        "ppo", 4, 32, False)
    default = _settings("miles")
    assert (default.advantage_estimator, default.n_samples_per_prompt, default.rewards_normalization) == (
        "grpo", 1, True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reward_key_needs_dict_rewards(backend: str) -> None:
    samples = synth_samples(0, 2, 2, 3, 2)  # float rewards
    for s in samples:
        s.rollout_id = None  # each sample its own rollout (miles keys rollouts by index then)
    [refusal] = refusals(samples, _settings(backend, reward_key="acc"))
    assert (refusal.index, refusal.field) == (0, "reward") and "raises a TypeError" in refusal.problem
    assert "utils/types.py:" in refusal.problem
    as_dicts = [dataclasses.replace(s, reward={"acc": s.reward}) for s in samples]
    assert refusals(as_dicts, _settings(backend, reward_key="acc")) == []
    assert refusals(samples, _settings(backend)) == []


def test_miles_refuses_one_rollout_with_two_rewards() -> None:
    samples = synth_samples(0, 2, 4, 3, 2)
    assert refusals(samples, _settings("miles")) == []  # synthesized: an episode per sample, as miles numbers them
    for s in samples:
        s.rollout_id = 0  # one rollout (episode) per group, for miles
    samples[0].reward, samples[1].reward = 0.0, 1.0
    [refusal] = refusals(samples, _settings("miles"))
    assert refusal.index == 1 and "miles/ray/rollout/train_data_conversion.py:234-238" in refusal.problem
    assert refusals(samples, _settings("slime")) == []  # slime has no such rule
    assert refusals(samples, _settings("miles", ["--disable-rewards-normalization"])) == []
    assert refusals(samples, _settings("miles", ["--advantage-estimator", "ppo"])) == []
    assert refusals(samples, _settings("miles", ["--custom-reward-post-process-path", "team.post"])) == []
    for s in samples:
        s.rollout_id = None  # then each sample's index is its rollout
    assert refusals(samples, _settings("miles")) == []


def test_slime_refuses_a_rollout_with_fewer_episodes_than_a_training_step() -> None:
    # What dumps synth wrote before: every sample of a dump under the dump's rollout_id, one episode, which slime's
    # step split (slime/utils/dp_schedule.py) fails on an assertion once its GPUs are up.
    samples = synth_samples(3, 2, 2, 3, 2)  # 4 samples, an episode each
    steps = ["--n-samples-per-prompt", "2", "--num-steps-per-rollout", "1"]  # 32 x 2 // 1 = 64 episodes a step
    assert _settings("slime", steps).global_batch_size == 64
    small = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-steps-per-rollout", "1"]
    assert refusals(samples, _settings("slime", small)) == []  # 4 episodes, 4 a step
    for s in samples:
        s.rollout_id = 3
    [refusal] = refusals(samples, _settings("slime", small))
    assert (refusal.index, refusal.field) == (0, "rollout_id")
    assert refusal.problem.startswith("4 samples hold 1 episode(s) (4 samples share rollout_id 3), fewer than the 4 ")
    assert "slime/utils/dp_schedule.py:130-139" in refusal.problem
    for s in samples[:3]:
        s.rollout_id = None  # each gets a fresh id, as slime's rollout manager gives them
    assert refusals(samples, _settings("slime", small)) == []
    assert refusals(samples[:1], _settings("slime", ["--global-batch-size", "2"]))[0].field == "rollout_id"
    assert _settings("slime").global_batch_size is None  # neither the args nor the world size fix it: not checked
    assert refusals(samples[3:], _settings("miles", small)) == []  # miles falls back to another split


def test_miles_groups_without_group_index_by_the_batch_shape() -> None:
    samples = synth_samples(0, 2, 2, 3, 2)
    for s, reward in zip(samples, [0.0, 0.0, 1.0, 1.0]):
        s.group_index, s.reward, s.rollout_id = None, reward, 0  # one episode
    # 4 samples = n-samples-per-prompt 2 x rollout-batch-size 2: two groups, each sharing one reward
    assert refusals(samples, UpstreamSettings.from_args("miles", ["--rollout-batch-size", "2",
                                                                  "--n-samples-per-prompt", "2"], None)) == []
    [refusal] = refusals(samples, _settings("miles"))  # 4 != 1 x 32: one group, one rollout_id, two rewards
    assert refusal.index == 2


def test_verify_with_a_backend_refuses_what_the_framework_would(tmp_path) -> None:
    template = _dumps(tmp_path, [0, 1], [])
    kwargs = {"reward_key": "acc"}
    plain = verify_dumps(str(tmp_path), template, 2, reward_key=None)
    assert plain.ok
    refused = verify_dumps(str(tmp_path), template, 2, backend="slime", upstream=_settings("slime", **kwargs))
    assert not refused.ok and "sample 0, field 'reward'" in refused.checks[0].message
    assert verify_dumps(str(tmp_path), template, 2, backend="miles", upstream=_settings("miles")).ok
    template = _dumps(tmp_path, [0, 1], [], one_episode=True)
    miles = verify_dumps(str(tmp_path), template, 2, backend="miles", upstream=_settings("miles"))
    assert [c.status for c in miles.checks] == ["unreadable", "unreadable"], miles.summary()


def test_verify_cli_and_job_pass_the_backend(tmp_path) -> None:
    from click.testing import CliRunner

    from forge_replay.dumps.verify_request import verify_command
    from forge_replay.commands.dumps import dumps as dumps_command

    template = _dumps(tmp_path, [0], [], one_episode=True)
    base = ["verify", "--root", str(tmp_path), "--path", template, "--num-rollouts", "1"]
    assert CliRunner().invoke(dumps_command, base).exit_code == 0
    refused = CliRunner().invoke(dumps_command, [*base, "--backend", "miles", "--trainer-args", '["--lr","1"]'])
    assert refused.exit_code == 1 and "share one reward" in refused.output
    bad = CliRunner().invoke(dumps_command, [*base, "--backend", "slime", "--trainer-args", '{"a": 1}'])
    assert bad.exit_code == 2 and "--trainer-args" in bad.output
    job = parse_job(byo_job("miles", "debug", spec__trainer__args=["--advantage-estimator", "ppo"]))
    line = verify_command(job)
    assert line[line.index("--backend") + 1] == "miles"
    assert json.loads(line[line.index("--trainer-args") + 1]) == [  # the team's args, then what the rules read
        "--advantage-estimator", "ppo", *REQUIRED_ARGS, "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8"]


def test_every_upstream_line_the_docs_cite_is_in_the_data() -> None:
    """docs/byo-trainer.md cites slime's and miles' code by file:line; each citation is one the data holds, so a new
    pin (scripts/backend-rules, scripts/backend-flags) that moves the lines makes this fail until the docs follow."""
    cited = {f"{c['file']}:{c['line']}" + (f"-{c['end']}" if "end" in c else "")
             for rule in upstream_rules(MEGATRON) for c in rule.cites}
    for backend in BACKENDS:
        table = flag_table(backend)
        cited |= {f"{table.file}:{row['line']}" for row in table.options.values()}
        for rule in upstream_rules(backend):
            cited |= {f"{c['file']}:{c['line']}" + (f"-{c['end']}" if "end" in c else "") for c in rule.cites}
    text = (ROOT / "docs" / "byo-trainer.md").read_text()
    in_docs = re.findall(r"`((?:slime|miles|megatron)/[\w/]+\.py:\d+(?:-\d+)?|train\.py:\d+(?:-\d+)?)`", text)
    assert len(in_docs) >= 15
    assert sorted(set(in_docs) - cited) == []


def test_run_says_the_same_notes_before_anything_runs(tmp_path) -> None:
    from forge_replay.backends.local import input_problem

    job = parse_job(byo_job("miles", "debug", spec__trainer__gpusPerNode=0))
    said: list[str] = []
    problem = input_problem("job.yaml", job, str(tmp_path), "dumps", False, said.append)
    assert problem == f"job.yaml: {tmp_path / job.spec.trainer.script} does not exist (spec.trainer.script under " \
                      "--trainer-root)"
    assert any("note: spec.trainer.gpusPerNode 0 injects --actor-num-gpus-per-node 0" in line for line in said), said


def test_run_with_a_missing_dumps_root_is_unusable_input_as_for_the_builtin_trainer(tmp_path) -> None:
    from forge_replay.backends.local import input_problem

    job = parse_job(byo_job("slime", "debug"))
    (tmp_path / job.spec.trainer.script).write_text("")
    problem = input_problem("job.yaml", job, str(tmp_path), str(tmp_path / "none"), False, lambda line: None)
    assert problem == (f"job.yaml: dumps root {tmp_path / 'none'} does not exist; pass --dumps-root DIR, "
                       "or --synth-missing")
    assert input_problem("job.yaml", job, str(tmp_path), str(tmp_path / "none"), True, lambda line: None) is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_stand_in_refuses_what_the_frameworks_refuse(backend: str) -> None:
    """tests/byo/train.py follows the data: a missing required flag exits 2 as argparse does; --eval-interval without
    an eval dataset fails as the frameworks' assertion does."""
    from tests.byo.train import main

    spec = parse_job(byo_job(backend, "debug")).spec
    injected = ["--stand-in-backend", backend, *injected_argv(spec, "/nowhere")]
    with pytest.raises(SystemExit) as exited:
        main(injected)  # no --rollout-batch-size
    assert exited.value.code == 2
    with pytest.raises(AssertionError, match="Evaluation datasets must be configured"):
        main([*injected, *REQUIRED_ARGS, "--eval-interval", "2"])


def test_every_spec_validate_accepts_builds_an_argv_the_framework_takes() -> None:
    """Over backends, modes, eval on/off and what args give: every spec validate accepts builds an argv the
    framework's own code takes (argv_problems empty); some of the combinations are refused."""
    import itertools

    variants = {"none": [], "batch": REQUIRED_ARGS, "batch+eval": [*REQUIRED_ARGS, *EVAL_DATA],
                "eval": EVAL_DATA, "batch+prompts": [*REQUIRED_ARGS, "--prompt-data", "/p.jsonl"]}
    seen = set()
    for backend, mode, interval, (name, args) in itertools.product(BACKENDS, ["forge", "debug"], [0, 2],
                                                                   variants.items()):
        doc = byo_job(backend, mode, spec__replay__evalInterval=interval)
        doc["spec"]["trainer"]["args"] = list(args)
        try:
            spec = parse_job(doc).spec
        except SpecInvalid:
            seen.add("refused")
            continue
        seen.add("accepted")
        full = command(spec, "/mnt/forge-replay/dumps")[2:]
        assert argv_problems(backend, full) == [], (backend, mode, interval, name)
    assert seen == {"accepted", "refused"}
