"""A Markdown field reference generated from the CRD schema (so the docs cannot drift from the models)."""

from __future__ import annotations

import json
from typing import Any

from forge_replay.api.crd import crd
from forge_replay.api.job import CROSS_FIELD_RULES

REFERENCE_FILE = "docs/api-reference.md"


def _type_of(node: dict[str, Any]) -> str:
    kind = node.get("type", "")
    if "enum" in node:
        kind = " \\| ".join(f"`{v}`" for v in node["enum"])
    elif kind == "array":
        kind = f"list of {_type_of(node['items'])}"
    elif kind == "object" and "additionalProperties" in node:
        kind = f"map of {_type_of(node['additionalProperties'])}"
    elif node.get("x-kubernetes-preserve-unknown-fields"):
        kind = "free-form map"
    return kind


def _bounds(node: dict[str, Any]) -> str:
    parts = []
    if "minimum" in node:
        parts.append((">" if node.get("exclusiveMinimum") else ">=") + f" {node['minimum']}")
    if "maximum" in node:
        parts.append(f"<= {node['maximum']}")
    if "maxLength" in node:
        parts.append(f"length <= {node['maxLength']}")
    if "pattern" in node:
        parts.append("pattern")
    return ", ".join(parts)


def _rows(node: dict[str, Any], path: str, required: set[str]) -> list[str]:
    rows = []
    for name, child in node.get("properties", {}).items():
        here = f"{path}.{name}"
        default = child.get("default")
        shown = "" if default is None or default == {} else f"`{json.dumps(default)}`"
        req = "yes" if name in required else ""
        desc = child.get("description", "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{here}` | {_type_of(child)} | {req} | {shown} | {_bounds(child)} | {desc} |")
        if child.get("type") == "object" and "properties" in child:
            rows += _rows(child, here, set(child.get("required", [])))
        if child.get("type") == "array" and "properties" in child.get("items", {}):
            rows += _rows(child["items"], here + "[]", set(child["items"].get("required", [])))
    return rows


def markdown() -> str:
    """The reference page."""
    root = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    lines = [
        "# ForgeReplayJob v1alpha1 field reference",
        "",
        "Generated from the pydantic models (`python -m forge_replay.api.reference > docs/api-reference.md`);",
        "a test fails when it drifts. `kubectl explain frj.spec.replay` shows the same descriptions.",
        "",
    ]
    for section in ("spec", "status"):
        node = root["properties"][section]
        lines += [f"## {section}", "", "| field | type | required | default | bounds | description |",
                  "|---|---|---|---|---|---|"]
        lines += _rows(node, section, set(node.get("required", [])))
        lines.append("")
    lines += ["## Cross-field rules", "", "Checked by the operator and `forge-replay validate` (pydantic) and by",
              "the API server (CEL), with the same field path:", ""]
    lines += [f"- {rule.message}" for rule in CROSS_FIELD_RULES if rule.cel is not None]
    lines += ["- metadata.name: a DNS-1035 label of at most 47 characters (KubeRay's RayJob name limit)", ""]
    lines += ["Checked by the operator and `forge-replay validate` only, before anything is created (arithmetic over",
              "the values in spec.trainer.args, a logarithm, every sweep point's whole spec: beyond what a CEL rule may",
              "cost or express):", ""]
    lines += [f"- {rule.message}" for rule in CROSS_FIELD_RULES if rule.cel is None]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(markdown(), end="")
