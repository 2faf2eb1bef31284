"""Request traces: the columnar `Trace`, synthetic generators and loaders for public trace files.

The generators and loaders (numpy) load on first use of one of their names, so `Trace` alone (and
`xpyd simulate` on the seed's Python-drawn trace) does not import numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from xpyd_controller.sim.traces.records import Request, Trace, TraceError

if TYPE_CHECKING:
    from xpyd_controller.sim.traces.loaders import (
        empirical_lengths,
        load_azure_csv,
        load_mooncake_jsonl,
        load_trace,
    )
    from xpyd_controller.sim.traces.synthetic import (
        Constant,
        Curve,
        Diurnal,
        EmpiricalLengths,
        LengthDistribution,
        MixDrift,
        PiecewiseLinear,
        Step,
        UniformLengths,
        counted_arrivals,
        diurnal,
        gamma_bursts,
        mix_drift_day,
        poisson,
        renewal_arrivals,
        step,
        synthesize,
    )

_LAZY = {
    "empirical_lengths": "loaders",
    "load_azure_csv": "loaders",
    "load_mooncake_jsonl": "loaders",
    "load_trace": "loaders",
    "Constant": "synthetic",
    "Curve": "synthetic",
    "Diurnal": "synthetic",
    "EmpiricalLengths": "synthetic",
    "LengthDistribution": "synthetic",
    "MixDrift": "synthetic",
    "PiecewiseLinear": "synthetic",
    "Step": "synthetic",
    "UniformLengths": "synthetic",
    "counted_arrivals": "synthetic",
    "diurnal": "synthetic",
    "gamma_bursts": "synthetic",
    "mix_drift_day": "synthetic",
    "poisson": "synthetic",
    "renewal_arrivals": "synthetic",
    "step": "synthetic",
    "synthesize": "synthetic",
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


__all__ = [
    "Constant",
    "Curve",
    "Diurnal",
    "EmpiricalLengths",
    "LengthDistribution",
    "MixDrift",
    "PiecewiseLinear",
    "Request",
    "Step",
    "Trace",
    "TraceError",
    "UniformLengths",
    "counted_arrivals",
    "diurnal",
    "empirical_lengths",
    "gamma_bursts",
    "load_azure_csv",
    "load_mooncake_jsonl",
    "load_trace",
    "mix_drift_day",
    "poisson",
    "renewal_arrivals",
    "step",
    "synthesize",
]
