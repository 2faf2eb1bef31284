"""NVIDIA Dynamo's own planner (PyPI ai-dynamo 1.6.1) as a benchmark baseline in xpyd's simulator loop.

Not a shipped policy: it needs the optional benchmark venv (`hack/dynamo-bench`), and without it
`available()` is False and the benchmarks list the rows as missing. The adapter drives Dynamo's
builtin planner pipeline (`OrchestratorEngineAdapter`, the same object Dynamo's offline replay and
live planner tick) the way Dynamo's replay adapter does: between pipeline ticks it accumulates the
observed traffic (requests, mean ISL/OSL), and at each tick it hands over `TickInput(now_s, traffic,
worker_counts)` and applies `PlannerEffects.scale_to` as the desired counts. Dynamo's SLA mode plans
from forward-pass estimates, which `peers/aisimulate_core` answers from xpyd's roofline (the same cost
model the simulator runs). Dynamo never converts roles: its decisions carry `allow_conversion=False`.

Configuration: disaggregated, `optimization_target="sla"` (throughput scaling from predicted traffic,
Dynamo's default 180 s adjustment interval), TTFT/ITL targets from the scenario's SLO, GPU budget and
minimum endpoints from the scenario's limits, the load predictor named in the policy
(`dynamo-1.6.1-constant`, `dynamo-1.6.1-arima`; ARIMA is Dynamo's default).
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpyd_controller.policy.limits import clamp
from xpyd_controller.policy.types import Decision, Limits, Observation, PoolState
from xpyd_controller.sim.config import SimConfig

DYNAMO_VERSION = "1.6.1"
PREDICTORS = ("constant", "arima")
POLICY_PREFIX = f"dynamo-{DYNAMO_VERSION}-"
NAMES = tuple(POLICY_PREFIX + p for p in PREDICTORS)
STAND_IN = Path(__file__).resolve().parent / "peers"


def _load() -> None:
    if str(STAND_IN) not in sys.path:
        sys.path.insert(0, str(STAND_IN))
    for noisy in ("dynamo", "prophet", "cmdstanpy", "pmdarima"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def require() -> None:
    """Import Dynamo's planner pipeline and its version, or raise ImportError saying how to get it."""
    _load()
    try:
        from importlib.metadata import version

        import dynamo._core  # noqa: F401
        from dynamo.planner.plugins.orchestrator.engine_adapter import OrchestratorEngineAdapter  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"Dynamo's planner is not importable ({error}); run benchmarks under hack/dynamo-bench"
        ) from error
    found = version("ai-dynamo")
    if found != DYNAMO_VERSION:
        raise ImportError(f"ai-dynamo {found} installed, the benchmarks pin {DYNAMO_VERSION}")


def available() -> bool:
    try:
        require()
    except ImportError:
        return False
    return True


@dataclass
class _Window:
    """Traffic since the last pipeline tick, merged as Dynamo's replay adapter merges windows."""

    duration_s: float = 0.0
    requests: float = 0.0
    input_tokens: float = 0.0
    output_tokens: float = 0.0

    def add(self, observation: Observation, dt: float) -> None:
        rate, isl, osl = (
            observation.arrival_rate,
            observation.mean_input_tokens,
            observation.mean_output_tokens,
        )
        if rate is None or not math.isfinite(rate) or dt <= 0:
            return  # no data: the window is shorter, as a failed Prometheus query leaves it
        self.duration_s += dt
        self.requests += rate * dt
        if rate > 0 and isl is not None and osl is not None:
            self.input_tokens += rate * dt * isl
            self.output_tokens += rate * dt * osl


@dataclass
class RealDynamoPlanner:
    """xpyd's `Policy` protocol around Dynamo's planner pipeline (one instance per simulated run)."""

    name: str
    engine: Any
    loop: asyncio.AbstractEventLoop
    pending_tick: Any
    last_time_s: float | None = None
    window: _Window = field(default_factory=_Window)
    targets: dict[str, int | None] = field(default_factory=lambda: {"prefill": None, "decode": None})

    def decide(self, observation: Observation, limits: Limits) -> Decision:
        dt = observation.time_s - (self.last_time_s if self.last_time_s is not None else 0.0)
        self.last_time_s = observation.time_s
        self.window.add(observation, min(dt, observation.window_s))
        if observation.time_s < self.pending_tick.at_s:
            return Decision(
                None, None, binding="dynamo_planner", reasons=("BetweenTicks",), allow_conversion=False
            )
        effects = self._tick_until(observation)
        diag = effects.diagnostics
        reasons = tuple(
            r for r in (diag.throughput_decision_reason, diag.short_circuit_reason, diag.execute_action) if r
        )
        details = {
            k: float(v)
            for k, v in (
                ("predicted_num_req", diag.predicted_num_req),
                ("predicted_isl", diag.predicted_isl),
                ("predicted_osl", diag.predicted_osl),
                ("engine_rps_prefill", diag.engine_rps_prefill),
                ("engine_rps_decode", diag.engine_rps_decode),
            )
            if v is not None
        }
        scale = effects.scale_to
        if scale is None or (scale.num_prefill is None and scale.num_decode is None):
            return Decision(
                None, None, "dynamo_planner", reasons or ("NoChange",), details, allow_conversion=False
            )
        prefill = scale.num_prefill if scale.num_prefill is not None else _serving(observation.prefill)
        decode = scale.num_decode if scale.num_decode is not None else _serving(observation.decode)
        g_p, g_d = observation.prefill.gpus_per_instance, observation.decode.gpus_per_instance
        bounded = clamp(prefill, decode, limits, g_p, g_d)
        return Decision(
            bounded.prefill,
            bounded.decode,
            bounded.binding or "dynamo_planner",
            (*(reasons or ("Scale",)), *bounded.reasons),
            details,
            allow_conversion=False,
        )

    def _tick_until(self, observation: Observation) -> Any:
        """Run every pipeline tick due by now (Dynamo ticks every 5 s, the simulator scrapes every 15 s)."""
        from dynamo.planner.core.types import ScalingDecision, TickInput, TrafficObservation

        scale_to, reported, effects = None, None, None
        while self.pending_tick.at_s <= observation.time_s:
            tick = self.pending_tick
            traffic = None
            if tick.need_traffic_metrics and self.window.duration_s > 0:
                w = self.window
                traffic = TrafficObservation(
                    duration_s=w.duration_s,
                    num_req=w.requests,
                    isl=w.input_tokens / w.requests if w.requests > 0 else 0.0,
                    osl=w.output_tokens / w.requests if w.requests > 0 else 0.0,
                )
                self.window = _Window()
            tick_input = TickInput(
                now_s=tick.at_s, traffic=traffic, worker_counts=self._worker_counts(observation)
            )
            effects = self.loop.run_until_complete(self.engine.tick(tick, tick_input))
            if effects.scale_to is not None:
                scale_to = effects.scale_to
                self._remember_targets(scale_to)
            if effects.scale_to is not None or tick.run_throughput_scaling:
                reported = effects  # the tick whose diagnostics explain this decision
            if effects.next_tick is None:
                break
            self.pending_tick = effects.next_tick
        reported = reported or effects
        reported.scale_to = scale_to if scale_to is not None else ScalingDecision()
        return reported

    def _remember_targets(self, scale: Any) -> None:
        if scale.num_prefill is not None:
            self.targets["prefill"] = scale.num_prefill
        if scale.num_decode is not None:
            self.targets["decode"] = scale.num_decode

    def _worker_counts(self, observation: Observation) -> Any:
        """Ready and expected workers as Dynamo's replay adapter reports them."""
        from dynamo.planner.core.types import WorkerCounts

        current = {"prefill": _serving(observation.prefill), "decode": _serving(observation.decode)}
        for role, target in self.targets.items():
            if target is not None and current[role] == target and _settled(observation, role):
                self.targets[role] = None
        expected = {role: self.targets[role] or current[role] for role in current}
        return WorkerCounts(
            ready_num_prefill=observation.prefill.ready,
            ready_num_decode=observation.decode.ready,
            expected_num_prefill=expected["prefill"],
            expected_num_decode=expected["decode"],
            prefill_scaling_in_progress=self.targets["prefill"] is not None,
            decode_scaling_in_progress=self.targets["decode"] is not None,
        )


def _serving(pool: PoolState) -> int:
    """Instances that are or will be serving this role (Dynamo's non-draining count)."""
    return pool.ready + pool.starting


def _settled(observation: Observation, role: str) -> bool:
    pool = observation.prefill if role == "prefill" else observation.decode
    return pool.starting == 0 and pool.draining == 0


def planner_config(**settings: Any) -> Any:
    """Dynamo's PlannerConfig for a virtual (in-process, offline) disaggregated vLLM deployment, with no
    Prometheus, control API or dashboard port opened; `settings` add the run's own choices."""
    require()
    from dynamo.planner.config.planner_config import PlannerConfig

    return PlannerConfig(
        environment="virtual",
        namespace="xpyd-bench",
        backend="vllm",
        mode="disagg",
        pre_deployment_sweeping_mode="none",
        metric_reporting_prometheus_port=0,
        control_api_port=0,
        live_dashboard_port=0,
        **settings,
    )


def make_real_dynamo(name: str, config: SimConfig, limits: Limits) -> RealDynamoPlanner:
    """Dynamo's planner for one simulated run; `name` picks the load predictor."""
    if name not in NAMES:
        raise ValueError(f"unknown real-Dynamo policy {name!r}; known: {', '.join(NAMES)}")
    require()
    from aisimulate_core.sdk import RooflineDeployment, use_roofline
    from dynamo.planner.core.types import EngineCapabilities, WorkerCapabilities
    from dynamo.planner.plugins.clock import VirtualClock
    from dynamo.planner.plugins.orchestrator.engine_adapter import OrchestratorEngineAdapter

    hw, slo = config.hardware, config.slo
    width = hw.gpus_per_instance
    engine_model = RooflineDeployment(
        hw.model, hw.gpu, width, hw.step_overhead_s, decode_kv_reads=config.realism.decode_kv_reads
    )
    use_roofline(prefill=engine_model, decode=engine_model)
    itl = slo.tpot_s if slo.tpot_s is not None else slo.max_token_gap_s
    budget = (
        limits.gpu_budget
        if limits.gpu_budget is not None
        else width * (limits.prefill_max + limits.decode_max)
    )
    settings = planner_config(
        optimization_target="sla",
        enable_throughput_scaling=True,
        enable_load_scaling=False,
        load_predictor=name.removeprefix(POLICY_PREFIX),
        ttft_ms=slo.ttft_s * 1e3,
        itl_ms=(itl if itl is not None else 0.1) * 1e3,
        prefill_engine_num_gpu=width,
        decode_engine_num_gpu=width,
        max_gpu_budget=budget,
        prefill_min_endpoint=limits.prefill_min,
        decode_min_endpoint=limits.decode_min,
        # Dynamo abandons a pipeline tick that takes 30 s of wall time (auto_arima can, on a loaded
        # machine) and then loses its traffic window: a benchmark judges decisions, not host speed.
        scheduling={"tick_max_duration_seconds": 3600.0},
    )
    free_hbm = hw.gpu.hbm_bytes * width * config.realism.kv_memory_fraction - hw.model.weight_footprint_bytes
    kv_tokens = max(1, int(free_hbm / hw.model.kv_bytes_per_token))
    capabilities = EngineCapabilities(num_gpu=width, max_kv_tokens=kv_tokens)
    engine = OrchestratorEngineAdapter(
        settings, WorkerCapabilities(prefill=capabilities, decode=capabilities), clock=VirtualClock()
    )
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.bootstrap_plugins(historical_traffic=None))
    return RealDynamoPlanner(name, engine, loop, engine.initial_tick(0.0))
