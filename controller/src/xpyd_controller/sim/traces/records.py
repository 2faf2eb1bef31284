"""The request record and the columnar trace the simulator consumes.

A day at 30 req/s is 2.6 M requests, so a trace is four parallel numpy arrays rather than a list of
objects; `Request` exists for tests, loaders and anyone who wants one request at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from xpyd_api.errors import InputError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class TraceError(InputError):
    """Rejected trace data; names where (file and line when there is one), the field, value and rule."""

    def __init__(
        self, field: str, value: object, rule: str, *, source: str = "", line: int | None = None
    ) -> None:
        where = source if line is None else f"{source}:{line}"
        prefix = f"{where}: " if where else ""
        super().__init__(field, value, rule, message=f"{prefix}{field} = {value!r}: {rule}")
        self.source = source
        self.line = line


@dataclass(frozen=True)
class Request:
    """One request: when it arrives (s from trace start), its lengths, and how much of its prompt is cached."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_hit_tokens: int = 0

    @property
    def hit_fraction(self) -> float:
        return self.prefix_hit_tokens / self.prompt_tokens


def _readonly(values: npt.ArrayLike, dtype: type[np.generic], field: str) -> npt.NDArray[np.generic]:
    array = np.array(values, dtype=dtype, copy=True)
    if array.ndim != 1:
        raise TraceError(field, array.shape, "must be a one-dimensional array")
    array.setflags(write=False)
    return array


def _first_bad(mask: npt.NDArray[np.bool_]) -> int:
    return int(np.flatnonzero(mask)[0])


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests as parallel read-only arrays, sorted by arrival time (seconds from the trace start).

    `prefix_hit_tokens` is how many leading prompt tokens are already in a prefix cache (0 = unknown or
    none); it never exceeds the prompt.
    """

    arrival_s: FloatArray
    prompt_tokens: IntArray
    output_tokens: IntArray
    prefix_hit_tokens: IntArray
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "arrival_s", _readonly(self.arrival_s, np.float64, "arrival_s"))
        for field in ("prompt_tokens", "output_tokens", "prefix_hit_tokens"):
            object.__setattr__(self, field, _readonly(getattr(self, field), np.int64, field))
        count = len(self.arrival_s)
        for field in ("prompt_tokens", "output_tokens", "prefix_hit_tokens"):
            if len(getattr(self, field)) != count:
                raise TraceError(
                    field, len(getattr(self, field)), f"length must equal arrival_s length {count}"
                )
        self._check()

    def _check(self) -> None:
        arrivals = self.arrival_s
        if not np.all(np.isfinite(arrivals)):
            index = _first_bad(~np.isfinite(arrivals))
            raise TraceError(f"arrival_s[{index}]", float(arrivals[index]), "must be finite")
        if len(arrivals):
            if arrivals[0] < 0:
                raise TraceError("arrival_s[0]", float(arrivals[0]), "must be >= 0")
            backwards = np.diff(arrivals) < 0
            if backwards.any():
                index = _first_bad(backwards) + 1
                raise TraceError(f"arrival_s[{index}]", float(arrivals[index]), "arrivals must be sorted")
        for field in ("prompt_tokens", "output_tokens"):
            values = getattr(self, field)
            if (values < 1).any():
                index = _first_bad(values < 1)
                raise TraceError(f"{field}[{index}]", int(values[index]), "must be >= 1")
        hits = self.prefix_hit_tokens
        bad = (hits < 0) | (hits > self.prompt_tokens)
        if bad.any():
            index = _first_bad(bad)
            raise TraceError(
                f"prefix_hit_tokens[{index}]",
                int(hits[index]),
                f"must be in [0, prompt_tokens = {int(self.prompt_tokens[index])}]",
            )

    @classmethod
    def from_requests(cls, requests: Iterable[Request], name: str = "") -> Trace:
        """Build from records (sorted by arrival here, stably, so equal times keep their order)."""
        items = sorted(requests, key=lambda request: request.arrival_s)
        return cls(
            arrival_s=np.array([r.arrival_s for r in items], dtype=np.float64),
            prompt_tokens=np.array([r.prompt_tokens for r in items], dtype=np.int64),
            output_tokens=np.array([r.output_tokens for r in items], dtype=np.int64),
            prefix_hit_tokens=np.array([r.prefix_hit_tokens for r in items], dtype=np.int64),
            name=name,
        )

    def __len__(self) -> int:
        return len(self.arrival_s)

    def __getitem__(self, index: int) -> Request:
        return Request(
            arrival_s=float(self.arrival_s[index]),
            prompt_tokens=int(self.prompt_tokens[index]),
            output_tokens=int(self.output_tokens[index]),
            prefix_hit_tokens=int(self.prefix_hit_tokens[index]),
        )

    def __iter__(self) -> Iterator[Request]:
        return (self[index] for index in range(len(self)))

    @property
    def duration_s(self) -> float:
        """Time from zero to the last arrival."""
        return float(self.arrival_s[-1]) if len(self) else 0.0

    @property
    def mean_rate(self) -> float:
        """Arrivals per second over the trace's duration (0 for an empty or instantaneous trace)."""
        return len(self) / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def hit_fraction(self) -> FloatArray:
        """Per-request fraction of the prompt served from the prefix cache."""
        result: FloatArray = self.prefix_hit_tokens / self.prompt_tokens
        return result

    def with_time_scale(self, factor: float) -> Trace:
        """The same requests with every arrival time multiplied by `factor` (0.5 doubles the rate)."""
        if not (np.isfinite(factor) and factor > 0):
            raise TraceError("factor", factor, "must be a finite number > 0")
        return Trace(
            arrival_s=self.arrival_s * factor,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            prefix_hit_tokens=self.prefix_hit_tokens,
            name=self.name,
        )

    def window(self, start_s: float, end_s: float) -> Trace:
        """Requests arriving in [start_s, end_s), with times kept (not shifted)."""
        lo, hi = np.searchsorted(self.arrival_s, [start_s, end_s], side="left")
        return Trace(
            arrival_s=self.arrival_s[lo:hi],
            prompt_tokens=self.prompt_tokens[lo:hi],
            output_tokens=self.output_tokens[lo:hi],
            prefix_hit_tokens=self.prefix_hit_tokens[lo:hi],
            name=self.name,
        )
