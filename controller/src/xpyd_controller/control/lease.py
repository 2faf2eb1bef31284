"""Leader election on a coordination.k8s.io Lease: the record arithmetic (pure) and the elector over a
small port. Writes use the Lease's resourceVersion, so of two candidates only one can win a round.

A holder renews its lease every pass; a candidate takes it over only once `renewTime` is older than the
lease duration (or the holder released it on shutdown by clearing `holderIdentity`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseRecord:
    holder: str  # "" when released
    duration_s: float
    acquired: float  # epoch seconds
    renewed: float
    transitions: int = 0
    resource_version: str = ""  # of the Lease object it was read from ("" for a new one)

    def expired(self, now: float) -> bool:
        return not self.holder or now - self.renewed > self.duration_s


def _micro_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(text: str | None) -> float:
    if not text:
        return 0.0
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def lease_spec(record: LeaseRecord) -> dict[str, Any]:
    return {
        "holderIdentity": record.holder,
        "leaseDurationSeconds": max(1, round(record.duration_s)),
        "acquireTime": _micro_time(record.acquired),
        "renewTime": _micro_time(record.renewed),
        "leaseTransitions": record.transitions,
    }


def parse_lease(lease: dict[str, Any]) -> LeaseRecord:
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder=spec.get("holderIdentity") or "",
        duration_s=float(spec.get("leaseDurationSeconds") or 0),
        acquired=_epoch(spec.get("acquireTime")),
        renewed=_epoch(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=(lease.get("metadata") or {}).get("resourceVersion", ""),
    )


def claim(current: LeaseRecord | None, identity: str, now: float, duration_s: float) -> LeaseRecord | None:
    """The record to write to hold the lease now, or None while another holder's lease is valid."""
    if current is None:
        return LeaseRecord(identity, duration_s, now, now)
    if current.holder == identity:
        return replace(current, duration_s=duration_s, renewed=now)
    if not current.expired(now):
        return None
    return replace(
        current,
        holder=identity,
        duration_s=duration_s,
        acquired=now,
        renewed=now,
        transitions=current.transitions + 1,
    )


class LeasePort(Protocol):
    """The Lease calls the elector makes; `create`/`update` return False when another writer won."""

    def read_lease(self, namespace: str, name: str) -> LeaseRecord | None: ...

    def create_lease(self, namespace: str, name: str, record: LeaseRecord) -> bool: ...

    def update_lease(self, namespace: str, name: str, record: LeaseRecord) -> bool: ...


@dataclass
class LeaderElector:
    """Holds one Lease for `identity`; `try_lead` is called every pass, `release` on shutdown."""

    port: LeasePort
    namespace: str
    name: str
    identity: str
    duration_s: float = 15.0
    leading: bool = False

    def try_lead(self, now: float) -> bool:
        current = self.port.read_lease(self.namespace, self.name)
        wanted = claim(current, self.identity, now, self.duration_s)
        if wanted is None:
            won = False
        elif current is None:
            won = self.port.create_lease(self.namespace, self.name, wanted)
        else:
            won = self.port.update_lease(self.namespace, self.name, wanted)
        if won != self.leading:
            logger.info(
                "%s %s lease %s/%s", self.identity, "acquired" if won else "lost", self.namespace, self.name
            )
        self.leading = won
        return won

    def release(self, now: float) -> None:
        """Give the lease up at once (a successor need not wait for it to expire)."""
        if not self.leading:
            return
        current = self.port.read_lease(self.namespace, self.name)
        if current is not None and current.holder == self.identity:
            self.port.update_lease(
                self.namespace, self.name, replace(current, holder="", duration_s=1, renewed=now)
            )
        self.leading = False
