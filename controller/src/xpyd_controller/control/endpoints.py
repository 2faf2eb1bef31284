"""Which Prometheus URLs a tenant may make the controller call (pure: strings in, a reason out).

The URL comes from a PDDeployment, so it is tenant input: without a check, one spec makes the controller
GET any address it can reach, cloud metadata services included. Allowed: http or https, a host and an
optional port and path, no user info, query or fragment; never a link-local, unspecified or cloud
metadata address; and, when the operator of the controller configured an allow-list, only URLs under one
of its prefixes. Host names are compared as written (they are not resolved here): an allow-list is the
way to pin names.
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


def url_problem(url: str, allow: Sequence[str] = ()) -> str | None:
    """None when the controller may query `url`, else why not (naming the value and the rule)."""
    match = _URL.fullmatch(url)
    if match is None:
        return f"{url!r} is not an http(s)://host[:port][/path] URL (no user info, query or fragment)"
    host = match["host"].strip("[]").rstrip(".").lower()
    if match["port"] and not 1 <= int(match["port"]) <= 65535:
        return f"{url!r}: port {match['port']} is out of range"
    if host in METADATA_NAMES:
        return f"{url!r}: {host} is a cloud metadata service"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        if address in METADATA_ADDRESSES:
            return f"{url!r}: {address} is a cloud metadata service"
        if address.is_link_local or address.is_unspecified or address.is_multicast:
            return f"{url!r}: {address} is a link-local, unspecified or multicast address"
    if allow and not any(url == prefix or url.startswith(prefix.rstrip("/") + "/") for prefix in allow):
        return f"{url!r} is not under an allowed Prometheus URL ({', '.join(allow)})"
    return None
