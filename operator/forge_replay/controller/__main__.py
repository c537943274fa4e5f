"""`python -m forge_replay.controller [--namespace NS ...]`: the operator, as in the container image."""

from forge_replay.controller.cli import operator

if __name__ == "__main__":
    operator(prog_name="python -m forge_replay.controller")
