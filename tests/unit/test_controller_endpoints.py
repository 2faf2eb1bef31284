"""Which Prometheus URLs a PDDeployment may make the controller call."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from e2e.harness.loopback import exposition_handler, loopback_server
from urllib3.connection import HTTPConnection

from xpyd_controller.adapters import prometheus
from xpyd_controller.adapters.prometheus import RefusedPeerError, checked_peer, resolve_host
from xpyd_controller.control.endpoints import resolved_problem, url_host, url_problem

ALLOWED = [
    "http://prometheus.monitoring.svc:9090",
    "https://prom.example.com/api/prom",
    "http://127.0.0.1:9090",
    "http://[::1]:9090/",
    "http://10.0.0.7:9090",
]
REFUSED = [
    ("http://169.254.169.254/latest/meta-data", "cloud metadata"),
    ("http://[fd00:ec2::254]/", "cloud metadata"),
    ("http://100.100.100.200/", "cloud metadata"),
    ("http://metadata.google.internal/computeMetadata/v1", "cloud metadata"),
    ("http://169.254.10.1:9090", "link-local"),
    ("http://[fe80::1]:9090", "link-local"),
    ("http://0.0.0.0:9090", "unspecified"),
    ("http://255.255.255.255:9090", "broadcast"),
    ("http://[::ffff:169.254.169.254]/", "cloud metadata"),
    ("http://metadata.google.internal./", "cloud metadata"),
    ("file:///etc/passwd", "not an http(s)"),
    ("gopher://prom:70", "not an http(s)"),
    ("http://user:pw@prom:9090", "not an http(s)"),
    ("http://prom:9090/?query=up", "not an http(s)"),
    ("http://prom:99999", "out of range"),
]


@pytest.mark.parametrize("url", ALLOWED)
def test_ordinary_prometheus_urls_are_allowed(url: str) -> None:
    assert url_problem(url) is None


@pytest.mark.parametrize(("url", "why"), REFUSED)
def test_link_local_metadata_and_odd_urls_are_refused(url: str, why: str) -> None:
    problem = url_problem(url)
    assert problem is not None and why in problem and repr(url) in problem


def test_an_allow_list_admits_only_urls_under_its_prefixes() -> None:
    allow = ["http://prometheus.monitoring.svc:9090"]
    assert url_problem("http://prometheus.monitoring.svc:9090", allow) is None
    assert url_problem("http://prometheus.monitoring.svc:9090/sub", allow) is None
    assert "not under an allowed" in (url_problem("http://prom", ["http://pro"]) or "")  # whole segments
    assert "not under an allowed" in (url_problem("http://other:9090", allow) or "")


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("2852039166", "169.254.169.254"),
        ("0xa9fea9fe", "169.254.169.254"),
        ("0251.0376.0251.0376", "169.254.169.254"),
    ],
)
def test_numeric_names_the_system_resolver_turns_into_metadata_addresses_are_refused_at_use(
    host: str, address: str
) -> None:
    url = f"http://{host}/"
    assert url_problem(url) is None  # not an address as written: a name
    assert resolve_host(host) == [address]
    assert (
        resolved_problem(url, resolve_host(host))
        == f"{url!r}: host {host} resolves to {address}, a cloud metadata service"
    )


def test_ordinary_resolved_addresses_pass() -> None:
    assert resolved_problem("http://localhost:9090", resolve_host("localhost")) is None
    assert resolved_problem("http://prom:9090", []) is None  # unresolvable: the query fails and says so


def test_the_crd_admits_exactly_the_urls_the_controller_can_read() -> None:
    crd = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "crds" / "pddeployments.xpyd.dev.yaml").read_text()
    )
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    pattern = spec["properties"]["autoscaling"]["properties"]["prometheus"]["properties"]["url"]["pattern"]
    odd = ["http://a]b[:9", "http://a:b:c", "http://[zz]:1", "http://h:123456", "http://h:/", "http://[::1]x"]
    for url in [*ALLOWED, *(url for url, _ in REFUSED), *odd]:
        assert (re.fullmatch(pattern, url) is not None) == (url_host(url) is not None), url


class PeerAt:
    """A connected socket's stand-in: where it reached, and whether it was closed."""

    def __init__(self, address: str) -> None:
        self.address, self.closed = address, False

    def getpeername(self) -> tuple[str, int]:
        return self.address, 9090

    def close(self) -> None:
        self.closed = True


def test_a_connection_that_reaches_a_refused_address_is_closed_whatever_name_led_there() -> None:
    connection = HTTPConnection("prometheus.tenant.example", 9090)
    fine = PeerAt("10.0.0.9")
    assert checked_peer(connection, fine) is fine and not fine.closed  # type: ignore[arg-type]
    reached = {
        "169.254.169.254": "169.254.169.254",
        "fe80::1": "fe80::1",
        "::ffff:169.254.169.254": "169.254.169.254",
    }
    for address, shown in reached.items():
        sock = PeerAt(address)
        with pytest.raises(RefusedPeerError, match=re.escape(f"prometheus.tenant.example reached {shown}, ")):
            checked_peer(connection, sock)  # type: ignore[arg-type]
        assert sock.closed


def test_the_prometheus_adapter_checks_the_peer_of_every_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name that resolved to an allowed address at the decision's check and to a refused one when the
    query connects (DNS rebinding): the query is not sent, and the status says why."""
    answered = []
    with loopback_server(exposition_handler(lambda: answered.append(1) or "")) as address:
        monkeypatch.setattr(
            prometheus,
            "refused_address",
            lambda text: (text, "refused here") if text == "127.0.0.1" else None,
        )
        source = prometheus.PrometheusSource(f"http://{address}", resolve=lambda host: ["10.0.0.9"])
        assert source.addresses() == ["10.0.0.9"]
        assert source.query_all({"q": "up"}) == {"q": None}
    assert answered == []
    assert (
        source.last_error
        == f"Prometheus at http://{address} unreachable: refused: 127.0.0.1 reached 127.0.0.1, refused here"
    )
