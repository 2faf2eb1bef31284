"""Load forecasts one planner interval ahead on the benchmark days: Dynamo 1.6.1's own predictors
(constant, ARIMA, Kalman) against damped-trend exponential smoothing (Holt with damping), the forecast
xpyd's policy sizes for (`policy/forecast.py`, over the lead time: the measured cold start or
conversion, `lead_time_s`, 120 s by default, until one is measured).

Each day (the drift and diurnal days of `benchmarks/autoscaling.py`, compressed like there) becomes a
series of request counts per 180 s interval, Dynamo's adjustment interval, which also covers the
day scenarios' 120 s cold start: what a planner must provision for before the instances it adds can
serve. Every predictor sees the counts up to interval t and forecasts t + 1; errors are over all
intervals after the first five (Dynamo's predictors fall back to the last value before that).
Under-forecasts are what costs the SLO, so their share beyond 10 % is reported beside the error.

    "$(hack/dynamo-bench)" benchmarks/forecasters.py [--seeds 5] [--hours 6] [--write]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import bench_cache
import real_dynamo
from autoscaling import SECTION, build_trace, scenarios
from bench_docs import publish
from xpyd_controller.policy.forecast import RateForecast

INTERVAL_S = 180.0
WARM_UP = 5  # intervals before Dynamo's predictors forecast anything but the last value
SUBSECTION = "### Load forecasts one interval ahead (`benchmarks/forecasters.py`)"


class DampedTrend:
    """xpyd's `RateForecast` behind Dynamo's predictor interface, one sample per interval."""

    def __init__(self) -> None:
        self.forecast = RateForecast(INTERVAL_S)
        self.time_s = 0.0
        self.last = 0.0

    def add_data_point(self, value: float) -> None:
        self.forecast.add(self.time_s, value)
        self.time_s += INTERVAL_S
        self.last = value

    def predict_next(self) -> float:
        ahead = self.forecast.forecast()
        return self.last if ahead is None else ahead


def dynamo_predictors() -> dict[str, Callable[[], object]]:
    config = real_dynamo.planner_config()
    from dynamo.planner.core.load.predictors import ARIMAPredictor, ConstantPredictor, KalmanPredictor

    return {
        "Dynamo 1.6.1 constant": lambda: ConstantPredictor(config),
        "Dynamo 1.6.1 ARIMA (its default)": lambda: ARIMAPredictor(config),
        "Dynamo 1.6.1 Kalman": lambda: KalmanPredictor(config),
    }


def interval_counts(key: str, seed: int, hours: float) -> np.ndarray:
    trace = build_trace(scenarios()[key], seed, hours)
    edges = np.arange(0.0, float(trace.arrival_s[-1]) + INTERVAL_S, INTERVAL_S)
    counts, _ = np.histogram(trace.arrival_s, edges)
    return counts.astype(np.float64)


@dataclass(frozen=True)
class Errors:
    mape: float  # mean absolute error ÷ actual
    under: float  # share of intervals forecast more than 10 % below the actual

    @classmethod
    def of(cls, forecast: np.ndarray, actual: np.ndarray) -> Errors:
        relative = (forecast - actual) / np.maximum(actual, 1.0)
        return cls(float(np.mean(np.abs(relative))), float(np.mean(relative < -0.1)))


def evaluate(make: Callable[[], object], counts: np.ndarray) -> Errors:
    predictor = make()
    forecasts = []
    for value in counts[:-1]:
        predictor.add_data_point(float(value))  # type: ignore[attr-defined]
        forecasts.append(float(predictor.predict_next()))  # type: ignore[attr-defined]
    forecast, actual = np.asarray(forecasts[WARM_UP:]), counts[WARM_UP + 1 :]
    return Errors.of(forecast, actual)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--hours", type=float, default=6.0, help="length of the compressed days")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    predictors = {
        **dynamo_predictors(),
        "damped trend (Holt, φ 0.9; xpyd's policy)": DampedTrend,
    }
    days = ("drift", "diurnal")
    results: dict[tuple[str, str], list[Errors]] = {}
    for day in days:
        for seed in range(1, args.seeds + 1):
            counts = interval_counts(day, seed, args.hours)
            for name, make in predictors.items():
                results.setdefault((name, day), []).append(evaluate(make, counts))
    header = " | ".join(f"{day}: MAPE · under > 10 %" for day in days)
    lines = [
        SUBSECTION,
        "",
        f"Command: `{bench_cache.interpreter()} benchmarks/forecasters.py {' '.join(sys.argv[1:])}` on "
        f"{platform.machine()} / Python {platform.python_version()}; {args.seeds} seeds per day (means), "
        f"days compressed to {args.hours:g} h, request counts per {INTERVAL_S:g} s interval, forecast one "
        f"interval ahead; {time.perf_counter() - started:.0f} s wall.",
        "",
        f"| predictor | {header} |",
        "|---|" + "---|" * len(days),
    ]
    for name in predictors:
        cells = []
        for day in days:
            errors = results[(name, day)]
            cells.append(
                f"{np.mean([e.mape for e in errors]):.1%} · {np.mean([e.under for e in errors]):.1%}"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return publish(SECTION, "\n".join(lines) + "\n", args.write, append=True)


if __name__ == "__main__":
    sys.exit(main())
