"""engineArgs keys are sglang server argument names exactly (issue 19: engineArgs cannot smuggle flags).

The names are the pinned sglang's own (operator/forge_replay/api/sglang_server_args.json; tests/conformance checks
the file against the installed sglang's parser)."""

from __future__ import annotations

import argparse

import pytest

from forge_replay.api.engine_args import RESERVED_DESTS, engine_args_problems, option_table, server_args
from forge_replay.api import SpecInvalid, parse_job
from tests.unit.spec_factory import forge_job


def problems(engine_args: dict) -> dict[str, str]:
    return dict(engine_args_problems(engine_args))


@pytest.mark.parametrize("key, closest", [
    ("tp-siz", "tp-size"),                 # a prefix sglang's argparse would take for --tp-size
    ("model-pat", "model-path"),
    ("mem-fraction-stati", "mem-fraction-static"),
    ("context-lenght", "context-length"),
])
def test_abbreviations_and_typos_are_refused_naming_the_field_and_the_closest_name(key, closest):
    message = problems({key: "1"})[f"spec.rollout.engineArgs.{key}"]
    assert f"no server argument --{key}" in message
    assert f"did you mean {closest}?" in message


def test_a_key_cannot_carry_its_own_value():
    message = problems({"host=127.0.0.2": ""})["spec.rollout.engineArgs.host=127.0.0.2"]
    assert "no '='" in message


@pytest.mark.parametrize("key", ["host", "port", "model-path", "model", "--model", "tp-size", "tensor-parallel-size",
                                 "base-gpu-id", "config", "help"])
def test_flags_forge_replay_sets_and_their_aliases_are_refused(key):
    assert "remove it from engineArgs" in problems({key: "x"})[f"spec.rollout.engineArgs.{key}"]


def test_every_reserved_dest_is_a_real_sglang_argument():
    """A renamed sglang argument must not silently stop being reserved."""
    _, table = server_args()
    assert set(RESERVED_DESTS) <= {arg.dest for arg in table.values()}


def test_real_names_pass_and_values_match_the_kind_of_flag():
    assert problems({"mem-fraction-static": "0.7", "--context-length": "65536", "enable-memory-saver": "",
                     "trust-remote-code": "true", "skip-server-warmup": "false", "dtype": "bfloat16"}) == {}
    assert "on/off switch" in problems({"trust-remote-code": "yes"})["spec.rollout.engineArgs.trust-remote-code"]
    assert "takes a value" in problems({"context-length": ""})["spec.rollout.engineArgs.context-length"]
    assert "takes a value" in problems({"context-length": "true"})["spec.rollout.engineArgs.context-length"]


def test_the_spec_refuses_a_smuggled_flag_with_its_field_path():
    doc = forge_job()
    doc["spec"]["rollout"]["engineArgs"] = {"tp-siz": "4", "mem-fraction-static": "0.7"}
    with pytest.raises(SpecInvalid) as refused:
        parse_job(doc)
    assert "spec.rollout.engineArgs.tp-siz" in str(refused.value) and "tp-size" in str(refused.value)


def test_option_table_reads_names_aliases_and_switches_from_a_parser():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", "--model", dest="model_path")
    parser.add_argument("--flag", action="store_true")
    parser.add_argument("--on", action=argparse.BooleanOptionalAction)
    table = option_table(parser)
    assert table["model"].dest == table["model-path"].dest == "model_path" and table["model"].takes_value
    assert not table["flag"].takes_value and not table["no-on"].takes_value
    assert "h" not in table and table["help"].dest == "help"
