"""`xpyd simulate`: replay a scenario's traffic against a fleet and a policy; goodput, GPU-hours, plots.

A thin edge over `xpyd_controller.sim`: parse flags into a scenario, simulate, then print a summary
table (or `--json`) and optionally plot the run. Exit codes: 0 = simulated; 2 = invalid input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpyd_api.errors import InputError
from xpyd_controller.sim.config import Fleet, GoodputSlo, Mode, SimConfigError
from xpyd_controller.sim.results import SeriesPoint, SimResult, recovery_time_s
from xpyd_controller.sim.runner import simulate
from xpyd_controller.sim.scenarios import Scenario, builtin_scenarios, load_scenario

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.axes import Axes
    from rich.table import Table

    from xpyd_controller.policy.types import Policy

# `--help` lists them without loading every policy (test_simulate_cli holds it to sim.policies).
POLICY_NAMES = ("static", "threshold", "throughput-planner", "xpyd", "oracle-static", "oracle-window")

PROGRESS_EVERY_S = 2.0  # wall-clock seconds between progress lines on stderr


def register(subparsers: Any, help_text: str) -> None:
    names = ", ".join(builtin_scenarios())
    parser = subparsers.add_parser(
        "simulate",
        help=help_text,
        description=(
            "Simulate a co-located or prefill/decode fleet request by request. "
            f"Built-in scenarios: {names}; or give a YAML/JSON scenario file."
        ),
    )
    parser.add_argument("--scenario", default="seed-8gpu", help="built-in name or YAML/JSON file")
    parser.add_argument("--mode", choices=("colocated", "disagg"), help="override the scenario's mode")
    parser.add_argument("--split", help="X:Y prefill:decode instances (disagg) or N GPUs (colocated)")
    parser.add_argument("--rate", type=float, help="mean arrival rate, requests/s")
    parser.add_argument("--seed", type=int, default=7, help="random seed of the traffic (default 7)")
    parser.add_argument("--policy", help=f"autoscaling policy: {', '.join(POLICY_NAMES)}")
    parser.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set one of the policy's knobs (repeatable; docs/tuning.md lists them)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", metavar="FILE.png", help="plot rate and mix, x and y, latencies")
    parser.set_defaults(func=run)


def parse_split(text: str, mode: str) -> tuple[int, int]:
    """`X:Y` → (X, Y) prefill:decode instances (disagg); colocated takes `N`, `NG` or `0:N` → (0, N)."""
    parts = text.strip().upper().removesuffix("G").split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        raise SimConfigError(
            "--split", text, "must be X:Y (disagg) or N (colocated), whole numbers"
        ) from None
    if len(numbers) == 1 and mode == "colocated":
        if numbers[0] < 1:
            raise SimConfigError("--split", text, "a co-located fleet needs N >= 1 GPUs")
        return 0, numbers[0]
    if len(numbers) != 2 or min(numbers) < 0:
        raise SimConfigError("--split", text, "must be X:Y prefill:decode instances, two whole numbers >= 0")
    prefill, decode = numbers
    if mode == "colocated":
        if prefill != 0 or decode < 1:
            raise SimConfigError("--split", text, "a co-located fleet is N (or 0:N) GPUs, N >= 1")
    elif prefill < 1 or decode < 1:
        raise SimConfigError(
            "--split",
            text,
            "a PD fleet needs >= 1 prefill and >= 1 decode instance (a co-located fleet: --mode colocated --split N)",
        )
    return prefill, decode


PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "webp", "eps", "ps", "tif", "tiff")


def check_plot_path(path: str) -> None:
    """Refuse a plot file that cannot be written before a possibly long run, not after it."""
    target = Path(path)
    if target.suffix.lower().lstrip(".") not in PLOT_FORMATS:
        raise SimConfigError("--plot", path, f"must end in one of .{', .'.join(PLOT_FORMATS)}")
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise SimConfigError("--plot", path, "is a directory, not a file")
    if not folder.is_dir():
        raise SimConfigError("--plot", path, f"folder {str(folder)!r} does not exist")
    existed = target.exists()
    try:  # permissions alone do not tell (root, read-only or virtual file systems): try it
        with target.open("ab"):
            pass
    except OSError as error:
        raise SimConfigError("--plot", path, f"is not writable ({error.strerror or error})") from None
    if not existed:
        target.unlink()


def check_arguments(args: argparse.Namespace) -> None:
    """What the flags alone can tell is wrong, before any scenario is loaded or traffic drawn."""
    if args.rate is not None and not (math.isfinite(args.rate) and args.rate > 0):
        raise SimConfigError("--rate", args.rate, "must be a finite number > 0 (requests/s)")
    if args.policy is not None and args.policy not in POLICY_NAMES:
        raise SimConfigError("--policy", args.policy, f"unknown policy; known: {', '.join(POLICY_NAMES)}")
    if args.plot:
        check_plot_path(args.plot)


def parse_knobs(texts: list[str]) -> dict[str, float]:
    """`["tolerance=0.2", ...]` → {"tolerance": 0.2}; the policy's `configure` checks names and ranges."""
    knobs: dict[str, float] = {}
    for text in texts:
        name, sep, value = (part.strip() for part in text.partition("="))
        if not sep or not name:
            raise SimConfigError("--knob", text, "must be NAME=VALUE")
        if name in knobs:
            raise SimConfigError(f"--knob {name}", value, "given more than once")
        try:
            knobs[name] = float(value)
        except ValueError:
            raise SimConfigError(f"--knob {name}", value, "must be a number") from None
    return knobs


def implied_mode(split: str | None) -> Mode | None:
    """`--split X:Y` means a PD fleet (X prefill, Y decode instances), so it needs no `--mode disagg`."""
    return "disagg" if split is not None and ":" in split else None


def apply_overrides(scenario: Scenario, args: argparse.Namespace) -> Scenario:
    """The scenario with the command line's mode, split and policy."""
    fleet = scenario.config.fleet
    mode = args.mode or implied_mode(args.split) or fleet.mode
    if args.split is not None:
        prefill, decode = parse_split(args.split, mode)
    elif mode != fleet.mode:
        total = fleet.prefill + fleet.decode
        prefill, decode = (0, total) if mode == "colocated" else (total // 2, total - total // 2)
    else:
        prefill, decode = fleet.prefill, fleet.decode
    config = dataclasses.replace(scenario.config, fleet=Fleet(mode, prefill, decode))
    policy = args.policy if args.policy is not None else scenario.policy
    if mode == "colocated" and policy not in (None, "static"):
        raise SimConfigError("--policy", policy, "autoscaling runs need --mode disagg")
    return dataclasses.replace(scenario, config=config, policy=policy)


def run(args: argparse.Namespace) -> int:
    err = _StderrConsole()
    try:
        check_arguments(args)
        knobs = parse_knobs(args.knob)
        scenario = apply_overrides(load_scenario(args.scenario), args)
        trace = scenario.traffic.build(args.seed, args.rate)
        config = scenario.config
        policy: Policy | None = None
        if scenario.policy is not None and config.fleet.mode == "disagg":
            from xpyd_controller.sim.policies import build_policy  # loads every policy

            policy = build_policy(scenario.policy, config, trace, knobs)
        elif knobs:
            raise SimConfigError("--knob", args.knob[0], "needs a policy in the loop (--policy, disagg)")
    except InputError as error:  # a flag, the scenario file, a trace or a policy knob
        err.print(f"xpyd simulate: {error}", markup=False, highlight=False)
        return 2
    started = time.perf_counter()
    last_report = [started]
    horizon = trace.duration_s

    def progress(sim_time: float, done: int, total: int) -> None:
        now = time.perf_counter()
        if now - last_report[0] >= PROGRESS_EVERY_S:
            last_report[0] = now
            err.print(
                f"simulated {sim_time:,.0f}/{horizon:,.0f} s, {done:,}/{total:,} requests done "
                f"({now - started:.0f} s wall)",
                highlight=False,
            )

    result = simulate(config, trace, policy, limits=scenario.limits, progress=progress)
    wall = time.perf_counter() - started
    summary: dict[str, Any] = {
        "scenario": scenario.name,
        "mode": config.fleet.mode,
        "split": f"{config.fleet.prefill}:{config.fleet.decode}",
        "rate": args.rate if args.rate is not None else scenario.traffic.rate,
        "seed": args.seed,
        "policy": scenario.policy if policy is not None else None,
        "knobs": knobs,
        **result.summary(),
        "wall_seconds": wall,
        "requests_per_wall_second": result.requests / wall,
    }
    if scenario.step_at_s is not None:
        summary["recovery_seconds"] = recovery_time_s(result, scenario.step_at_s)
    if args.json:
        print(json.dumps({k: _json_value(v) for k, v in summary.items()}))
    else:
        from rich.console import Console

        Console().print(summary_table(summary, result))
    if args.plot:
        try:
            plot_run(
                result,
                args.plot,
                title=f"{scenario.name} · {summary['policy'] or summary['split']}",
                slo=config.slo,
                gpus_per_instance=config.hardware.gpus_per_instance,
            )
        except OSError as error:  # checked up front; the file system can still change during the run
            err.print(f"xpyd simulate: --plot {args.plot!r}: {error.strerror or error}", markup=False)
            return 2
    return 0


class _StderrConsole:
    """Messages on stderr, with rich loaded only when a line is printed (start-up is most of a seed run)."""

    def print(self, text: str, **options: Any) -> None:
        from rich.console import Console

        Console(stderr=True).print(text, **options)


def _json_value(value: object) -> object:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def summary_table(summary: dict[str, Any], result: SimResult) -> Table:
    """The human-readable result: what ran, then latency, goodput, cost and scaling activity."""
    from rich.table import Table

    table = Table(title=f"xpyd simulate · {summary['scenario']}", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    ms = "{:,.1f} ms"
    rows = [
        (
            "fleet",
            f"{summary['mode']} {summary['split']}"
            + (f" → {summary['policy']}" if summary["policy"] else ""),
        ),
        ("requests", f"{result.requests:,} in {result.duration_s:,.0f} s simulated"),
        ("goodput (all SLO bounds)", f"{result.goodput:.1%}"),
        (
            "goodput TTFT+TPOT / TTFT+max gap",
            f"{result.goodput_ttft_tpot:.1%} / {result.goodput_max_gap:.1%}",
        ),
        (
            "TTFT p50 / p90 / p99",
            " / ".join(ms.format(v * 1e3) for v in (result.ttft_p50, result.ttft_p90, result.ttft_p99)),
        ),
        ("TPOT p50 / p99", " / ".join(ms.format(v * 1e3) for v in (result.tpot_p50, result.tpot_p99))),
        ("TBT p50 / p99", " / ".join(ms.format(v * 1e3) for v in (result.tbt_p50, result.tbt_p99))),
        ("output tokens / GPU-second", f"{result.tokens_per_gpu_second:,.0f}"),
        ("GPU-hours", f"{result.gpu_hours:,.2f}"),
        ("good requests / GPU-hour", f"{result.good_requests_per_gpu_hour:,.0f}"),
        (
            "scale-ups / scale-downs / conversions",
            f"{result.scale_ups} / {result.scale_downs} / {result.conversions}",
        ),
        ("oscillations", str(result.oscillations)),
    ]
    if "recovery_seconds" in summary:
        rows.append(("time to recover after the step", f"{summary['recovery_seconds']:,.0f} s"))
    rows.append(("simulator speed", f"{summary['requests_per_wall_second']:,.0f} requests/s"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def _step_markers(
    hours: list[float], counts: list[int]
) -> tuple[list[float], list[int], list[float], list[int]]:
    """(times, sizes) where a pool grew and where it shrank, from one series of ready counts."""
    ups: tuple[list[float], list[int]] = ([], [])
    downs: tuple[list[float], list[int]] = ([], [])
    for i in range(1, len(counts)):
        if counts[i] != counts[i - 1]:
            target = ups if counts[i] > counts[i - 1] else downs
            target[0].append(hours[i])
            target[1].append(counts[i])
    return ups[0], ups[1], downs[0], downs[1]


# Legends sit to the right of each panel, outside its data.
_OUTSIDE: dict[str, Any] = {
    "loc": "upper left",
    "bbox_to_anchor": (1.08, 1.0),
    "fontsize": 8,
    "frameon": False,
}


def _plot_traffic(traffic: Axes, hours: list[float], series: Sequence[SeriesPoint]) -> None:
    """Arrival rate, with the input:output token ratio on a second axis: the mix moves the best split."""
    traffic.plot(hours, [p.arrival_rate for p in series], label="arrivals (req/s)", color="black")
    traffic.set_ylabel("requests/s")
    traffic.set_ylim(bottom=0)
    mix = traffic.twinx()
    mix.plot(
        hours,
        [p.mean_input_tokens / max(p.mean_output_tokens, 1e-9) for p in series],
        label="mean input / mean output tokens",
        color="tab:green",
    )
    mix.set_ylabel("input : output")
    mix.set_ylim(bottom=0)
    traffic.legend(handles=[*traffic.get_lines(), *mix.get_lines()], **_OUTSIDE)


def _conversion_hours(hours: list[float], prefill: list[int], decode: list[int]) -> list[float]:
    """When one pool grew while the other shrank in the same window: a role conversion."""
    return [
        hours[i]
        for i in range(1, len(hours))
        if (prefill[i] - prefill[i - 1]) * (decode[i] - decode[i - 1]) < 0
    ]


def _plot_fleet(
    fleet: Axes, hours: list[float], series: Sequence[SeriesPoint], gpus_per_instance: int
) -> None:
    """Ready instances per pool with a mark at each scale step and a line at each conversion, and the
    GPUs paid for on a second axis, so each decision shows next to its cost."""
    prefill = [p.prefill_ready for p in series]
    decode = [p.decode_ready for p in series]
    fleet.step(hours, prefill, where="post", label="prefill ready (x)", color="tab:blue")
    fleet.step(hours, decode, where="post", label="decode ready (y)", color="tab:orange")
    for counts, colour in ((prefill, "tab:blue"), (decode, "tab:orange")):
        up_t, up_n, down_t, down_n = _step_markers(hours, counts)
        fleet.scatter(up_t, up_n, marker="^", color=colour, s=18, zorder=5)
        fleet.scatter(down_t, down_n, marker="v", color=colour, s=18, zorder=5)
    fleet.scatter([], [], marker="^", color="grey", s=18, label="pool grew")
    fleet.scatter([], [], marker="v", color="grey", s=18, label="pool shrank")
    for i, when in enumerate(_conversion_hours(hours, prefill, decode)):
        fleet.axvline(
            when, color="tab:purple", alpha=0.35, linewidth=1, label="conversion" if i == 0 else None
        )
    fleet.set_ylabel("instances")
    fleet.set_ylim(bottom=0)
    gpus = fleet.twinx()
    gpus.step(
        hours,
        [p.instances_paid * gpus_per_instance for p in series],
        where="post",
        label="GPUs paid for",
        color="0.35",
        linestyle=":",
    )
    gpus.set_ylabel("GPUs")
    gpus.set_ylim(bottom=0)
    handles = fleet.get_legend_handles_labels()[0] + gpus.get_legend_handles_labels()[0]
    fleet.legend(handles=handles, **_OUTSIDE)


def _plot_tpot(per_token: Axes, hours: list[float], series: Sequence[SeriesPoint], slo: GoodputSlo) -> None:
    """TPOT percentiles in ms and the SLO's per-token bound (TPOT, else the token gap) if it has one;
    the axis starts at zero so rounding noise in a flat TPOT stays flat."""
    tpot_p99 = [p.tpot_p99_s * 1e3 for p in series]
    for name, label in (("tpot_p50_s", "TPOT p50"), ("tpot_p99_s", "TPOT p99")):
        per_token.plot(hours, [getattr(p, name) * 1e3 for p in series], label=label, linestyle="--")
    tpot_bound = slo.tpot_s if slo.tpot_s is not None else slo.max_token_gap_s
    finite = [v for v in tpot_p99 if math.isfinite(v)]
    top = max([*finite, 0.0]) * 1.25
    if tpot_bound is not None:
        per_token.axhline(
            tpot_bound * 1e3,
            color="tab:red",
            linestyle="--",
            linewidth=1,
            label=f"TPOT SLO {tpot_bound * 1e3:g} ms",
        )
        top = max(top, tpot_bound * 1e3 * 1.25)
    per_token.set_ylim(0, top or 1.0)
    per_token.set_ylabel("TPOT (ms)")


def _plot_latency(latency: Axes, hours: list[float], series: Sequence[SeriesPoint], slo: GoodputSlo) -> None:
    """TTFT percentiles on a log axis against the TTFT SLO, with TPOT on a second axis."""
    for name, label, style in (("ttft_p50_s", "TTFT p50", "-"), ("ttft_p99_s", "TTFT p99", "-")):
        latency.plot(hours, [getattr(p, name) for p in series], label=label, linestyle=style)
    latency.axhline(slo.ttft_s, color="tab:red", linewidth=1, label=f"TTFT SLO {slo.ttft_s:g} s")
    latency.set_ylabel("TTFT (s, log)")
    latency.set_yscale("log")
    per_token = latency.twinx()
    _plot_tpot(per_token, hours, series, slo)
    handles = latency.get_legend_handles_labels()[0] + per_token.get_legend_handles_labels()[0]
    latency.legend(handles=handles, **_OUTSIDE)


def _plot_goodput(good: Axes, hours: list[float], series: Sequence[SeriesPoint]) -> None:
    """Goodput per window against a 99 % line, to show when the SLO was missed."""
    good.plot(hours, [p.goodput * 100 for p in series], color="black", label="goodput per window")
    good.axhline(99, color="tab:red", linewidth=1, linestyle=":", label="99 %")
    good.set_ylim(0, 102)
    good.set_ylabel("goodput (%)")
    good.set_xlabel("hours")
    good.legend(**_OUTSIDE)


def plot_run(result: SimResult, path: str, title: str, slo: GoodputSlo, gpus_per_instance: int) -> None:
    """Four panels over time: traffic and mix; instances (scale and conversion marks) and GPUs;
    TTFT and TPOT percentiles against their SLO lines; per-window goodput. Legends sit outside the data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = result.series
    hours = [p.start_s / 3600.0 for p in series]
    figure, (traffic, fleet, latency, good) = plt.subplots(
        4, 1, figsize=(11, 11), sharex=True, gridspec_kw={"height_ratios": [2, 2, 2, 1.2]}
    )
    _plot_traffic(traffic, hours, series)
    _plot_fleet(fleet, hours, series, gpus_per_instance)
    _plot_latency(latency, hours, series, slo)
    _plot_goodput(good, hours, series)
    for axis in (traffic, fleet, latency, good):
        axis.grid(alpha=0.3)
    figure.suptitle(
        f"{title} — goodput {result.goodput:.1%}, {result.gpu_hours:,.1f} GPU-hours, "
        f"{result.scale_ups} scale-ups, {result.conversions} conversions"
    )
    figure.tight_layout(rect=(0, 0, 0.82, 0.97))
    figure.savefig(path, dpi=100)
    plt.close(figure)
