"""Fixed names the operator and the runtime share: mount points inside runtime pods (the operator mounts, the
runtime reads) and the Ray resource of engine pods (the operator's rollout pods offer it, engines take it)."""

DUMPS_MOUNT = "/mnt/forge-replay/dumps"  # dumps PVC, read-only
MODEL_MOUNT = "/mnt/forge-replay/model"  # model PVC, read-only
RESULTS_MOUNT = "/mnt/forge-replay/results"  # results PVC, read-write
BASELINE_MOUNT = "/mnt/forge-replay/baseline"  # spec.expect.baseline: its ConfigMap or PVC, read-only
CONFIG_DIR = "/etc/forge-replay"  # the job's ConfigMap
CONFIG_FILE = "config.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"

ENGINE_RAY_RESOURCE = "forge_replay_engine"
"""Custom Ray resource of each rollout pod (one per pod): every engine actor takes one when the Ray cluster offers
it, so engines run on the rollout pods even when they take no GPU (``trainer.gpusPerNode: 0``)."""
