pytest_plugins = ["tests.cluster.fixtures"]
