"""Shared fixtures for the tests that run a real local Ray."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray (2 CPUs) for the module, unless one is running already; shut down only if started here."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    if started:
        ray.shutdown()
