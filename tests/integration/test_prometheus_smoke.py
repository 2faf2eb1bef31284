"""The harness's Prometheus is real: it scrapes an exporter on loopback and answers PromQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from e2e.harness import PrometheusServer
from e2e.harness.loopback import exposition_handler, loopback_server
from e2e.harness.procs import wait_until
from e2e.harness.prometheus import scrape_config

pytestmark = pytest.mark.prometheus

EXPORTED_VALUE = 1234.5


def _exposition() -> str:
    return f'# TYPE xpyd_smoke_value gauge\nxpyd_smoke_value{{role="decode"}} {EXPORTED_VALUE}\n'


@pytest.fixture
def exporter() -> Iterator[str]:
    with loopback_server(exposition_handler(_exposition)) as address:
        yield address


def test_prometheus_scrapes_exporter_and_answers_promql(
    prometheus_factory: Callable[[dict[str, Any]], PrometheusServer], exporter: str
) -> None:
    prom = prometheus_factory(scrape_config([exporter]))
    wait_until(lambda: bool(prom.query("xpyd_smoke_value")), 60, "the first scrape of the exporter")
    result = prom.query('sum by (role) (xpyd_smoke_value{job="xpyd-test"})')
    assert [(r["metric"]["role"], float(r["value"][1])) for r in result] == [("decode", EXPORTED_VALUE)]
    assert prom.targets_up() == 1
