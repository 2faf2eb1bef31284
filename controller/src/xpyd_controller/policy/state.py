"""Reading a policy's kept state back: every value checked, anything malformed rejected by name.

A policy's state (windows, forecasts, calibrations, holds) is kept outside it, in the PDDeployment's
status, so that a restarted or newly elected controller continues exactly where the last decision left
off. Status is evidence, not truth: anyone with write access to it can put anything there, so a reader
takes only finite numbers within bounds and well-formed lists, and a `StateError` naming the path, the
value and the rule makes the whole state count as lost (never half-applied).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

MAX_ROWS = 1000  # more entries than any window holds at the shortest interval: not a state of ours
MAX_COUNT = 1_000_000  # an instance count above this is no count of ours

JsonMap = Mapping[str, Any]


class StateError(ValueError):
    """A kept state that cannot be trusted: `path = value: rule`."""

    def __init__(self, path: str, value: object, rule: str) -> None:
        shown = repr(value)
        super().__init__(f"{path} = {shown if len(shown) <= 60 else shown[:57] + '...'}: {rule}")


def section(data: object, key: str) -> JsonMap:
    """The object at `data[key]`."""
    value = data.get(key) if isinstance(data, Mapping) else None
    if not isinstance(value, Mapping):
        raise StateError(key, value, "must be an object")
    return value


def _number(value: object, path: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise StateError(path, value, "must be a finite number")
    if not low <= value <= high:
        raise StateError(path, value, f"must be in [{low:g}, {high:g}]")
    return float(value)


def _count(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise StateError(path, value, f"must be a whole number in [0, {MAX_COUNT}]")
    return value


def number(data: JsonMap, key: str, low: float = -math.inf, high: float = math.inf) -> float:
    """A finite number (not a bool) in [low, high]."""
    return _number(data.get(key), key, low, high)


def maybe_number(data: JsonMap, key: str, low: float = -math.inf, high: float = math.inf) -> float | None:
    """`number`, or None when the value is null."""
    return None if data.get(key) is None else number(data, key, low, high)


def count(data: JsonMap, key: str) -> int:
    """A whole number (not a bool) in [0, MAX_COUNT]."""
    return _count(data.get(key), key)


def flag(data: JsonMap, key: str) -> bool:
    value = data.get(key)
    if not isinstance(value, bool):
        raise StateError(key, value, "must be true or false")
    return value


def vector(data: JsonMap, key: str, width: int, low: float = -math.inf) -> tuple[float, ...]:
    """A list of exactly `width` finite numbers, each >= low."""
    value = data.get(key)
    if not isinstance(value, list) or len(value) != width:
        raise StateError(key, value, f"must be a list of {width} numbers")
    return tuple(_number(cell, key, low, math.inf) for cell in value)


def counts(data: JsonMap, key: str, width: int) -> tuple[int, ...]:
    """A list of exactly `width` whole numbers (instance counts)."""
    value = data.get(key)
    if not isinstance(value, list) or len(value) != width:
        raise StateError(key, value, f"must be a list of {width} counts")
    return tuple(_count(cell, f"{key}[{index}]") for index, cell in enumerate(value))


def rows(
    data: JsonMap, key: str, whole: tuple[bool, ...], *, latest_s: float | None = None
) -> list[tuple[float, ...]]:
    """A list of at most MAX_ROWS rows of len(whole) numbers; a True in `whole` asks for a count there.
    With `latest_s` the first column is a time: ascending and no later than `latest_s`."""
    value = data.get(key)
    if not isinstance(value, list) or len(value) > MAX_ROWS:
        raise StateError(key, value, f"must be a list of at most {MAX_ROWS} rows")
    result = []
    for index, row in enumerate(value):
        if not isinstance(row, list) or len(row) != len(whole):
            raise StateError(f"{key}[{index}]", row, f"must be a list of {len(whole)} numbers")
        path = f"{key}[{index}]"
        result.append(
            tuple(
                float(_count(cell, path)) if is_whole else _number(cell, path, -math.inf, math.inf)
                for cell, is_whole in zip(row, whole, strict=True)
            )
        )
        if latest_s is not None and not (
            result[-1][0] <= latest_s and (index == 0 or result[-2][0] <= result[-1][0])
        ):
            raise StateError(path, row, f"its time must be ascending and no later than {latest_s:g}")
    return result


VERSION = 1
FUTURE_SLACK_S = 60.0  # clock skew between controllers a kept time may show


def envelope(policy: str, time_s: float | None, body: Mapping[str, Any]) -> dict[str, Any]:
    """A policy's state as kept: which policy and format wrote it, when, and its parts."""
    return {"policy": policy, "version": VERSION, "timeS": time_s, **body}


def opened(state: object, policy: str, now_s: float) -> tuple[JsonMap, float]:
    """The parts of a kept state written by `policy` in this format, no later than `now_s` (+ skew),
    and the latest time anything inside it may carry (its own time: nothing is kept from later)."""
    if not isinstance(state, Mapping):
        raise StateError("state", state, "must be an object")
    if state.get("policy") != policy:
        raise StateError("policy", state.get("policy"), f"must be {policy!r}: another policy's state")
    if state.get("version") != VERSION:
        raise StateError("version", state.get("version"), f"must be {VERSION}")
    time_s = maybe_number(state, "timeS", high=now_s + FUTURE_SLACK_S)
    return state, now_s + FUTURE_SLACK_S if time_s is None else time_s
