"""Every engine command the fleet can build is parsed by sglang's own ``prepare_server_args``.

The argv comes from the fleet itself: ``EngineFleet.from_job`` on each forge example (colocated and not, its
``model.config`` and a checkpoint directory with and without a tokenizer, its engineArgs), then each engine actor's
``argv()`` on a real local Ray. Ray is told of GPUs this machine lacks, so the GPU examples' actors get placed;
they only build their argv, nothing is started."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from forge_replay.api import parse_job
from forge_replay.runtime.engines.fleet import EngineFleet

from tests.doubles import real_sglang

pytestmark = [pytest.mark.ray]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def forge_examples() -> dict[str, dict]:
    docs = {path.name: yaml.safe_load(path.read_text()) for path in sorted(EXAMPLES.glob("*.yaml"))}
    return {name: doc for name, doc in docs.items() if doc["spec"]["replay"]["mode"] == "forge"}


def variants() -> list[tuple[str, dict, str]]:
    """(id, job document, model kind) for every forge example: as written, colocated (where it has GPUs for it),
    and with a checkpoint model (tokenizer or none) instead of its config."""
    out = []
    for name, doc in forge_examples().items():
        spec = doc["spec"]
        colocations = [False, True] if spec["trainer"]["gpusPerNode"] > 0 else [False]
        for colocate in colocations:
            for model in ("config", "checkpoint", "checkpoint-with-tokenizer"):
                job = copy.deepcopy(doc)
                job["spec"]["rollout"]["colocate"] = colocate
                if colocate:
                    job["spec"]["rollout"]["weightSync"] = "auto"  # distributed cannot be colocated
                if model != "config":
                    job["spec"]["model"] = {"claimName": "models", "path": "ckpt"}
                out.append((f"{name}-{'colocated' if colocate else 'own-gpus'}-{model}", job, model))
    return out


@pytest.fixture(scope="module")
def ray_with_gpus():
    import ray

    started = not ray.is_initialized()
    if started:  # GPUs this machine lacks, so that GPU examples' actors are placed (they only build argv)
        ray.init(address="local", num_cpus=2, num_gpus=16, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    if started:
        ray.shutdown()


def fleet_argvs(job_doc: dict, model_kind: str, work: Path) -> list[list[str]]:
    """The argv of every engine the fleet would start, from the fleet's own actors."""
    import ray

    models = work / "models"
    config = forge_examples()["forge-cpu.yaml"]["spec"]["model"]["config"]
    if model_kind != "config":
        (models / "ckpt").mkdir(parents=True)
        (models / "ckpt" / "config.json").write_text(json.dumps(config))
        if model_kind == "checkpoint-with-tokenizer":
            (models / "ckpt" / "tokenizer.json").write_text("{}")
    job = parse_job(job_doc)
    fleet = EngineFleet.from_job(job, engine_command=None, model_root=str(models), work_dir=work / "run")
    actors = [fleet._new_actor(index) for index in range(fleet.settings.num_engines)]
    try:
        argvs = ray.get([actor.argv.remote() for actor in actors], timeout=300)
    finally:
        for actor in actors:
            ray.kill(actor)
    assert all(argv[:len(fleet.command)] == fleet.command for argv in argvs)
    assert fleet.command[-1] == "sglang.launch_server"  # with sglang installed, the real launcher
    return [argv[len(fleet.command):] for argv in argvs]


@pytest.mark.parametrize("variant, job_doc, model_kind", variants(), ids=[v[0] for v in variants()])
def test_sglang_parses_every_engine_command_the_fleet_builds(ray_with_gpus, tmp_path, variant, job_doc, model_kind):
    job = parse_job(job_doc)
    for argv in fleet_argvs(job_doc, model_kind, tmp_path):
        server = real_sglang.parse_server_args(argv)  # raises ServerArgsRefused on a flag sglang does not take
        assert server.tp_size == job.spec.rollout.num_gpus_per_engine
        assert server.skip_tokenizer_init == (model_kind != "checkpoint-with-tokenizer")
        assert server.load_format == ("dummy" if model_kind == "config" else "auto")
        assert server.enable_memory_saver == job.spec.rollout.colocate
        for key, value in job.spec.rollout.engine_args.items():
            assert str(getattr(server, key.replace("-", "_"))) == value  # engineArgs arrive as given
        assert server.dtype == job.spec.trainer.dtype


def test_sglang_refuses_an_argv_it_does_not_know():
    """The check above can fail: sglang's parser refuses what it does not know (here an abbreviation's typo)."""
    with pytest.raises(real_sglang.ServerArgsRefused, match="--tp-sizze"):
        real_sglang.parse_server_args(["--model-path", "/nowhere", "--tp-sizze", "2"])
