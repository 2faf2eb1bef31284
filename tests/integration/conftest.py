"""Fixtures shared by the cluster tests of the PDDeployment CRD and the operator."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from e2e.harness.cluster import LocalCluster
from tests.integration.pdd import CRD_PATH, FAST_SETTINGS

from xpyd_api.testing import ProgramProcess
from xpyd_operator.testing import EngineStub, OperatorProcess


@pytest.fixture(scope="session")
def pdd_crd(kube_cluster: LocalCluster) -> str:
    """Installs the CRD once per session and waits until the API server serves it; returns its name."""
    return kube_cluster.install_crd(CRD_PATH)


@pytest.fixture
def started_processes() -> Iterator[list[ProgramProcess]]:
    """Programs (operator, controller) a test started: each is killed at teardown and its log tail printed."""
    started: list[ProgramProcess] = []
    yield started
    for process in started:
        process.kill()
        print(f"--- {process.log_path.name} ---\n{process.log_tail(100)}")


@pytest.fixture
def start_operator(
    kube_cluster: LocalCluster, namespace: str, tmp_path: Path, started_processes: list[ProgramProcess]
) -> Callable[..., OperatorProcess]:
    """Starts operator processes for this test's namespace (XPYD_* settings over FAST_SETTINGS); every
    one is stopped at teardown."""

    def start(**settings: str) -> OperatorProcess:
        env = {**FAST_SETTINGS, **settings}
        process = OperatorProcess(kube_cluster.env(), tmp_path / "operator.log", [namespace], env)
        process.start()
        started_processes.append(process)
        return process

    return start


@pytest.fixture
def engines() -> Iterator[EngineStub]:
    with EngineStub() as stub:
        yield stub
