"""Pytest fixtures over the harness: one cluster per session, a fresh namespace per test, Prometheus."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from e2e.harness.cluster import LocalCluster, cluster_provider, start_cluster
from e2e.harness.prometheus import PrometheusServer, start_prometheus

# CI sets this: a skipped test there is a hole in coverage, not a pass.
FORBID_SKIPS_ENV = "XPYD_FORBID_SKIPS"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The `kind` group runs on real pods and everything else on kwok: each provider deselects the other
    group (deselected, not skipped, so that XPYD_FORBID_SKIPS still means what it says)."""
    on_kind = cluster_provider() == "kind"
    selected = [item for item in items if (item.get_closest_marker("kind") is not None) == on_kind]
    if len(selected) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in selected])
        items[:] = selected


@pytest.fixture(scope="session")
def kube_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A real cluster (kwok by default) shared by the whole session; component logs dumped on failure."""
    with start_cluster(nodes=3) as cluster:
        yield cluster
        if request.session.testsfailed:
            cluster.dump_logs()


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


def _forbidden_skips(reporter: Any) -> int:
    """How many tests were skipped while CI forbids skips (0 when skips are allowed)."""
    if os.environ.get(FORBID_SKIPS_ENV) != "1" or reporter is None:
        return 0
    return len(reporter.stats.get("skipped", []))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int) -> None:
    if skipped := _forbidden_skips(terminalreporter):
        terminalreporter.write_line(
            f"{skipped} test(s) skipped while {FORBID_SKIPS_ENV}=1: skipped tests fail CI", red=True
        )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if _forbidden_skips(reporter) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
