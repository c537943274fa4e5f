"""What the API server refuses, `validate` refuses too: numbers out of range or of the wrong type, names and
labels Kubernetes rejects, and YAML the Kubernetes decoder (sigs.k8s.io/yaml) refuses: duplicate keys,
alias bombs, runaway nesting. Each case exits 1 and names the field."""

from __future__ import annotations

import io
import time

import pytest
import yaml

from forge_replay.commands.validate import validate_files
from forge_replay.api.parse import (
    MAX_DOCUMENT_BYTES,
    MAX_NESTING,
    DocumentError,
    DocumentInvalid,
    allowed_alias_ratio,
    excessive_aliasing,
    load_yaml_documents,
)
from tests.unit.spec_factory import debug_job, forge_job


def validate_text(tmp_path, text: str) -> tuple[int, str]:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    out = io.StringIO()
    code = validate_files([str(path)], out)
    return code, out.getvalue().replace(f"{path}: ", "")


def validate_doc(tmp_path, doc) -> tuple[int, str]:
    return validate_text(tmp_path, yaml.safe_dump(doc, sort_keys=False))


@pytest.mark.parametrize("overrides, field, fragment", [
    ({"spec__ttlSecondsAfterFinished": 10**20}, "spec.ttlSecondsAfterFinished", "less than or equal to 2147483647"),
    ({"spec__trainer__microBatchTokens": 1e26}, "spec.trainer.microBatchTokens", "valid integer"),
    ({"spec__trainer__microBatchTokens": 2**31}, "spec.trainer.microBatchTokens", "less than or equal to 2147483647"),
    ({"spec__trainer__nSamplesPerPrompt": 2147483648}, "spec.trainer.nSamplesPerPrompt", "less than or equal to 4096"),
    ({"spec__replay__numRollouts": True}, "spec.replay.numRollouts", "valid integer (got True)"),
    ({"spec__replay__numRollouts": "4"}, "spec.replay.numRollouts", "valid integer (got '4')"),
    ({"spec__replay__numRollouts": 4.0}, "spec.replay.numRollouts", "valid integer (got 4.0)"),
    ({"spec__trainer__nodes": False}, "spec.trainer.nodes", "valid integer"),
    ({"spec__trainer__learningRate": float("inf")}, "spec.trainer.learningRate", "finite number"),
    ({"spec__trainer__learningRate": float("nan")}, "spec.trainer.learningRate", "finite number"),
    ({"spec__trainer__clipEps": "0.2"}, "spec.trainer.clipEps", "valid number"),
    ({"spec__trainer__clipEpsHigh": True}, "spec.trainer.clipEpsHigh", "valid number"),
    ({"metadata__namespace": "../../kube-system/x y"}, "metadata.namespace", "DNS-1123 label"),
    ({"metadata__namespace": "a" * 64}, "metadata.namespace", "at most 63"),
    ({"metadata__namespace": "team-a\n"}, "metadata.namespace", "DNS-1123 label"),
    ({"metadata__labels": {"bad key!": "v"}}, "metadata.labels.bad key!", "the name must be 1-63"),
    ({"metadata__labels": {"a/b/c": "v"}}, "metadata.labels.a/b/c", "more than one '/'"),
    ({"metadata__labels": {"Not_A.Domain/x": "v"}}, "metadata.labels.Not_A.Domain/x", "DNS-1123 subdomain"),
    ({"metadata__labels": {"x" * 64: "v"}}, "metadata.labels." + "x" * 64, "the name must be 1-63"),
    ({"metadata__labels": {"team": "-dash"}}, "metadata.labels.team", "value '-dash'"),
    ({"metadata__labels": {"team": "v" * 64}}, "metadata.labels.team", "must be empty or 1-63"),
    ({"metadata__annotations": {"bad key!": "v"}}, "metadata.annotations.bad key!", "the name must be 1-63"),
    ({"metadata__annotations": {"big": "x" * (256 * 1024)}}, "metadata.annotations", "bytes of annotations"),
    ({"spec__scheduling__nodeSelector": {"nvidia.com/gpu.product": "NVIDIA H200"}},
     "spec.scheduling.nodeSelector.nvidia.com/gpu.product", "value 'NVIDIA H200'"),
    ({"spec__pod__labels": {"": "x"}}, "spec.pod.labels", "key '': the name must be 1-63"),
    ({"spec__replay__dumps__path": "run/\x00/rollout_{rollout_id}.pt"}, "spec.replay.dumps.path",
     "must not contain a NUL character"),
    ({"spec__replay__dumps__path": "run/" + "x" * 244 + "_{rollout_id}"}, "spec.replay.dumps.path",
     "has a path component of 257 bytes"),
])
def test_validate_refuses_what_the_api_server_refuses(tmp_path, overrides, field, fragment):
    code, out = validate_doc(tmp_path, debug_job(**overrides))
    assert code == 1, out
    assert out.startswith(f"{field}: "), out
    assert fragment in out, out


@pytest.mark.parametrize("overrides", [
    {"metadata__namespace": "team-a", "metadata__labels": {"app.kubernetes.io/name": "x", "empty": "", "a_b": "C.d"}},
    {"metadata__annotations": {"example.com/note": "any text, spaces and all: fine"}},
    {"spec__scheduling__nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
    {"spec__trainer__learningRate": 1, "spec__trainer__nSamplesPerPrompt": 4096},
    {"spec__ttlSecondsAfterFinished": 2**31 - 1, "spec__trainer__microBatchTokens": 2**31 - 1},
])
def test_the_limits_themselves_are_accepted(tmp_path, overrides):
    code, out = validate_doc(tmp_path, debug_job(**overrides))
    assert code == 0, out


def test_go_style_floats_are_numbers_like_the_api_server_reads_them(tmp_path):
    text = yaml.safe_dump(debug_job(spec__trainer__learningRate="LR"), sort_keys=False).replace("LR", "1e-5")
    assert load_yaml_documents(text)[0]["spec"]["trainer"]["learningRate"] == 1e-5
    assert validate_text(tmp_path, text)[0] == 0
    assert load_yaml_documents("a: '1e-5'\nb: 1e26\nc: 12\n") == [{"a": "1e-5", "b": 1e26, "c": 12}]
    code, out = validate_text(tmp_path, text.replace("1e-5", ".inf"))
    assert code == 1 and out.startswith("spec.trainer.learningRate: input should be a finite number")


def test_duplicate_keys_are_refused_naming_the_key_and_both_lines(tmp_path):
    text = yaml.safe_dump(debug_job(), sort_keys=False)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "numRollouts" in line)
    lines.insert(at + 1, lines[at].replace("8", "9"))
    code, out = validate_text(tmp_path, "\n".join(lines) + "\n")
    assert code == 1
    assert out.strip() == (f"spec.replay.numRollouts: duplicate key 'numRollouts' at line {at + 2} "
                           f"(first at line {at + 1}); the API server refuses duplicate fields")


def test_duplicate_keys_in_a_flow_mapping_and_merge_keys(tmp_path):
    with pytest.raises(DocumentInvalid, match=r"^a\.b: duplicate key 'b' at line 1 \(first at line 1\)"):
        load_yaml_documents("a: {b: 1, b: 2}\n")
    # an explicit key next to a merge key (<<) overrides the merged one: not a duplicate
    assert load_yaml_documents("x: &x {b: 1}\ny:\n  <<: *x\n  b: 2\n")[0]["y"] == {"b": 2}


def alias_bomb(levels: int = 9, fan_out: int = 9) -> str:
    lines = ["      l0: &l0 [" + ", ".join(["lol"] * fan_out) + "]"]
    for n in range(1, levels):
        lines.append(f"      l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * fan_out) + "]")
    return "\n".join(lines)


def test_an_alias_bomb_in_the_model_config_is_refused_at_once(tmp_path):
    text = yaml.safe_dump(debug_job(spec__model__config={"BOMB": 1}), sort_keys=False)
    text = text.replace("      BOMB: 1", alias_bomb())
    began = time.perf_counter()
    code, out = validate_text(tmp_path, text)
    assert time.perf_counter() - began < 5
    assert code == 1
    assert out.startswith("spec.model.config.l3[6]: line 17: alias *l2 expands the document to 7429 nodes, 7360 ")
    assert "excessive aliasing (an alias bomb)" in out


def test_modest_aliasing_is_accepted(tmp_path):
    text = yaml.safe_dump(debug_job(spec__model__config={"BOMB": 1}), sort_keys=False)
    text = text.replace("      BOMB: 1", alias_bomb(levels=3, fan_out=3))
    assert validate_text(tmp_path, text)[0] == 0


def test_the_alias_rule_is_go_yamls():
    # gopkg.in/yaml.v2 decode.go: no check up to 100 aliased or 1000 decoded nodes; then 99% up to
    # 400,000 decoded nodes, falling linearly to 10% at 4,000,000
    assert allowed_alias_ratio(1000) == allowed_alias_ratio(400_000) == 0.99
    assert allowed_alias_ratio(4_000_000) == allowed_alias_ratio(10**9) == 0.10
    assert allowed_alias_ratio(2_200_000) == pytest.approx(0.545)
    assert not excessive_aliasing(1000, 999) and not excessive_aliasing(100_000, 100)
    assert excessive_aliasing(1001, 995) and not excessive_aliasing(1001, 990)
    assert excessive_aliasing(4_000_000, 400_001) and not excessive_aliasing(4_000_000, 400_000)


def test_a_recursive_alias_is_refused():
    with pytest.raises(DocumentInvalid, match=r"^a\[1\]: line 1: alias \*a refers to a node that contains it"):
        load_yaml_documents("a: &a [1, *a]\n")


@pytest.mark.parametrize("text", [
    "spec: " + "[" * 5000 + "]" * 5000 + "\n",
    "spec:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(2000)),
    "a: &a " + "[" * (MAX_NESTING - 2) + "]" * (MAX_NESTING - 2) + "\nb: [[*a]]\n",
])
def test_deep_nesting_is_refused_with_a_message_not_a_traceback(tmp_path, text):
    code, out = validate_text(tmp_path, text)
    assert code == 1
    assert "nest" in out and f"deeper than {MAX_NESTING} levels" in out
    assert len(out) < 500 and "Traceback" not in out


def test_nesting_up_to_the_limit_is_read():
    depth = MAX_NESTING - 1
    doc = load_yaml_documents("a: " + "[" * depth + "]" * depth + "\n")[0]
    for _ in range(depth):
        doc = doc["a"] if isinstance(doc, dict) else doc[0]
    assert doc == []


def test_a_file_over_the_api_servers_request_limit_is_unusable(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(forge_job()) + "# " + "x" * MAX_DOCUMENT_BYTES + "\n")
    out = io.StringIO()
    assert validate_files([str(path)], out) == 2
    assert "larger than 3 MiB, the API server's request limit" in out.getvalue()
    from forge_replay.api.parse import load_documents

    with pytest.raises(DocumentError):
        load_documents(path)
