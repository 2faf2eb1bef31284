"""The request record and the columnar trace the simulator consumes.

A day at 30 req/s is 2.6 M requests, so a trace is four parallel columns rather than a list of
objects; `Request` exists for tests, loaders and anyone who wants one request at a time. A trace built
from Python lists (the seed table's draws) stays numpy-free until someone reads its arrays: `xpyd
simulate` on such a trace never imports numpy (half of a seed-table row's CPU time was that import).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from xpyd_api.errors import InputError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

_LENGTH_FIELDS = ("prompt_tokens", "output_tokens", "prefix_hit_tokens")
DAY_S = 86_400.0  # a day of trace time


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


class TraceColumns(NamedTuple):
    """A trace's columns as Python tuples: what the event loop and the summaries iterate over."""

    arrival_s: tuple[float, ...]
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    prefix_hit_tokens: tuple[int, ...]


def _check_columns(columns: TraceColumns) -> None:
    """The trace's rules, naming the first request that breaks one."""
    arrivals = columns.arrival_s
    count = len(arrivals)
    for field in _LENGTH_FIELDS:
        if len(getattr(columns, field)) != count:
            raise TraceError(
                field, len(getattr(columns, field)), f"length must equal arrival_s length {count}"
            )
    for index, t in enumerate(arrivals):
        if not math.isfinite(t):
            raise TraceError(f"arrival_s[{index}]", t, "must be finite")
    if count and arrivals[0] < 0:
        raise TraceError("arrival_s[0]", arrivals[0], "must be >= 0")
    for index in range(1, count):
        if arrivals[index] < arrivals[index - 1]:
            raise TraceError(f"arrival_s[{index}]", arrivals[index], "arrivals must be sorted")
    for field in ("prompt_tokens", "output_tokens"):
        for index, tokens in enumerate(getattr(columns, field)):
            if tokens < 1:
                raise TraceError(f"{field}[{index}]", tokens, "must be >= 1")
    for index, (hits, prompt) in enumerate(
        zip(columns.prefix_hit_tokens, columns.prompt_tokens, strict=True)
    ):
        if not 0 <= hits <= prompt:
            raise TraceError(f"prefix_hit_tokens[{index}]", hits, f"must be in [0, prompt_tokens = {prompt}]")


def _is_python_column(values: object) -> bool:
    return isinstance(values, list | tuple)


class Trace:
    """Requests as parallel read-only columns, sorted by arrival time (seconds from the trace start).

    `prefix_hit_tokens` is how many leading prompt tokens are already in a prefix cache (0 = unknown or
    none); it never exceeds the prompt. Give numpy arrays or Python lists: the attributes
    `arrival_s`, `prompt_tokens`, ... are read-only numpy arrays either way (made on first use), and
    `columns` the same data as tuples.
    """

    def __init__(
        self,
        arrival_s: FloatArray | Sequence[float],
        prompt_tokens: IntArray | Sequence[int],
        output_tokens: IntArray | Sequence[int],
        prefix_hit_tokens: IntArray | Sequence[int],
        name: str = "",
    ) -> None:
        self.name = name
        given = (arrival_s, prompt_tokens, output_tokens, prefix_hit_tokens)
        self._arrays: tuple[Any, ...] | None = None
        self._columns: TraceColumns | None = None
        if all(_is_python_column(values) for values in given):
            self._columns = TraceColumns(
                tuple(float(t) for t in arrival_s),
                *(tuple(int(tokens) for tokens in values) for values in given[1:]),
            )
            _check_columns(self._columns)
        else:
            self._arrays = _checked_arrays(given)

    @property
    def columns(self) -> TraceColumns:
        if self._columns is None:
            assert self._arrays is not None
            self._columns = TraceColumns(*(tuple(array.tolist()) for array in self._arrays))
        return self._columns

    def _array(self, index: int) -> Any:
        if self._arrays is None:
            self._arrays = _checked_arrays(self.columns, checked=True)
        return self._arrays[index]

    @property
    def arrival_s(self) -> FloatArray:
        return self._array(0)  # type: ignore[no-any-return]

    @property
    def prompt_tokens(self) -> IntArray:
        return self._array(1)  # type: ignore[no-any-return]

    @property
    def output_tokens(self) -> IntArray:
        return self._array(2)  # type: ignore[no-any-return]

    @property
    def prefix_hit_tokens(self) -> IntArray:
        return self._array(3)  # type: ignore[no-any-return]

    @classmethod
    def from_requests(cls, requests: Iterable[Request], name: str = "") -> Trace:
        """Build from records (sorted by arrival here, stably, so equal times keep their order)."""
        items = sorted(requests, key=lambda request: request.arrival_s)
        return cls(
            arrival_s=[r.arrival_s for r in items],
            prompt_tokens=[r.prompt_tokens for r in items],
            output_tokens=[r.output_tokens for r in items],
            prefix_hit_tokens=[r.prefix_hit_tokens for r in items],
            name=name,
        )

    def __len__(self) -> int:
        return len(self._columns.arrival_s if self._columns is not None else self.arrival_s)

    def __getitem__(self, index: int) -> Request:
        arrival, prompt, output, hits = self.columns
        return Request(arrival[index], prompt[index], output[index], hits[index])

    def __iter__(self) -> Iterator[Request]:
        return (self[index] for index in range(len(self)))

    @property
    def duration_s(self) -> float:
        """Time from zero to the last arrival."""
        if not len(self):
            return 0.0
        return self._columns.arrival_s[-1] if self._columns is not None else float(self.arrival_s[-1])

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
        if not (math.isfinite(factor) and factor > 0):
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
        import numpy as np

        lo, hi = np.searchsorted(self.arrival_s, [start_s, end_s], side="left")
        return Trace(
            arrival_s=self.arrival_s[lo:hi],
            prompt_tokens=self.prompt_tokens[lo:hi],
            output_tokens=self.output_tokens[lo:hi],
            prefix_hit_tokens=self.prefix_hit_tokens[lo:hi],
            name=self.name,
        )


def _checked_arrays(given: Sequence[object], *, checked: bool = False) -> tuple[Any, ...]:
    """The columns as read-only numpy arrays (float64 arrivals, int64 lengths), checked vectorised;
    a failure is named by the same rules as a list-built trace's (`_check_columns`)."""
    import numpy as np

    arrays = []
    for field, values, dtype in zip(
        ("arrival_s", *_LENGTH_FIELDS), given, (np.float64, np.int64, np.int64, np.int64), strict=True
    ):
        array = np.array(values, dtype=dtype, copy=True)
        if array.ndim != 1:
            raise TraceError(field, array.shape, "must be a one-dimensional array")
        array.setflags(write=False)
        arrays.append(array)
    if checked:
        return tuple(arrays)
    arrival, prompt, output, hits = arrays
    same_length = len(prompt) == len(output) == len(hits) == len(arrival)
    if not (
        same_length
        and np.all(np.isfinite(arrival))
        and (not len(arrival) or arrival[0] >= 0)
        and not (np.diff(arrival) < 0).any()
        and (prompt >= 1).all()
        and (output >= 1).all()
        and ((hits >= 0) & (hits <= prompt)).all()
    ):
        _check_columns(TraceColumns(*(tuple(array.tolist()) for array in arrays)))
    return tuple(arrays)
