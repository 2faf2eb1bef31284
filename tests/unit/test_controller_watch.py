"""Watch events on the controller's in-memory PDDeployment cache."""

from __future__ import annotations

from typing import Any

import pytest

from xpyd_controller.adapters.k8s import apply_event


def obj(uid: str, generation: int = 1) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "generation": generation}}


@pytest.mark.parametrize(
    ("kind", "body", "expected"),
    [
        ("ADDED", obj("b"), {"a": 1, "b": 1}),
        ("MODIFIED", obj("a", 2), {"a": 2}),
        ("DELETED", obj("a"), {}),
        ("DELETED", obj("zz"), {"a": 1}),  # already gone
        ("BOOKMARK", obj("a", 9), {"a": 1}),  # carries only a resourceVersion
    ],
)
def test_apply_event(kind: str, body: dict[str, Any], expected: dict[str, int]) -> None:
    objects = {"a": obj("a")}
    apply_event(objects, kind, body)
    assert {uid: o["metadata"]["generation"] for uid, o in objects.items()} == expected
