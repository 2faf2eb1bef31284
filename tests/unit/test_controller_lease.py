"""Leader election: who may write the Lease when, and the elector over an in-memory Lease store."""

from __future__ import annotations

import dataclasses

import pytest

from xpyd_controller.control.lease import LeaderElector, LeaseRecord, claim, lease_spec, parse_lease


@pytest.mark.parametrize(
    ("current", "now", "expected"),
    [
        (None, 100.0, LeaseRecord("me", 15, 100.0, 100.0, 0)),  # nobody ever held it
        (
            LeaseRecord("me", 15, 50.0, 90.0, 2, "7"),
            100.0,
            LeaseRecord("me", 15, 50.0, 100.0, 2, "7"),
        ),  # renew
        (LeaseRecord("other", 15, 50.0, 90.0, 2, "7"), 100.0, None),  # other's lease still valid
        (LeaseRecord("other", 15, 50.0, 85.0, 2, "7"), 100.0, None),  # exactly at the limit: still valid
        (LeaseRecord("other", 15, 50.0, 80.0, 2, "7"), 100.0, LeaseRecord("me", 15, 100.0, 100.0, 3, "7")),
        (
            LeaseRecord("", 1, 50.0, 99.0, 2, "7"),
            100.0,
            LeaseRecord("me", 15, 100.0, 100.0, 3, "7"),
        ),  # released
    ],
)
def test_claim(current: LeaseRecord | None, now: float, expected: LeaseRecord | None) -> None:
    assert claim(current, "me", now, 15) == expected


def test_lease_round_trip() -> None:
    record = LeaseRecord("me", 15, 1_700_000_000.25, 1_700_000_010.5, 4)
    body = {"metadata": {"resourceVersion": "42"}, "spec": lease_spec(record)}
    assert body["spec"]["renewTime"] == "2023-11-14T22:13:30.500000Z"
    assert parse_lease(body) == dataclasses.replace(record, resource_version="42")


class MemoryLeases:
    """A Lease store with the API server's optimistic concurrency: an update needs the current version."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0

    def read_lease(self, namespace: str, name: str) -> LeaseRecord | None:
        return self.record

    def create_lease(self, namespace: str, name: str, record: LeaseRecord) -> bool:
        if self.record is not None:
            return False
        return self._store(record)

    def update_lease(self, namespace: str, name: str, record: LeaseRecord) -> bool:
        if self.record is None or record.resource_version != self.record.resource_version:
            return False
        return self._store(record)

    def _store(self, record: LeaseRecord) -> bool:
        self.version += 1
        self.record = dataclasses.replace(record, resource_version=str(self.version))
        return True


def elector(store: MemoryLeases, name: str) -> LeaderElector:
    return LeaderElector(store, "ns", "lease", name, duration_s=10)


def test_one_leader_takeover_after_expiry_and_release() -> None:
    store = MemoryLeases()
    first, second = elector(store, "a"), elector(store, "b")
    assert first.try_lead(0.0) and not second.try_lead(0.5)
    assert first.try_lead(5.0) and not second.try_lead(14.0)  # renewed at 5: valid until 15
    assert second.try_lead(16.0)  # a stopped renewing
    assert not first.try_lead(16.5) and store.record is not None and store.record.transitions == 1
    second.release(17.0)
    assert store.record.holder == "" and not second.leading
    assert first.try_lead(17.5)  # no need to wait for expiry after a release


def test_stale_write_loses() -> None:
    store = MemoryLeases()
    first = elector(store, "a")
    first.try_lead(0.0)
    stale = store.record
    assert stale is not None
    assert first.try_lead(1.0)
    assert not store.update_lease("ns", "lease", dataclasses.replace(stale, holder="b"))
