import os

from hypothesis import settings

pytest_plugins = ["tests.cluster.fixtures"]

# CI (.ci/run) draws the same examples every run, so a landing is decided by the code, not by the draw; runs
# elsewhere keep exploring, and print the blob that reproduces whatever they find.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# tests/e2e runs real pods on the test cluster's real node (scripts/e2e, not CI: it needs one-time builds of
# about an hour and images of several GB). scripts/e2e sets FORGE_REPLAY_E2E=1; otherwise it is not collected.
collect_ignore = [] if os.environ.get("FORGE_REPLAY_E2E") == "1" else ["e2e"]


def pytest_collection_modifyitems(config, items):
    """Tests that need the control plane run last: on a fresh machine scripts/test builds it in the background
    while everything else runs (the order is stable otherwise, and the same in every xdist worker)."""
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)
