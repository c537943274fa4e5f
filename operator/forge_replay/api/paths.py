"""Fixed mount points inside runtime pods (the operator mounts, the runtime reads)."""

DUMPS_MOUNT = "/mnt/forge-replay/dumps"  # dumps PVC, read-only
MODEL_MOUNT = "/mnt/forge-replay/model"  # model PVC, read-only
RESULTS_MOUNT = "/mnt/forge-replay/results"  # results PVC, read-write
BASELINE_MOUNT = "/mnt/forge-replay/baseline"  # spec.expect.baseline: its ConfigMap or PVC, read-only
CONFIG_DIR = "/etc/forge-replay"  # the job's ConfigMap
CONFIG_FILE = "config.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
