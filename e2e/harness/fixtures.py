"""Pytest fixtures over the harness: one cluster per session, a fresh namespace per test, Prometheus."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from e2e.harness.cluster import LocalCluster, start_cluster
from e2e.harness.prometheus import PrometheusServer, start_prometheus

# CI sets this: a skipped test there is a hole in coverage, not a pass.
FORBID_SKIPS_ENV = "XPYD_FORBID_SKIPS"


@pytest.fixture(scope="session")
def kube_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A real cluster (kwok by default) shared by the whole session; component logs dumped on failure."""
    with start_cluster(nodes=3) as cluster:
        yield cluster
        if request.session.testsfailed:
            cluster.dump_logs()


@pytest.fixture(scope="session")
def k8s_api(kube_cluster: LocalCluster) -> Iterator[Any]:
    """A `kubernetes.client.ApiClient` for the session's cluster."""
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(kube_cluster.kubeconfig))
    yield client
    client.close()


@pytest.fixture
def namespace(kube_cluster: LocalCluster) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (without waiting for finalization)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    kube_cluster.kubectl("create", "namespace", name)
    yield name
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def prometheus_factory() -> Iterator[Callable[[dict[str, Any]], PrometheusServer]]:
    """Start real Prometheus servers with the configs a test gives; all are stopped at teardown."""
    with contextlib.ExitStack() as stack:
        yield lambda config: stack.enter_context(start_prometheus(config))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    if os.environ.get(FORBID_SKIPS_ENV) == "1" and skipped:
        terminalreporter.write_line(
            f"{len(skipped)} test(s) skipped while {FORBID_SKIPS_ENV}=1: skipped tests fail CI", red=True
        )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if os.environ.get(FORBID_SKIPS_ENV) == "1" and skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
