"""The local demo (`make demo`): vLLM engine stand-ins behind the real vllm-router under drifting traffic,
the controller converting roles live.

A real local cluster comes up; the operator, a real Prometheus, the pod runner (each instance pod's
engine stand-in and the real vllm-router, on the pods' loopback IPs) and the controller start; a
PDDeployment in Auto mode is applied; then traffic through the router at a flat rate swings between
long outputs and long prompts, and a progress line every few
seconds shows the pools, the controller's binding constraint and reasons, and conversions. At the end
(or on Ctrl-C) a summary, then everything is stopped by pid.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import dataclass
from types import FrameType

from e2e.harness import start_cluster
from e2e.stack import Demo, DemoSettings, Reversals, ScaleCounts, demo_stack, progress_line, targets_line
from e2e.traffic import TrafficStats


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@dataclass
class SloClock:
    """Progress intervals in which the requests completed met the SLO at the target attainment."""

    attainment: float
    within: int = 0
    measured: int = 0

    def add(self, traffic: TrafficStats, previous: TrafficStats) -> None:
        done = traffic.completed - previous.completed
        if done:
            self.measured += 1
            self.within += (traffic.within_slo - previous.within_slo) >= self.attainment * done


def run(demo: Demo, progress_s: float) -> tuple[SloClock, Reversals]:
    """Print a progress line every `progress_s` seconds until the demo's minutes are up (or Ctrl-C)."""
    started = time.monotonic()
    deadline = started + demo.settings.minutes * 60.0
    previous = demo.traffic.stats()
    clock = SloClock(attainment=0.9)
    reversals = Reversals(demo.settings.swing_s)
    try:
        while (now := time.monotonic()) < deadline:
            time.sleep(min(progress_s, max(0.0, deadline - now)))
            stats = demo.traffic.stats()
            clock.add(stats, previous)
            pdd = demo.pdd()
            reversals.add(stats.now_s, pdd["spec"]["prefill"]["replicas"], pdd["spec"]["decode"]["replicas"])
            line = progress_line(
                elapsed_s=time.monotonic() - started,
                rate=demo.settings.rate,
                long_prompts=demo.long_prompt_share(),
                pdd=pdd,
                traffic=stats,
                previous=previous,
                conversions=len(demo.event_messages("Converted")),
            )
            print(line, flush=True)
            previous = stats
    except KeyboardInterrupt:
        print("interrupted: summary so far, then teardown", flush=True)
    return clock, reversals


def summary(demo: Demo, clock: SloClock, reversals: Reversals) -> str:
    traffic = demo.traffic.stats()
    scale = ScaleCounts.of(demo.event_messages("ScaleDecision"))
    status = demo.pdd().get("status") or {}
    autoscaler = status.get("autoscaler") or {}
    share = f"{100 * traffic.within_slo / traffic.completed:.0f}%" if traffic.completed else "-"
    time_share = f"{100 * clock.within / clock.measured:.0f}%" if clock.measured else "-"
    return "\n".join(
        [
            f"summary after {traffic.now_s:.0f} s of traffic through the router:",
            f"  traffic: {traffic.sent} requests sent, {traffic.completed} completed, {share} of them within"
            f" the SLO (TTFT and time per output token, as the client saw them); SLO met at 90% attainment in"
            f" {clock.within} of {clock.measured} progress intervals ({time_share} of the time);"
            f" {traffic.failed} failed",
            f"  controller: {scale.decisions} scale decisions: prefill up {scale.ups['prefill']} /"
            f" down {scale.downs['prefill']}, decode up {scale.ups['decode']} / down {scale.downs['decode']};"
            f" last binding {autoscaler.get('binding') or '-'} ({', '.join(autoscaler.get('reasons') or [])})",
            f"  operator: {len(demo.event_messages('Converted'))} conversions (Converted events),"
            f" {len(demo.event_messages('Created'))} Created and"
            f" {len(demo.event_messages('Deleted'))} Deleted events",
            targets_line(
                traffic.within_slo / traffic.completed if traffic.completed else None,
                clock.within / clock.measured if clock.measured else None,
                reversals.worst,
                len(demo.event_messages("Converted")),
            ),
            f"  logs: {demo.workdir}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    defaults = DemoSettings()
    parser = argparse.ArgumentParser(
        prog="make demo",
        description="A real local Kubernetes cluster (kwok fake nodes by default; XPYD_CLUSTER=kind|existing) "
        "with the operator, a real Prometheus, vLLM engine stand-ins behind the real vllm-router and the xpyd "
        "controller; traffic through the router "
        "swings between long outputs and long prompts, and the controller converts roles live.",
    )
    parser.add_argument("--nodes", type=int, default=3, help="fake GPU nodes to create (default 3)")
    parser.add_argument(
        "--minutes", type=float, default=defaults.minutes, help="traffic duration (default 5)"
    )
    parser.add_argument("--rate", type=float, default=defaults.rate, help="requests/s (default 4)")
    parser.add_argument(
        "--swing-seconds", type=float, default=defaults.swing_s, help="seconds per mix phase (default 90)"
    )
    parser.add_argument("--progress-seconds", type=float, default=5.0, help="between progress lines")
    parser.add_argument("--seed", type=int, default=0, help="traffic seed")
    parser.add_argument(
        "--hold", type=float, default=0, help="seconds to keep everything up after the summary"
    )
    args = parser.parse_args(argv)
    try:
        settings = DemoSettings(args.minutes, args.rate, args.swing_seconds, seed=args.seed)
    except ValueError as error:
        parser.error(str(error))
    for stop in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C and SIGTERM both reach the teardown (also when
        signal.signal(stop, _raise_interrupt)  # started in the background, where SIGINT is ignored)
    started = time.monotonic()
    with start_cluster(nodes=args.nodes) as cluster:
        print(
            f"cluster {cluster.name} ({cluster.provider}) up in {time.monotonic() - started:.1f}s", flush=True
        )
        with demo_stack(cluster, settings) as demo:
            print(
                f"operator, Prometheus ({demo.prometheus.url}), engines, router ({demo.traffic.url}) and"
                " controller started;"
                f" {settings.rate:g} req/s for {settings.minutes:g} min, mix swinging every"
                f" {settings.swing_s:g} s (long outputs first)",
                flush=True,
            )
            clock, reversals = run(demo, args.progress_seconds)
            print(summary(demo, clock, reversals), flush=True)
            if args.hold:
                print(
                    f"KUBECONFIG={cluster.kubeconfig}  (holding {args.hold:.0f}s; Ctrl-C tears down)",
                    flush=True,
                )
                time.sleep(args.hold)
    print("everything torn down", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
