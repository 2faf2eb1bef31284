"""Local test infrastructure: a real Kubernetes control plane (kwok / kind / existing) and a real Prometheus.

Importable by tests (through the fixtures in tests/conftest.py) and by the demo. Everything started here is
torn down by pid in a `finally`, even on failure or Ctrl-C.
"""

from e2e.harness.cluster import ClusterError, LocalCluster, cluster_provider, start_cluster
from e2e.harness.prometheus import PrometheusServer, start_prometheus
from e2e.harness.testbin import testbin_dir

__all__ = [
    "ClusterError",
    "LocalCluster",
    "PrometheusServer",
    "cluster_provider",
    "start_cluster",
    "start_prometheus",
    "testbin_dir",
]
