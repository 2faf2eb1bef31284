"""PromQL for every signal the policy reads, per engine family (pure: strings in, strings out).

Each signal is measured on the pool where it means what the policy needs: request arrivals and prompt
lengths on the prefill pool (a request leaves a prefill instance right after its prefill, so these are
admissions to prefill, not decode completions), output lengths, latencies, running requests and KV usage
on the decode pool, which serves the request to the client. Where an engine renamed a metric, the newer
name is tried first and the older one is joined with `or`, so one controller reads both releases. The
engines' names are in xpyd_api.engines (ENGINES[type].metrics; custom engines are read with vLLM's).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from xpyd_api.engines import MetricNames
from xpyd_api.models import RouterType
from xpyd_api.names import Role

QUANTILE = 0.9  # the Observation's p90 fields
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class Signal(StrEnum):
    """One number the controller asks Prometheus for; the Observation is computed from them."""

    ARRIVAL_RATE = "arrival_rate"  # requests/s arriving at prefill (finished there + its in-flight growth)
    PREFILL_FINISHED_RATE = "prefill_finished_rate"  # requests/s whose prompt prefill finished
    INPUT_TOKENS_RATE = "input_tokens_rate"  # prompt tokens/s of those requests (÷ finished = mean)
    INPUT_TOKENS_P90 = "input_tokens_p90"
    OUTPUT_REQUESTS_RATE = "output_requests_rate"  # requests/s finishing decode
    OUTPUT_TOKENS_RATE = "output_tokens_rate"  # generated tokens/s of those requests
    OUTPUT_TOKENS_P90 = "output_tokens_p90"
    PREFIX_QUERIES_RATE = "prefix_queries_rate"  # prompt tokens/s looked up in the prefix cache
    PREFIX_HITS_RATE = "prefix_hits_rate"  # of which found
    PREFILL_QUEUE = "prefill_queue"
    DECODE_RUNNING = "decode_running"
    DECODE_WAITING = "decode_waiting"
    DECODE_KV_USAGE = "decode_kv_usage"
    TTFT_P90 = "ttft_p90"
    TPOT_P90 = "tpot_p90"
    # means, not percentiles: the online calibration's readings (model/calibration.py); the xpyd policy
    # also reads TPOT_MEAN as an optional measurement of its decode step (absent: the roofline's)
    PREFILL_TTFT_MEAN = "prefill_ttft_mean"  # the prefill pool's own TTFT: its compute while none waits
    TPOT_MEAN = "tpot_mean"  # the decode pool's mean time between output tokens: one decode step


CALIBRATION_SIGNALS = frozenset({Signal.PREFILL_TTFT_MEAN, Signal.TPOT_MEAN})
# What the policy's Observation is made of: the signals whose absence is "missing data" in status and
# whose corruption holds scale-downs (the calibration's only skip a reading).
POLICY_SIGNALS = tuple(signal for signal in Signal if signal not in CALIBRATION_SIGNALS)


@dataclass(frozen=True)
class LabelNames:
    """Labels the scrape attaches to every engine series (relabelled from the pods' xpyd.dev labels)."""

    namespace: str = "namespace"
    pdd: str = "pdd"
    role: str = "role"

    def __post_init__(self) -> None:
        for field, value in (("namespace", self.namespace), ("pdd", self.pdd), ("role", self.role)):
            if not _LABEL_NAME.fullmatch(value):
                raise ValueError(f"label name for {field} = {value!r}: must match [a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True)
class RouterMetrics:
    """A router's series, read without a role label (the router serves both pools): what it measures
    on the users' side of the prefill/decode split. Empty entries: the router does not export it."""

    requests: Sequence[str]  # counter of requests the router served
    ttft: Sequence[str]  # histogram of time to first token on the users' clock (base name)
    # histogram (base name) of the time from the router taking a request until decode's response
    # starts: prefill's whole leg with the hops around it, and decode's first step where decode's API
    # process answers late. Its mean less prefill's mean TTFT is the time outside prefill's clock.
    until_decode_responds: Sequence[str] = ()


# vllm-router 0.1.17 (read in its sources, measured): PD requests per route; no time-to-first-token
# series: its vllm_router_pd_request_duration_seconds is recorded when decode's response headers
# arrive, before decode's first token (and its buckets are 2x apart: only its mean is read).
VLLM_ROUTER = RouterMetrics(
    requests=("vllm_router_pd_requests_total",),
    ttft=(),
    until_decode_responds=("vllm_router_pd_request_duration_seconds",),
)

ROUTER_METRICS: Mapping[RouterType, RouterMetrics] = {RouterType.VLLM_ROUTER: VLLM_ROUTER}


def check_window(window_s: float) -> None:
    """Rates need at least two samples; below a second no scrape setup provides them."""
    if not window_s >= 1:
        raise ValueError(f"rate window = {window_s!r} s: must be at least 1 s")


def _quote(value: str) -> str:
    """A PromQL string literal (backslashes and double quotes escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Scope:
    """Which series belong to one PDDeployment's pools, and the rate window."""

    namespace: str
    pdd: str
    window_s: float
    labels: LabelNames = LabelNames()

    def __post_init__(self) -> None:
        check_window(self.window_s)

    def selector(self, role: Role | None) -> str:
        """The pool's series (`role`), or with None the PDDeployment's series without a role (routers)."""
        names = self.labels
        role_value = "" if role is None else str(role)  # `role=""` matches series without the label
        pairs = ((names.namespace, self.namespace), (names.pdd, self.pdd), (names.role, role_value))
        return "{" + ",".join(f"{label}={_quote(value)}" for label, value in pairs) + "}"

    @property
    def window(self) -> str:
        return f"{round(self.window_s)}s"


def _either(queries: Sequence[str]) -> str:
    return " or ".join(queries)


def _rate(names: Sequence[str], scope: Scope, role: Role | None) -> str:
    """Summed per-second increase of a counter over the window."""
    selector = scope.selector(role)
    return _either([f"sum(rate({name}{selector}[{scope.window}]))" for name in names])


def _quantile(names: Sequence[str], scope: Scope, role: Role | None) -> str:
    selector = scope.selector(role)
    return _either(
        [
            f"histogram_quantile({QUANTILE}, sum by (le) (rate({name}_bucket{selector}[{scope.window}])))"
            for name in names
        ]
    )


def _growth(families: Sequence[Sequence[str]], scope: Scope, role: Role) -> str:
    """Per-second growth of the summed gauges (each family's names joined with `or`) over the window:
    the least-squares slope of each series, summed."""
    selector = scope.selector(role)
    return " + ".join(
        "(" + _either([f"sum(deriv({name}{selector}[{scope.window}]))" for name in names]) + ")"
        for names in families
        if names
    )


def _arrivals(engine: MetricNames, scope: Scope) -> str:
    """Requests/s arriving at the prefill pool, from its engines.

    Engines count a request when it finishes (vLLM observes the prompt length then; SGLang's request
    counter too): on the prefill pool that is when its prefill is done. While prefill keeps up that is
    the arrival rate; when it does not (a swing to long prompts, one instance left), it is prefill's
    throughput, and the queue holds the rest: sized on it, prefill grows only by what it already
    manages. Requests in flight are conserved: arrivals = finished + the growth of the requests waiting
    and running on the pool (`deriv` of the gauges over the window; 0 when the gauges are missing, so
    the finished rate alone is read as before). Never below 0.
    """
    finished = _rate(engine.requests_in, scope, Role.PREFILL)
    growth = _growth((engine.waiting, engine.running), scope, Role.PREFILL)
    if not finished or not growth:
        return finished
    return f"clamp_min(({finished}) + (({growth}) or vector(0)), 0)"


def _gauge(aggregate: str, names: Sequence[str], scope: Scope, role: Role) -> str:
    selector = scope.selector(role)
    return _either([f"{aggregate}({name}{selector})" for name in names])


def _mean(names: Sequence[str], scope: Scope, role: Role | None) -> str:
    """Mean of a histogram's observations over the window (its sum's rate over its count's)."""
    selector = scope.selector(role)
    return _either(
        [
            f"sum(rate({name}_sum{selector}[{scope.window}])) / sum(rate({name}_count{selector}[{scope.window}]))"
            for name in names
        ]
    )


def _two_legs(prefill_leg: Sequence[str], decode_leg: Sequence[str], scope: Scope) -> str:
    """The p90 of prefill's TTFT plus decode's, taken as independent: both means plus the root of the
    summed squares of each p90's excess over its mean. Exact for normal legs, within 2 % for two
    equal exponential ones, and where one leg dominates it is that leg's p90 plus the other's mean;
    the sum of the two p90s would overstate it by up to the smaller leg's spread (about 20 % for
    equal legs)."""
    prefill = (_quantile(prefill_leg, scope, Role.PREFILL), _mean(prefill_leg, scope, Role.PREFILL))
    decode = (_quantile(decode_leg, scope, Role.DECODE), _mean(decode_leg, scope, Role.DECODE))
    (p90_p, mean_p), (p90_d, mean_d) = prefill, decode
    spread = f"sqrt((({p90_p}) - ({mean_p}))^2 + (({p90_d}) - ({mean_d}))^2)"
    return f"({mean_p}) + ({mean_d}) + {spread}"


def _ttft(engine: MetricNames, router: RouterMetrics | None, scope: Scope) -> str:
    """TTFT on the users' clock: the router's where it exports one. Else, for engines whose decode
    gets the request after prefill, prefill's TTFT plus decode's (whose own TTFT includes the KV pull)
    combined as two independent legs, plus the router's mean time outside prefill's clock where the
    router exports how long it took until decode's response started (vLLM sends its streaming headers
    before the first token, so decode's TTFT follows the router's clock). Without prefill TTFT samples
    in the window (an engine that records the users' TTFT on decode, as xpyd's simulator does) decode's
    alone; `>= 0` drops the NaN an empty histogram gives, so `or` falls through to the next alternative."""
    decode = _quantile(engine.ttft, scope, Role.DECODE)
    alternatives = [_quantile(router.ttft, scope, None)] if router else []
    if engine.ttft_prefill_leg and decode:
        legs = _two_legs(engine.ttft_prefill_leg, engine.ttft, scope)
        if router and router.until_decode_responds:
            prefill_mean = _mean(engine.ttft_prefill_leg, scope, Role.PREFILL)
            outside = f"clamp_min(({_mean(router.until_decode_responds, scope, None)}) - ({prefill_mean}), 0)"
            alternatives.append(f"(({legs}) + {outside}) >= 0")
        alternatives.append(f"({legs}) >= 0")
    alternatives.append(decode)
    return _either([query for query in alternatives if query])


def build_queries(
    engine: MetricNames, scope: Scope, router: RouterMetrics | None = None
) -> dict[Signal, str]:
    """One PromQL expression per signal the engine (and router) export, for one PDDeployment's pools.

    Request arrivals and TTFT are taken from the router first, where it exports them (the users'
    side), then from the engines."""
    prefill, decode = Role.PREFILL, Role.DECODE
    arrivals = [_rate(router.requests, scope, None)] if router else []
    queries = {
        Signal.ARRIVAL_RATE: _either([q for q in [*arrivals, _arrivals(engine, scope)] if q]),
        Signal.PREFILL_FINISHED_RATE: _rate(engine.requests_in, scope, prefill),
        Signal.INPUT_TOKENS_RATE: _rate(engine.prompt_tokens, scope, prefill),
        Signal.INPUT_TOKENS_P90: _quantile(engine.prompt_histogram, scope, prefill),
        Signal.OUTPUT_REQUESTS_RATE: _rate(engine.requests_out, scope, decode),
        Signal.OUTPUT_TOKENS_RATE: _rate(engine.output_tokens, scope, decode),
        Signal.OUTPUT_TOKENS_P90: _quantile(engine.output_histogram, scope, decode),
        Signal.PREFIX_QUERIES_RATE: _rate(engine.prefix_queries, scope, prefill),
        Signal.PREFIX_HITS_RATE: _rate(engine.prefix_hits, scope, prefill),
        Signal.PREFILL_QUEUE: _gauge("sum", engine.waiting, scope, prefill),
        Signal.DECODE_RUNNING: _gauge("sum", engine.running, scope, decode),
        Signal.DECODE_WAITING: _gauge("sum", engine.waiting, scope, decode),
        Signal.DECODE_KV_USAGE: _gauge("avg", engine.kv_usage, scope, decode),
        Signal.TTFT_P90: _ttft(engine, router, scope),
        Signal.TPOT_P90: _quantile(engine.tpot, scope, decode),
        Signal.PREFILL_TTFT_MEAN: _mean(engine.ttft, scope, prefill),
        Signal.TPOT_MEAN: _mean(engine.tpot, scope, decode),
    }
    return {signal: query for signal, query in queries.items() if query}
