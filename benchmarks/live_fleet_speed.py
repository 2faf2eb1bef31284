"""How much of one core the in-process live fleet needs to keep up with the wall clock.

The fleet (`xpyd_controller.sim.live`) ran in real time in the demo and the e2e test (they now run engine
stand-ins behind the real router instead), next to the cluster, the operator, Prometheus and the
controller on 2 shared cores. This drives it as the demo did — `advance()` every 50 ms of fleet time,
every instance's /metrics rendered every
2 s (one Prometheus scrape) — but as fast as it can, and reports CPU seconds per fleet second (the
share of one core it would take live). The baseline in the same run is the same fleet with no traffic:
the floor of ticking and rendering alone.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from e2e.stack import DemoSettings, demo_manifest, demo_traffic  # noqa: E402

from bench_docs import publish  # noqa: E402
from xpyd_api.models import PDDeploymentSpec  # noqa: E402
from xpyd_api.names import Role  # noqa: E402
from xpyd_controller.control.setup import gpu_spec, link_spec, model_spec  # noqa: E402
from xpyd_controller.sim.config import Hardware  # noqa: E402
from xpyd_controller.sim.live import LiveFleet, LiveTraffic  # noqa: E402
from xpyd_controller.sim.traces.synthetic import Constant  # noqa: E402

SECTION = "## Live fleet speed (`benchmarks/live_fleet_speed.py`)"
TICK_S = 0.05
SCRAPE_S = 2.0


@dataclass(frozen=True)
class Load:
    name: str
    rate: float
    prefill: int
    decode: int
    fleet_seconds: float


LOADS = (
    Load("demo: 4 req/s, 2 prefill + 3 decode", 4.0, 2, 3, 300.0),
    Load("5x: 20 req/s, 4 prefill + 20 decode (long outputs)", 20.0, 4, 20, 90.0),
)


def build(load: Load, traffic: bool) -> LiveFleet:
    """The demo's fleet at `load` (or with no arrivals at all, for the baseline)."""
    settings = replace(DemoSettings(), rate=load.rate, minutes=load.fleet_seconds / 60.0)
    manifest = demo_manifest("http://unused", settings)
    spec = PDDeploymentSpec.model_validate(manifest["spec"])
    hardware = Hardware(model_spec(spec.model), gpu_spec(spec.hardware), link_spec(spec.hardware))
    lengths, slo = demo_traffic(manifest, settings)
    fleet = LiveFleet(hardware, LiveTraffic(Constant(load.rate if traffic else 0.0), lengths), slo)
    for index in range(load.prefill):
        fleet.add(f"p{index}", Role.PREFILL)
    for index in range(load.decode):
        fleet.add(f"d{index}", Role.DECODE)
    return fleet


def run(load: Load, traffic: bool) -> tuple[float, int]:
    """CPU seconds per fleet second, and requests completed."""
    fleet = build(load, traffic)
    keys = list(fleet.roles())
    ticks_per_scrape = round(SCRAPE_S / TICK_S)
    started = time.process_time()
    for tick in range(round(load.fleet_seconds / TICK_S)):
        fleet.advance(TICK_S)
        if tick % ticks_per_scrape == 0:
            for key in keys:
                fleet.metrics_text(key, "m")
    return (time.process_time() - started) / load.fleet_seconds, fleet.stats().completed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="replace this benchmark's section of docs")
    args = parser.parse_args()
    rows = []
    for load in LOADS:
        loaded, idle, completed = [], [], []
        for _ in range(args.runs):  # interleaved, so a busy moment hits both alike
            share, done = run(load, traffic=True)
            loaded.append(share)
            completed.append(done)
            idle.append(run(load, traffic=False)[0])
        rows.append(
            (load, statistics.median(loaded), statistics.median(idle), round(statistics.median(completed)))
        )
        print(f"{load.name}: loaded {loaded}, idle {idle}", flush=True)
    with open("/proc/loadavg") as loadavg:
        load_average = loadavg.read().split()[0]
    lines = [
        SECTION,
        "",
        f"Command: `.venv/bin/python benchmarks/live_fleet_speed.py --runs {args.runs} --write` on "
        f"{platform.machine()} / Python {platform.python_version()} (shared 2-core machine, 1-min load "
        f"average {load_average} at the end; medians of {args.runs} runs, loaded and idle interleaved).",
        "",
        f"The demo's PDDeployment (small GPU, 8B model) and swinging mix; `advance({TICK_S})` per tick and "
        f"every instance's /metrics rendered every {SCRAPE_S:g} s, as the demo's fleet did live, but run "
        "flat out. CPU seconds per fleet second is the share of one core the fleet takes in real time.",
        "",
        "| load | fleet seconds | requests completed | CPU s per fleet s | baseline: no traffic | headroom |",
        "|---|---|---|---|---|---|",
    ]
    for load, share, idle_share, done in rows:
        lines.append(
            f"| {load.name} | {load.fleet_seconds:g} | {done:,.0f} | {share:.4f} | {idle_share:.4f} "
            f"| {1 / share:,.0f}× real time |"
        )
    return publish(SECTION, "\n".join(lines) + "\n", args.write)


if __name__ == "__main__":
    sys.exit(main())
