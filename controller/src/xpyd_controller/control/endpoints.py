"""Which Prometheus URLs a tenant may make the controller call (pure: strings in, a reason out).

The URL comes from a PDDeployment, so it is tenant input: without a check, one spec makes the controller
GET any address it can reach, cloud metadata services included. Allowed: http or https, a host and an
optional port and path, no user info, query or fragment; never a link-local, unspecified, multicast or
cloud metadata address; and, when the operator of the controller configured an allow-list, only URLs under
one of its prefixes. `url_problem` reads the URL as written (the CRD's CEL rules refuse the same literal
hosts at admission); `resolved_problem` checks the addresses its host name resolves to, at use, since a
name (or a numeric form such as 2852039166) can lead to the same addresses. An allow-list is the way to
pin names.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

_URL = re.compile(
    r"(?P<scheme>https?)://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::(?P<port>[0-9]{1,5}))?(?P<path>/[A-Za-z0-9._~/-]*)?"
)
# Cloud metadata services reachable from pods (AWS, GCP, Azure, OpenStack: 169.254.169.254 and its IPv6
# forms; Alibaba 100.100.100.200), by address and by the names they answer to.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
METADATA_NAMES = frozenset({"metadata", "metadata.google.internal", "metadata.goog", "instance-data"})


def url_host(url: str) -> str | None:
    """The host `url` names (lower case, without brackets or a trailing dot); None if it is no URL."""
    match = _URL.fullmatch(url)
    return match["host"].strip("[]").rstrip(".").lower() if match else None


def refused_address(text: str) -> tuple[str, str] | None:
    """(the address, what it is) when the controller must not connect to it; None when it may, or when
    `text` is no address. An IPv4-mapped IPv6 address is judged as the IPv4 address it carries."""
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])  # without an IPv6 zone
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address in METADATA_ADDRESSES:
        return str(address), "a cloud metadata service"
    if address.is_link_local or address.is_unspecified or address.is_multicast:
        return str(address), "a link-local, unspecified or multicast address"
    if address == ipaddress.IPv4Address("255.255.255.255"):
        return str(address), "the broadcast address"
    return None


def url_problem(url: str, allow: Sequence[str] = ()) -> str | None:
    """None when the controller may query `url`, else why not (naming the value and the rule)."""
    match = _URL.fullmatch(url)
    host = url_host(url)
    if match is None or host is None:
        return f"{url!r} is not an http(s)://host[:port][/path] URL (no user info, query or fragment)"
    if match["port"] and not 1 <= int(match["port"]) <= 65535:
        return f"{url!r}: port {match['port']} is out of range"
    if host in METADATA_NAMES:
        return f"{url!r}: {host} is a cloud metadata service"
    if refused := refused_address(host):
        return f"{url!r}: {refused[0]} is {refused[1]}"
    if allow and not any(url == prefix or url.startswith(prefix.rstrip("/") + "/") for prefix in allow):
        return f"{url!r} is not under an allowed Prometheus URL ({', '.join(allow)})"
    return None


def resolved_problem(url: str, addresses: Sequence[str]) -> str | None:
    """None when none of the addresses `url`'s host resolved to is refused, else why (naming the host)."""
    host = url_host(url)
    for address in addresses:
        if refused := refused_address(address):
            return f"{url!r}: host {host} resolves to {refused[0]}, {refused[1]}"
    return None
