"""The committed CRD is exactly what the models generate, and it is a structural schema."""

from __future__ import annotations

from pathlib import Path

import yaml

from forge_replay.api.crd import CRD_FILE, crd, crd_yaml

ROOT = Path(__file__).resolve().parents[2]
ALLOWED_FREE_FORM = {"spec.model.config", "spec.rollout.engineArgs", "spec.scheduling.affinity",
                     "spec.scheduling.topologySpreadConstraints[]"}


def walk(node, path=""):
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}" if path else name)
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}.*")


def schema():
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_has_not_drifted():
    committed = (ROOT / CRD_FILE).read_text(encoding="utf-8")
    assert committed == crd_yaml(), "crds/ is stale: run `forge-replay crd -o " + CRD_FILE + "`"


def test_no_json_schema_leftovers():
    text = crd_yaml()
    for forbidden in ("$ref", "$defs", "anyOf", "type: null", "title:", "const:"):
        assert forbidden not in text, forbidden


def test_every_node_is_typed_and_described():
    for path, node in walk(schema()):
        if path.endswith(("[]", ".*")):
            continue
        assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, path
        if path == "metadata":  # the API server refuses anything but type on metadata
            continue
        assert node.get("description"), f"{path} has no description (kubectl explain shows it)"


def test_preserve_unknown_fields_only_on_free_form_maps():
    marked = {path for path, node in walk(schema()) if node.get("x-kubernetes-preserve-unknown-fields")}
    assert marked == ALLOWED_FREE_FORM


def test_cross_field_rules_are_cel():
    rules = [r["rule"] for _, node in walk(schema()) for r in node.get("x-kubernetes-validations", [])]
    assert any("numGpusPerEngine" in r for r in rules)
    assert any("self.metadata.name.size() <= 47" in r for r in rules)
    assert any("has(self.config) != has(self.path)" in r for r in rules)
    strings_in_cel = schema()["properties"]["spec"]["properties"]["replay"]["properties"]["dumps"]["properties"]
    assert strings_in_cel["path"]["maxLength"] <= 4096  # CEL cost estimation needs a bound


def test_resource_names_status_and_columns():
    doc = crd()
    names = doc["spec"]["names"]
    assert names["shortNames"] == ["frj"] and names["plural"] == "forgereplayjobs"
    assert names["categories"]
    version = doc["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Phase", "Reason", "Mode", "Done", "Rollouts", "Peak GiB", "Outcome", "Age"]
    # kubectl get frj -o wide: a sweep's progress (issue 32), why a job waits or why it ended (issue 33)
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1]
    assert wide == ["Points", "Frontier", "Cluster", "Queue", "Admitted", "Expectations", "RayCluster", "Message"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert {"phase", "conditions", "observedGeneration", "rollouts", "memory", "outcome", "outOfMemory",
            "sweep", "admissionTime", "firstStepTime"} <= set(status["properties"])


def test_enums_bounds_and_defaults_come_from_the_models():
    spec = schema()["properties"]["spec"]["properties"]
    assert spec["replay"]["properties"]["mode"]["enum"] == ["forge", "debug"]
    assert spec["replay"]["properties"]["numRollouts"]["minimum"] == 1
    assert spec["trainer"]["properties"]["gpusPerNode"]["default"] == 8
    assert spec["trainer"]["default"] == {}
    assert spec["rollout"]["nullable"] is True
    assert yaml.safe_load(crd_yaml()) == crd()


def test_field_reference_has_not_drifted():
    from forge_replay.api.reference import REFERENCE_FILE, markdown

    assert (ROOT / REFERENCE_FILE).read_text(encoding="utf-8") == markdown(), (
        "docs/api-reference.md is stale: run `python -m forge_replay.api.reference > docs/api-reference.md`")
