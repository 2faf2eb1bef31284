"""Repository-wide pytest configuration: the real-cluster and Prometheus fixtures of the harness."""

pytest_plugins = ["e2e.harness.fixtures"]
