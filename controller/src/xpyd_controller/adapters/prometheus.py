"""The controller's only Prometheus I/O: instant queries, each reduced to one number or None.

Strict like KEDA's scaler: an HTTP error, an empty answer, more than one series, NaN or ±Inf is None
("no data"), never 0. A server that cannot be reached is asked nothing more in that pass, so a dead
Prometheus costs one timeout per decision, not one per query; and all of one decision's queries share a
time budget, so a server that accepts connections and answers slowly (or never) costs at most that.
`last_error` keeps why, for the status. `addresses` says where the URL's host name leads now (the system
resolver), so the loop can refuse a name that resolves to a link-local or metadata address before asking;
and every connection checks the address it actually reached, so a name that resolves elsewhere between
that check and the query (DNS rebinding) is refused too.
"""

from __future__ import annotations

import math
import socket
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.adapters import HTTPAdapter
from requests.exceptions import RequestException
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import NewConnectionError
from urllib3.util.retry import Retry

from xpyd_controller.control.endpoints import refused_address

TIMEOUT_SECONDS = 5
BUDGET_SECONDS = 5.0  # all queries of one decision together
Key = TypeVar("Key")
Resolver = Callable[[str], Sequence[str]]  # host name -> the addresses it resolves to


def resolve_host(host: str) -> list[str]:
    """Every address the system resolver gives `host` (an address resolves to itself); none when it does
    not resolve, and the query then fails and says so."""
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return sorted({str(sockaddr[0]) for *_, sockaddr in found})


class RefusedPeerError(NewConnectionError):
    """A connection reached an address the controller must not query; `why` says which."""

    def __init__(self, connection: HTTPConnection, why: str) -> None:
        super().__init__(connection, why)
        self.why = why


def checked_peer(connection: HTTPConnection, sock: socket.socket) -> socket.socket:
    """`sock` when the address it reached may be queried; else it is closed and the connection fails."""
    refused = refused_address(str(sock.getpeername()[0]))
    if refused is None:
        return sock
    sock.close()
    raise RefusedPeerError(connection, f"{connection.host} reached {refused[0]}, {refused[1]}")


def _unreachable(error: RequestException) -> str:
    """Why a request failed: a refused peer's reason, else the error's type."""
    reason = getattr(error.args[0], "reason", None) if error.args else None
    return f"refused: {reason.why}" if isinstance(reason, RefusedPeerError) else type(error).__name__


class _CheckedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        return checked_peer(self, super()._new_conn())


class _CheckedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        return checked_peer(self, super()._new_conn())


class _CheckedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _CheckedHTTPConnection


class _CheckedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _CheckedHTTPSConnection


class CheckedPeerAdapter(HTTPAdapter):
    """requests' adapter whose connections refuse to talk to a link-local, metadata or similar address,
    whatever name led there."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _CheckedHTTPPool, "https": _CheckedHTTPSPool}


class PrometheusSource:
    """One Prometheus server; `query_all` never raises for a bad answer or an unreachable server."""

    def __init__(
        self,
        url: str,
        headers: dict[str, str] | None = None,
        budget_s: float = BUDGET_SECONDS,
        resolve: Resolver = resolve_host,
    ) -> None:
        self.url = url
        self.budget_s = budget_s
        self._resolve = resolve
        session = requests.Session()
        self._client = PrometheusConnect(
            url=url, headers=headers, retry=Retry(total=0), timeout=TIMEOUT_SECONDS, session=session
        )
        session.mount(url, CheckedPeerAdapter(max_retries=Retry(total=0)))  # replaces the client's own
        self.last_error: str | None = None

    def addresses(self) -> Sequence[str]:
        """The addresses the URL's host resolves to now."""
        host = urllib.parse.urlsplit(self.url).hostname
        return self._resolve(host) if host else ()

    def query_all(self, queries: Mapping[Key, str]) -> dict[Key, float | None]:
        """Every query's value (None for no data); stops asking after a connection failure or when
        the time budget is spent."""
        answers: dict[Key, float | None] = dict.fromkeys(queries)
        self.last_error = None
        deadline = time.monotonic() + self.budget_s
        for key, promql in queries.items():
            left = deadline - time.monotonic()
            if left <= 0:
                self.last_error = f"Prometheus at {self.url} too slow: {self.budget_s:g} s budget spent"
                break
            try:
                answers[key] = single_value(
                    self._client.custom_query(promql, timeout=min(TIMEOUT_SECONDS, left))
                )
            except PrometheusApiClientException as error:
                self.last_error = f"Prometheus at {self.url} rejected a query: {error}"
            except RequestException as error:
                self.last_error = f"Prometheus at {self.url} unreachable: {_unreachable(error)}"
                break
        return answers


def single_value(result: Any) -> float | None:
    """The value of a one-series instant-vector answer; None for anything else."""
    if not isinstance(result, list) or len(result) != 1 or not isinstance(result[0], dict):
        return None
    try:
        number = float(result[0]["value"][1])  # {"metric": {...}, "value": [timestamp, "value"]}
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return number if math.isfinite(number) else None
