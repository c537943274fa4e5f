import os

from hypothesis import settings

pytest_plugins = ["tests.cluster.fixtures"]

# CI (.ci/run) draws the same examples every run, so a landing is decided by the code, not by the draw; runs
# elsewhere keep exploring, and print the blob that reproduces whatever they find.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_collection_modifyitems(config, items):
    """Tests that need the control plane run last: on a fresh machine scripts/test builds it in the background
    while everything else runs (the order is stable otherwise, and the same in every xdist worker)."""
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)
