"""One call from configuration and requests to summarised results."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xpyd_controller.sim.native import run_events
from xpyd_controller.sim.results import SimResult, summarise

if TYPE_CHECKING:  # the compiled build runs; the source engine need not even load
    from xpyd_controller.policy.types import Limits, Policy
    from xpyd_controller.sim.config import SimConfig
    from xpyd_controller.sim.engine import ProgressFn
    from xpyd_controller.sim.traces import Trace


def simulate(
    config: SimConfig,
    requests: Trace,
    policy: Policy | None = None,
    *,
    limits: Limits | None = None,
    progress: ProgressFn | None = None,
    series_interval_s: float = 60.0,
) -> SimResult:
    """Run the fleet of `config` (and `policy`, if any, at the scrape cadence) over `requests`."""
    raw = run_events(config, requests, policy, limits, progress)
    return summarise(requests, raw, config.slo, series_interval_s)
