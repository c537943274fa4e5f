"""Generate the ForgeReplayJob CRD from the pydantic models (never edited by hand).

The pydantic JSON schema is turned into a Kubernetes structural schema: references inlined,
Optional as ``nullable``, no ``type: null``, bounds in OpenAPI v3.0 form, defaults kept, free-form
maps marked ``x-kubernetes-preserve-unknown-fields``, and each cross-field rule's CEL twin attached
where it belongs.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from forge_replay.api.job import CROSS_FIELD_RULES, MUTABLE_AFTER_LAUNCH, ForgeReplayJobSpec
from forge_replay.api.names import (
    CATEGORIES,
    DNS1035_LABEL,
    GROUP,
    KIND,
    MAX_NAME_LENGTH,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
)
from forge_replay.api.status import ForgeReplayJobStatus

CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILE = f"crds/{CRD_NAME}.yaml"
MAX_CONDITIONS = 16
HEADER = "# Generated from the pydantic models by `forge-replay crd`; do not edit by hand.\n"

# Free-form maps: their contents are the user's (HF config, sglang flags), not ours to prune.
_FREE_FORM = {("model", "config"), ("rollout", "engineArgs"), ("scheduling", "affinity"),
              ("topologySpreadConstraints", "[]")}
# Kubernetes' own types (Affinity, TopologySpreadConstraint) are passed through to the Ray pod templates,
# where KubeRay's CRD schema and the API server check them.


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
            extra = {k: v for k, v in node.items() if k != "$ref"}
            target.update(extra)
            return _inline(target, defs)
        return {k: _inline(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def _structural(node: dict[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Rewrite one (inlined) JSON-schema node as a structural OpenAPI v3 schema node."""
    node = dict(node)
    node.pop("title", None)
    nullable = False
    if "anyOf" in node:
        alternatives = node.pop("anyOf")
        options = [o for o in alternatives if o.get("type") != "null"]
        nullable = len(options) < len(alternatives)
        if len(options) != 1:
            raise ValueError(f"{'.'.join(path)}: unions other than Optional[X] cannot be structural")
        merged = dict(options[0])
        merged.update({k: v for k, v in node.items() if k not in ("anyOf",)})
        node = merged
        node.pop("title", None)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("default", 0) is None:
        node.pop("default")
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in node and not isinstance(node[bound], bool):
            node[plain] = node.pop(bound)
            node[bound] = True
    if "enum" in node and "type" not in node:
        node["type"] = "string"

    if path[-2:] in _FREE_FORM or node.get("x-kubernetes-preserve-unknown-fields"):
        node = {
            "type": "object",
            "description": node.get("description", ""),
            "x-kubernetes-preserve-unknown-fields": True,
        }
    elif node.get("type") == "object":
        if "properties" in node:
            node["properties"] = {
                name: _structural(child, path + (name,)) for name, child in node["properties"].items()
            }
            node.pop("additionalProperties", None)
        elif isinstance(node.get("additionalProperties"), dict):
            node["additionalProperties"] = _structural(node["additionalProperties"], path + ("*",))
        elif node.get("additionalProperties") is True or "additionalProperties" not in node:
            node.pop("additionalProperties", None)
            node["x-kubernetes-preserve-unknown-fields"] = True
    elif node.get("type") == "array":
        node["items"] = _structural(node["items"], path + ("[]",))
        if node["items"].get("type") in ("string", "integer") and "enum" in node["items"]:
            node["x-kubernetes-list-type"] = "set"
    if nullable:
        node["nullable"] = True
    return node


def _node_at(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    node = schema
    for part in filter(None, dotted.split(".")):
        node = node["properties"][part]
    return node


def _add_object_defaults(node: dict[str, Any], model_cls: Any) -> None:
    """Give nested objects with default factories ``default: {}`` so the server fills their defaults."""
    from pydantic import BaseModel

    for name, field in model_cls.model_fields.items():
        alias = field.alias or name
        child = node.get("properties", {}).get(alias)
        if child is None:
            continue
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if field.default_factory is not None:
                child["default"] = {}
            _add_object_defaults(child, annotation)


def spec_schema() -> dict[str, Any]:
    """Structural schema of ``.spec``, with CEL rules."""
    raw = ForgeReplayJobSpec.model_json_schema(by_alias=True, mode="validation")
    schema = _structural(_inline(raw, raw.get("$defs", {})))
    _add_object_defaults(schema, ForgeReplayJobSpec)
    for rule in CROSS_FIELD_RULES:
        if rule.cel is None:  # the operator's and validate's alone
            continue
        node = _node_at(schema, rule.at)
        entry: dict[str, Any] = {"rule": rule.cel, "message": rule.message}
        if rule.field_path:
            entry["fieldPath"] = rule.field_path
        node.setdefault("x-kubernetes-validations", []).append(entry)
    return schema


def status_schema() -> dict[str, Any]:
    """Explicit structural schema of ``.status`` (so the server keeps what the operator writes)."""
    raw = ForgeReplayJobStatus.model_json_schema(by_alias=True, mode="serialization")
    schema = _structural(_inline(raw, raw.get("$defs", {})))
    conditions = schema["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    conditions["maxItems"] = MAX_CONDITIONS  # bounds the cost of the transition rules reading them
    conditions["items"].setdefault("required", ["type", "status"])
    return schema


def frozen_after_launch_rules() -> list[dict[str, Any]]:
    """Transition rules (root level: they read the old status) refusing a change to any spec field but those in
    MUTABLE_AFTER_LAUNCH once status.launchedGeneration is set: the operator's own refusal, in the API server.

    While SpecValid is False (a change the operator refused, or an invalid spec) the spec may change, so that
    it can be reverted or fixed. One rule per top-level field, so the error names it; each compares one
    subtree once (a cost linear in its size, well inside the per-rule budget)."""
    rules = []
    for name, field in ForgeReplayJobSpec.model_fields.items():
        if name in MUTABLE_AFTER_LAUNCH:
            continue
        key = field.alias or name
        rules.append({
            "rule": "!has(oldSelf.status) || !has(oldSelf.status.launchedGeneration) || "
                    # a change the operator refused (or an invalid spec) may still be reverted or fixed
                    "(has(oldSelf.status.conditions) && oldSelf.status.conditions.exists(c, c.type == 'SpecValid' "
                    "&& c.status == 'False')) || "
                    f"(has(self.spec.{key}) == has(oldSelf.spec.{key}) && "
                    f"(!has(self.spec.{key}) || self.spec.{key} == oldSelf.spec.{key}))",
            "message": f"spec.{key} cannot change once the job is launched (status.launchedGeneration is set); "
                       f"only {', '.join('spec.' + m for m in sorted(MUTABLE_AFTER_LAUNCH))} may. Revert the change, "
                       "or delete and re-create the ForgeReplayJob to run the new spec",
            "fieldPath": f".spec.{key}",
            "reason": "FieldValueForbidden",
        })
    return rules


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    root = {
        "type": "object",
        "description": "A replay-mode RL training job: sglang engines plus a torch trainer that replays dumped rollouts.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "forgereplay.io/v1alpha1"},
            "kind": {"type": "string", "description": "ForgeReplayJob"},
            "metadata": {"type": "object"},  # the API server refuses anything more on metadata
            "spec": spec_schema(),
            "status": status_schema(),
        },
        "x-kubernetes-validations": [
            {
                "rule": f"!has(self.metadata.name) || self.metadata.name.size() <= {MAX_NAME_LENGTH}",
                "message": f"metadata.name: at most {MAX_NAME_LENGTH} characters (KubeRay's RayJob name limit)",
            },
            {
                "rule": f"!has(self.metadata.name) || self.metadata.name.matches('{DNS1035_LABEL}')",
                "message": "metadata.name: must be a DNS-1035 label (lowercase letters, digits, '-'; starts with a letter)",
            },
            *frozen_after_launch_rules(),
        ],
    }
    root["properties"]["spec"]["description"] = "The desired replay job."
    root["properties"]["status"]["description"] = "Observed state, written by the operator."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "forge-replay", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": CATEGORIES,
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
                         "description": "Why the job is not ready (or Succeeded)"},
                        {"name": "Mode", "type": "string", "jsonPath": ".spec.replay.mode"},
                        {"name": "Done", "type": "integer", "jsonPath": ".status.rollouts.completed",
                         "description": "Rollouts trained"},
                        # The operator's total (the launched spec's), not the spec: a refused change shows nothing.
                        {"name": "Rollouts", "type": "integer", "jsonPath": ".status.rollouts.total",
                         "description": "Rollouts to train"},
                        {"name": "Peak GiB", "type": "number", "jsonPath": ".status.memory.peakAllocatedGiB",
                         "description": "Peak GPU memory allocated by any rank"},
                        {"name": "Points", "type": "integer", "jsonPath": ".status.sweep.pointsDone",
                         "description": "Sweep points measured (spec.sweep)", "priority": 1},
                        {"name": "Frontier", "type": "string", "jsonPath": ".status.sweep.summary",
                         "description": "The sweep's frontier so far (spec.sweep)", "priority": 1},
                        {"name": "Outcome", "type": "string", "jsonPath": ".status.outcome",
                         "description": "fits, overBudget, outOfMemory or failed, once the run has ended"},
                        # -o wide (priority 1): why it waits or why it ended, at a glance.
                        {"name": "Cluster", "type": "string", "priority": 1,
                         "jsonPath": '.status.conditions[?(@.type=="ClusterReady")].reason',
                         "description": "Why the Ray cluster is not ready: Queued, PodsNotReady, ImagePullFailed, ..."},
                        {"name": "Queue", "type": "string", "priority": 1, "jsonPath": ".spec.scheduling.queueName",
                         "description": "The Kueue LocalQueue"},
                        {"name": "Admitted", "type": "date", "priority": 1, "jsonPath": ".status.admissionTime",
                         "description": "When the job was let start (Kueue admitted it, or its RayJob was created)"},
                        {"name": "Expectations", "type": "string", "priority": 1,
                         "jsonPath": '.status.conditions[?(@.type=="ExpectationsMet")].reason',
                         "description": "The verdict on spec.expect"},
                        {"name": "RayCluster", "type": "string", "priority": 1, "jsonPath": ".status.rayClusterName"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                        {"name": "Message", "type": "string", "priority": 1, "jsonPath": ".status.message",
                         "description": "What is happening now, or why it failed and what to do"},
                    ],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as the YAML committed in crds/ (header comment included)."""
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=120)
