"""The runtime's input: the validated job plus where its volumes are mounted."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field, ValidationError

from forge_replay.api import paths
from forge_replay.api.base import ApiModel
from forge_replay.api.job import ForgeReplayJob
from forge_replay.api.names import Problem, SpecInvalid
from forge_replay.api.parse import problems_from


class RuntimeConfig(ApiModel):
    """What `python -m forge_replay.runtime --config FILE` reads (the operator mounts it from a ConfigMap)."""

    job: ForgeReplayJob = Field(description="The validated ForgeReplayJob (metadata and spec).")
    dumps_root: str = Field(default=paths.DUMPS_MOUNT, description="Where the dumps PVC is mounted.")
    results_dir: str | None = Field(default=paths.RESULTS_MOUNT, description="Where reports are written.")
    model_root: str | None = Field(default=paths.MODEL_MOUNT, description="Where the model PVC is mounted.")
    engine_command: str | None = Field(
        default=None, description="Replaces `python -m sglang.launch_server` (any sglang-compatible server)."
    )
    progress_configmap: str | None = Field(
        default=None, description="ConfigMap (in the job's namespace) the runtime patches with progress."
    )
    baseline_path: str | None = Field(
        default=None, description="The baseline report.json of spec.expect.baseline (mounted, or --baseline FILE)."
    )
    history_root: str | None = Field(
        default=None,
        description="The results root whose run folders hold the history of spec.expect.baseline.history (the results "
        "claim's root; locally, the parent of the run's folder).",
    )
    verify_record: str | None = Field(
        default=None,
        description="The verify Job's record of the dumps it checked (on the results claim): the pre-flight trusts "
        "the files it holds unchanged and verifies the rest.",
    )

    def to_yaml(self) -> str:
        """Serialize as the YAML the runtime reads back."""
        doc = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        # Top-level None is meaningful (no results dir, no model volume): keep it, or it would read back as the default.
        for name, field in type(self).model_fields.items():
            if name != "job" and not (name in ("baseline_path", "verify_record", "history_root") and getattr(self, name) is None):
                doc[field.alias or name] = getattr(self, name)
        return yaml.safe_dump(doc, sort_keys=False)

    @classmethod
    def from_file(cls, path: str | Path) -> RuntimeConfig:
        """Read and validate a runtime config file; errors name the file and the field."""
        try:
            doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise SpecInvalid([Problem("", f"{path}: cannot read runtime config: {exc}")]) from None
        try:
            return cls.model_validate(doc)
        except ValidationError as exc:
            raise SpecInvalid(problems_from(exc, cls)) from None
