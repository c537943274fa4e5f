import os

from hypothesis import settings

pytest_plugins = ["tests.cluster.fixtures"]

# CI (.ci/run) draws the same examples every run, so a landing is decided by the code, not by the draw; runs
# elsewhere keep exploring, and print the blob that reproduces whatever they find.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
