"""forge-replay: replay-mode RL training jobs on Kubernetes (KubeRay) or on one machine (local Ray)."""

__version__ = "0.1.0"
