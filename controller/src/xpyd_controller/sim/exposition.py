"""vLLM-named engine metrics of one simulated instance, rendered in the Prometheus text format (pure).

The live fleet keeps one `EngineSeries` per instance; `render` turns it into what a real vLLM server's
/metrics would show for the series the controller (control/promql.py) and the operator (drain) read:
vLLM's newest names from the engine table (xpyd_api.engines).
Counters and histograms are cumulative for the life of the instance: a role switch by routing does not
restart the engine, so they never go down.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from xpyd_api.engines import VLLM_METRICS

# vLLM's own bucket bounds (vllm/v1/metrics/loggers.py), so quantiles resolve as they would upstream.
TOKEN_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


@dataclass
class Histogram:
    """A cumulative histogram; `observe(value, count)` records `count` equal observations at once."""

    bounds: tuple[float, ...]
    buckets: list[float] = field(init=False)  # per bucket (not cumulative); the last one is +Inf
    total: float = 0.0
    count: float = 0.0

    def __post_init__(self) -> None:
        if list(self.bounds) != sorted(set(self.bounds)) or not self.bounds:
            raise ValueError(f"histogram bounds = {self.bounds!r}: must be non-empty and strictly increasing")
        self.buckets = [0.0] * (len(self.bounds) + 1)

    def observe(self, value: float, count: float = 1.0) -> None:
        if not math.isfinite(value) or count < 0:
            raise ValueError(f"observation = {value!r} x {count!r}: value must be finite, count >= 0")
        self.buckets[bisect.bisect_left(self.bounds, value)] += count
        self.total += value * count
        self.count += count


@dataclass
class EngineSeries:
    """Everything one instance exports: gauges set by the fleet, counters and histograms it accumulates."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    prompt_tokens: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))
    generation_tokens: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    inter_token: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))


def _number(value: float) -> str:
    return repr(float(value))


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _histogram_lines(name: str, labels: str, histogram: Histogram) -> list[str]:
    lines = [f"# TYPE {name} histogram"]
    cumulative = 0.0
    for bound, in_bucket in zip(histogram.bounds, histogram.buckets, strict=False):
        cumulative += in_bucket
        lines.append(f'{name}_bucket{{{labels},le="{_number(bound)}"}} {_number(cumulative)}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {_number(histogram.count)}')
    lines.append(f"{name}_sum{{{labels}}} {_number(histogram.total)}")
    lines.append(f"{name}_count{{{labels}}} {_number(histogram.count)}")
    return lines


def render(series: EngineSeries, model_name: str) -> str:
    """The instance's /metrics body (text exposition format 0.0.4), labelled like vLLM's (`model_name`)."""
    labels = f'model_name="{_label_value(model_name)}"'
    lines: list[str] = []
    names = VLLM_METRICS
    for alternatives, kind, value in (
        (names.running, "gauge", series.running),
        (names.waiting, "gauge", series.waiting),
        (names.kv_usage, "gauge", series.kv_usage),
        (names.prefix_queries, "counter", series.prefix_queries),
        (names.prefix_hits, "counter", series.prefix_hits),
    ):
        name = alternatives[0]  # the newest name
        family = name.removesuffix("_total") if kind == "counter" else name
        lines += [f"# TYPE {family} {kind}", f"{name}{{{labels}}} {_number(value)}"]
    for alternatives, histogram in (
        (names.prompt_histogram, series.prompt_tokens),
        (names.output_histogram, series.generation_tokens),
        (names.ttft, series.ttft),
        (names.tpot, series.inter_token),
    ):
        lines += _histogram_lines(alternatives[0], labels, histogram)
    return "\n".join(lines) + "\n"
