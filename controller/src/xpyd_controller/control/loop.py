"""The decision loop: for each PDDeployment in Advisory or Auto, every `intervalSeconds`, observe, ask
the policy, apply. All I/O goes through three small ports (Protocols), so this is tested with fakes and
driven live by the Kubernetes and Prometheus adapters.

One policy instance per PDDeployment uid keeps its state (stabilisation windows, rate limits, holds,
forecasts) across passes; it is rebuilt only when the spec's model, hardware, SLOs or autoscaling knobs
change. Every decision also keeps the policy's whole state in status (`policyState`), so a restarted
controller, or one taking over from another, continues exactly where the last decision left off; a
rebuilt policy, or one whose state was lost, holds the fleet it finds for a window; a kept state the
policy cannot trust is ignored as lost, said in a Warning and in the decision's reasons; a
PDDeployment never decided before starts fresh. When no signal has data
(Prometheus unreachable, or no series match) the decision holds: desired stays what the spec says.

Tenants are isolated: each PDDeployment's decision runs on a worker thread of its own, at most one in
flight per object, so a Prometheus that never answers delays only the PDDeployments that point at it
(and its adapter spends at most a per-tenant time budget per decision). Prometheus URLs are checked
before any request: http(s) only, no link-local or cloud-metadata address, written or resolved from the
host name at this decision, and within the allow-list when one is configured; a refused one is an
`invalid_setup` decision and a Warning naming the host.

Finite or nothing: an implausible metric value (NaN, ±Inf, 1e308, beyond physical bounds) is missing
data, and while any input was discarded the decision may grow a pool but never shrink one; a policy
answer that is not a whole number in range is no answer (hold). Nothing non-finite reaches the status.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from typing import Any, Protocol

from xpyd_api.engines import ENGINES
from xpyd_api.errors import InputError
from xpyd_api.models import AutoscalingMode, PDDeployment, PDDSpecError, parse_pdd
from xpyd_api.names import BINDING_INVALID_SETUP, Reason, Role
from xpyd_controller.control.endpoints import resolved_problem, url_problem
from xpyd_controller.control.observation import (
    build_observation,
    implausible_signals,
    live_window,
    missing_signals,
    sanitized,
)
from xpyd_controller.control.pools import pool_states
from xpyd_controller.control.promql import (
    POLICY_SIGNALS,
    ROUTER_METRICS,
    LabelNames,
    Scope,
    Signal,
    build_queries,
    check_window,
)
from xpyd_controller.control.setup import SetupError, calibrated_gpu, gpu_spec, limits, policy_context
from xpyd_controller.control.status import (
    KEY_STATE,
    DecisionRecord,
    calibration_report,
    parse_timestamp,
    policy_state,
    render_autoscaler,
    replacing_patch,
    timestamp,
    whole,
)
from xpyd_controller.model.calibration import LiveWindow, OnlineCalibration
from xpyd_controller.model.specs import GpuSpec
from xpyd_controller.policy.context import PolicyContext, Recalibrable
from xpyd_controller.policy.limits import LimitsError
from xpyd_controller.policy.registry import make_policy
from xpyd_controller.policy.types import Decision, Limits, Policy, Resumable

logger = logging.getLogger(__name__)

EVENT_SCALE = "ScaleDecision"
EVENT_NO_METRICS = "MetricsUnavailable"
EVENT_INVALID = Reason.INVALID_AUTOSCALING
EVENT_UNSUPPORTED = "UnsupportedField"
EVENT_CONCURRENT = "ConcurrentDeciders"
EVENT_STATE_IGNORED = "PolicyStateIgnored"  # also the decision's reason
KEY_DEFERRING = "deferringDecider"  # status.autoscaler key of a controller deferring to this one
CONCURRENT_INTERVALS = 3  # another controller's record this many intervals old still counts
BEARER_UNSUPPORTED = (
    "spec.autoscaling.prometheus.bearerTokenSecretRef is set but not supported yet: "
    "Prometheus is queried without a token"
)
HOLD_NO_METRICS = "NoMetricsHold"
HOLD_IMPLAUSIBLE = "ImplausibleInputsNoScaleDown"
HOLD_BAD_ANSWER = "PolicyAnswerRejected"


class ClusterPort(Protocol):
    """The Kubernetes calls the loop makes (objects as plain JSON dicts)."""

    def list_pdds(self) -> list[dict[str, Any]]: ...

    def list_instances(self, namespace: str, pdd: str) -> Iterable[dict[str, Any]]: ...

    def patch_replicas(self, namespace: str, name: str, prefill: int, decode: int) -> None: ...

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...

    def post_event(self, pdd: PDDeployment, reason: str, message: str, warning: bool = False) -> None: ...


class MetricsPort(Protocol):
    """One Prometheus: every query's value or None; `last_error` says why the last pass lacked data;
    `addresses` where its host name leads now."""

    last_error: str | None

    def addresses(self) -> Sequence[str]: ...

    def query_all(self, queries: Mapping[Signal, str]) -> dict[Signal, float | None]: ...


class Telemetry(Protocol):
    """The controller's own metrics."""

    def record_decision(self, pdd: PDDeployment, record: DecisionRecord) -> None: ...

    def forget(self, namespace: str, name: str) -> None: ...


DEFAULT_WORKERS = 32


@dataclass(frozen=True)
class Settings:
    policy: str = "xpyd"
    window_s: float = 60.0  # rate window of the PromQL queries
    labels: LabelNames = field(default_factory=LabelNames)
    prometheus_allow: tuple[str, ...] = ()  # URL prefixes a spec may name; empty = any (but see endpoints)
    identity: str = ""  # this controller's name in status.autoscaler.decider (detects a second decider)

    def __post_init__(self) -> None:
        check_window(self.window_s)


@dataclass
class _Tracked:
    """What the loop remembers about one PDDeployment between passes."""

    namespace: str
    name: str
    context: PolicyContext | None = None
    policy: Policy | None = None
    next_due: float = 0.0
    desired: tuple[int, int] | None = None
    problem: str = ""  # the last setup error or missing-metrics note, to post each Event once
    warned_unsupported: bool = False  # the UnsupportedField Warning was posted for this object
    in_flight: Future[DecisionRecord | None] | None = None  # the decision running now, if any
    warned_decider: str = ""  # the other decider a ConcurrentDeciders Warning was posted about
    calibration: OnlineCalibration = field(default_factory=OnlineCalibration)  # this deployment's readings
    gpu_in_use: GpuSpec | None = None  # the efficiencies the policy sizes with (calibrated or not)
    state_ignored: str = ""  # why this pass's resume ignored the kept policy state, for its decision
    warned_state: str = ""  # the ignored-state message last posted as a Warning (each once in a row)


def _same_setup(old: PolicyContext, new: PolicyContext) -> bool:
    """Equal but for the initial sizes (which follow the replicas the controller itself writes)."""
    return (
        dataclasses.replace(new, initial_prefill=old.initial_prefill, initial_decode=old.initial_decode)
        == old
    )


def _same_hardware(old: PolicyContext, new: PolicyContext) -> bool:
    """The calibration's readings still describe the same model on the same GPUs."""
    return (old.model, old.gpu, old.prefill_gpus_per_instance, old.decode_gpus_per_instance) == (
        new.model,
        new.gpu,
        new.prefill_gpus_per_instance,
        new.decode_gpus_per_instance,
    )


def _clamp(value: int, low: int, high: int) -> int:
    return min(high, max(low, value))


class Controller:
    def __init__(
        self,
        cluster: ClusterPort,
        metrics: Callable[[str], MetricsPort],
        telemetry: Telemetry,
        settings: Settings = Settings(),
        executor: Executor | None = None,
    ) -> None:
        self.cluster = cluster
        self.metrics = metrics  # Prometheus URL → port (the caller caches them)
        self.telemetry = telemetry
        self.settings = settings
        self._executor = executor or ThreadPoolExecutor(DEFAULT_WORKERS, thread_name_prefix="decide")
        self._tracked: dict[str, _Tracked] = {}
        self._invalid: dict[str, str] = {}  # uid → the spec error last logged for it

    def run_pass(self, now: float, wait_s: float | None = None) -> list[DecisionRecord]:
        """One look at every PDDeployment in scope: starts the decisions whose interval has elapsed
        (one in flight per object), waits up to `wait_s` (None: until all are done) and returns the
        decisions finished by then, this pass's or earlier ones'."""
        seen = set()
        invalid: dict[str, str] = {}  # uid → spec error, this pass
        for body in self.cluster.list_pdds():
            pdd = self._parsed(body, invalid)
            if pdd is None or pdd.spec.autoscaling.mode is AutoscalingMode.OFF:
                continue
            seen.add(pdd.uid)
            self._start_if_due(pdd, body, now)
        self._forget_all_but(seen)
        self._invalid = invalid
        return self._finished(wait_s)

    def _parsed(self, body: dict[str, Any], invalid: dict[str, str]) -> PDDeployment | None:
        """The object's spec, or None if it is invalid: the operator reports that (InvalidSpec), so it
        goes into `invalid` and is logged here only when its error changed since the last pass."""
        try:
            return parse_pdd(body)
        except PDDSpecError as error:
            metadata = body.get("metadata") or {}
            uid = metadata.get("uid", "")
            invalid[uid] = str(error)
            if self._invalid.get(uid) != invalid[uid]:
                logger.warning("skipping %s/%s: %s", metadata.get("namespace"), metadata.get("name"), error)
            return None

    def _start_if_due(self, pdd: PDDeployment, body: dict[str, Any], now: float) -> None:
        """Starts the object's decision on a worker once its interval has elapsed, unless one is still in
        flight: one at a time per object, so a slow Prometheus delays only the objects using it."""
        tracked = self._tracked.setdefault(pdd.uid, _Tracked(pdd.namespace, pdd.name))
        if now < tracked.next_due or tracked.in_flight is not None:
            return
        tracked.next_due = now + pdd.spec.autoscaling.interval_seconds
        tracked.in_flight = self._executor.submit(self._decide_safely, pdd, body, tracked, now)

    def _forget_all_but(self, seen: set[str]) -> None:
        """Forgets objects deleted or with autoscaling turned Off: their windows start afresh if they
        come back, and /metrics keeps no stale desired sizes for them."""
        for uid in set(self._tracked) - seen:
            gone = self._tracked.pop(uid)
            self.telemetry.forget(gone.namespace, gone.name)

    def _finished(self, wait_s: float | None) -> list[DecisionRecord]:
        """Waits up to `wait_s` (None: until all are done) for the decisions in flight, then collects
        every finished one, freeing its object for its next decision."""
        running = [t.in_flight for t in self._tracked.values() if t.in_flight is not None]
        if running:
            wait_for(running, timeout=wait_s)
        records = []
        for tracked in self._tracked.values():
            if tracked.in_flight is not None and tracked.in_flight.done():
                record, tracked.in_flight = tracked.in_flight.result(), None
                if record is not None:
                    records.append(record)
        return records

    def _decide_safely(
        self, pdd: PDDeployment, body: dict[str, Any], tracked: _Tracked, now: float
    ) -> DecisionRecord | None:
        try:
            return self._decide(pdd, body, tracked, now)
        except Exception:  # one broken object must not stop the others' decisions
            logger.exception("decision for %s/%s failed", pdd.namespace, pdd.name)
            return None

    def _policy(self, pdd: PDDeployment, body: dict[str, Any], tracked: _Tracked, now: float) -> Policy:
        context = policy_context(pdd.spec)
        if tracked.policy is None or tracked.context is None or not _same_setup(tracked.context, context):
            if tracked.context is None or not _same_hardware(tracked.context, context):
                tracked.calibration, tracked.gpu_in_use = OnlineCalibration(), None
            rebuilt = tracked.policy is not None
            tracked.policy = self._build(tracked, context)
            if isinstance(tracked.policy, Resumable):
                self._resume(tracked.policy, tracked, pdd, body, now, rebuilt=rebuilt, fresh=True)
        elif isinstance(tracked.policy, Resumable):
            self._resume(tracked.policy, tracked, pdd, body, now, rebuilt=False, fresh=False)
        return tracked.policy

    def _build(self, tracked: _Tracked, context: PolicyContext) -> Policy:
        """A new policy for `context` (sized with the calibrated GPU the deployment already has)."""
        policy = make_policy(self.settings.policy, context)
        tracked.context = context
        if tracked.gpu_in_use is not None and isinstance(policy, Recalibrable):
            policy.use_gpu(tracked.gpu_in_use)
        return policy

    def _resume(
        self,
        policy: Resumable,
        tracked: _Tracked,
        pdd: PDDeployment,
        body: dict[str, Any],
        now: float,
        *,
        rebuilt: bool,
        fresh: bool,
    ) -> None:
        """Give the policy the state status kept when the last decision there is not its own: a
        PDDeployment decided before this (`fresh`) policy started, or by the leader it takes over from.
        None (lost: hold what is found for a window) when the policy was rebuilt for a new spec, when
        status keeps no state, or when no controller decided for longer than the scale-down window
        (the fleet went unwatched: the kept windows no longer describe it). Nothing on a PDDeployment
        never decided (the policy holds what it finds while its inputs settle) or one whose last
        decision was this policy's. A kept state the policy does not trust counts as lost, and says so
        (`_state_ignored`)."""
        tracked.state_ignored = ""
        if rebuilt:
            policy.resume(None, now)
            return
        recorded = (body.get("status") or {}).get("autoscaler")
        if not isinstance(recorded, dict) or recorded.get("lastDecisionTime") is None:
            return
        ours = (recorded.get("decider") or "") == self.settings.identity
        if ours and not fresh:
            return
        decided = parse_timestamp(str(recorded["lastDecisionTime"]))
        kept = recorded.get(KEY_STATE)
        if decided is not None and now - decided > pdd.spec.autoscaling.scale_down_window_seconds:
            kept = None
        try:
            reason = policy.resume(kept, now)
        except Exception as error:  # a reader's bug: the policy may hold part of the state, so start over
            logger.exception("%s/%s: the policy failed to read its kept state", pdd.namespace, pdd.name)
            reason = f"unreadable: {type(error).__name__}: {str(error)[:200]}"
            tracked.policy = self._build(tracked, policy_context(pdd.spec))
            if isinstance(tracked.policy, Resumable):
                tracked.policy.resume(None, now)
        self._state_ignored(pdd, tracked, reason)

    def _state_ignored(self, pdd: PDDeployment, tracked: _Tracked, reason: str) -> None:
        """A kept state the policy ignored: in this decision's reasons, logged and posted as a Warning
        (once while the same reason repeats, e.g. while this controller defers to another)."""
        tracked.state_ignored = reason
        if not reason:
            tracked.warned_state = ""
            return
        message = (
            f"status.autoscaler.{KEY_STATE} ignored ({reason}): the policy starts as if its state were "
            "lost, holding the sizes it finds for a scale-down window"
        )
        if tracked.warned_state != message:
            logger.warning("%s/%s: %s", pdd.namespace, pdd.name, message)
            self.cluster.post_event(pdd, EVENT_STATE_IGNORED, message, warning=True)
            tracked.warned_state = message

    def _calibrate(self, pdd: PDDeployment, tracked: _Tracked, policy: Policy, window: LiveWindow) -> None:
        """One window's readings into the deployment's calibration; a policy that can re-size with
        efficiencies (Recalibrable) gets the calibrated GPU once the fit is confident."""
        context = tracked.context or policy_context(pdd.spec)
        tracked.calibration = tracked.calibration.observe(
            context.model,
            tracked.gpu_in_use or context.gpu,
            window,
            prefill_gpus=context.prefill_gpus_per_instance,
            decode_gpus=context.decode_gpus_per_instance,
            step_overhead=context.step_overhead_s,
        )
        if not isinstance(policy, Recalibrable):
            return
        gpu = calibrated_gpu(pdd.spec.hardware, tracked.calibration, tracked.gpu_in_use)
        if gpu != (tracked.gpu_in_use or context.gpu):
            logger.info(
                "%s/%s: sizing with calibrated MFU %g, MBU %g", pdd.namespace, pdd.name, gpu.mfu, gpu.mbu
            )
            policy.use_gpu(gpu)
        tracked.gpu_in_use = gpu

    def _decide(
        self, pdd: PDDeployment, body: dict[str, Any], tracked: _Tracked, now: float
    ) -> DecisionRecord | None:
        spec = pdd.spec
        try:
            source = self._prometheus(pdd)
            policy = self._policy(pdd, body, tracked, now)
        except InputError as error:  # a preset, an override or a policy knob the spec got wrong
            message = f"cannot configure policy {self.settings.policy!r}: {error}"
            self._report_problem(pdd, body, tracked, message, now)
            return None
        state_ignored, tracked.state_ignored = tracked.state_ignored, ""
        if self._yields(pdd, body, tracked, now):
            return None
        scope = Scope(pdd.namespace, pdd.name, self.settings.window_s, self.settings.labels)
        router = ROUTER_METRICS.get(spec.router.type)
        raw_answers = source.query_all(build_queries(ENGINES[spec.engine.type].metrics, scope, router))
        discarded = implausible_signals(raw_answers)
        answers = sanitized(raw_answers)
        pods = self.cluster.list_instances(pdd.namespace, pdd.name)
        pools = pool_states(pods, {role: spec.pool(role).gpus_per_instance for role in Role})
        observation = build_observation(
            answers, pools[Role.PREFILL], pools[Role.DECODE], now, self.settings.window_s
        )
        self._calibrate(pdd, tracked, policy, live_window(answers, observation))
        missing = missing_signals(answers)
        bounds = limits(spec)
        note = ""
        if len(missing) == len(POLICY_SIGNALS):
            note = source.last_error or "no engine series matched the PDDeployment's labels"
            decision = Decision(None, None, binding="missing_data", reasons=(HOLD_NO_METRICS,))
            if tracked.problem != note:
                self.cluster.post_event(
                    pdd, EVENT_NO_METRICS, f"holding the pool sizes: {note}", warning=True
                )
        else:
            try:
                decision = policy.decide(observation, bounds)
            except LimitsError as error:  # bounds that contradict each other
                self._report_problem(
                    pdd, body, tracked, f"policy {policy.name!r} refused the spec: {error}", now
                )
                return None
        tracked.problem = note
        if state_ignored:
            decision = dataclasses.replace(decision, reasons=(*decision.reasons, EVENT_STATE_IGNORED))
        decision = _checked(decision, pdd, bounds, discarded)
        if discarded:
            note = "; ".join(
                filter(None, (note, "implausible values treated as missing: " + ", ".join(discarded)))
            )
        stated_gpu = gpu_spec(spec.hardware)
        record = DecisionRecord(
            observation=observation,
            decision=decision,
            desired=_desired(decision, pdd, bounds),
            missing=[str(signal) for signal in missing],
            applied=False,
            mode=str(spec.autoscaling.mode),
            policy=policy.name,
            generation=pdd.generation,
            # a query that failed while others answered; and a field this controller does not honour
            note="; ".join(
                filter(
                    None,
                    (
                        note or source.last_error,
                        self._unsupported(pdd, tracked),
                        self._concurrent(pdd, body, tracked, now),
                    ),
                )
            ),
            decider=self.settings.identity,
            calibration=calibration_report(
                tracked.calibration,
                tracked.gpu_in_use or stated_gpu,
                stated_gpu,
                spec.hardware,
            ),
            policy_state=policy_state(policy, f"{pdd.namespace}/{pdd.name}"),
        )
        record = self._apply(pdd, tracked, record)
        autoscaler = render_autoscaler(record)
        if yielding := self._recent(body, pdd, now, KEY_DEFERRING, "seenTime"):
            autoscaler[KEY_DEFERRING] = yielding  # kept while the other one defers, so it stays visible
        self.cluster.patch_status(pdd.namespace, pdd.name, {"autoscaler": _replacing(body, autoscaler)})
        self.telemetry.record_decision(pdd, record)
        return record

    def _prometheus(self, pdd: PDDeployment) -> MetricsPort:
        """The Prometheus the spec names, once its URL as written and the addresses its host resolves to
        now pass the checks (`control/endpoints.py`); raises SetupError naming the URL, host and rule."""
        prometheus = pdd.spec.autoscaling.prometheus
        if prometheus is None:
            field, rule = "spec.autoscaling.prometheus", "required when mode is Advisory or Auto"
            raise SetupError(field, None, rule, message=f"{field}: {rule}")
        url = prometheus.url
        refused = url_problem(url, self.settings.prometheus_allow)
        if refused is None:
            source = self.metrics(url)
            refused = resolved_problem(url, source.addresses())
            if refused is None:
                return source
        field = "spec.autoscaling.prometheus.url"
        raise SetupError(field, url, refused, message=f"{field}: {refused}")

    def _unsupported(self, pdd: PDDeployment, tracked: _Tracked) -> str:
        """A set field the controller cannot honour yet: said in every status, and once as a Warning."""
        prometheus = pdd.spec.autoscaling.prometheus
        if prometheus is None or prometheus.bearer_token_secret_ref is None:
            tracked.warned_unsupported = False
            return ""
        if not tracked.warned_unsupported:
            self.cluster.post_event(pdd, EVENT_UNSUPPORTED, BEARER_UNSUPPORTED, warning=True)
            tracked.warned_unsupported = True
        return BEARER_UNSUPPORTED

    def _recent(
        self, body: dict[str, Any], pdd: PDDeployment, now: float, key: str | None, time_key: str
    ) -> dict[str, Any] | None:
        """`status.autoscaler` (or its `key` object) when another controller wrote it within three
        intervals; None when this controller wrote it, it is older, or identities are off."""
        recorded = (body.get("status") or {}).get("autoscaler") or {}
        if key is not None:
            recorded = recorded.get(key) if isinstance(recorded, dict) else None
        if not isinstance(recorded, dict) or not self.settings.identity:
            return None
        other = recorded.get("decider")
        if not isinstance(other, str) or not other or other == self.settings.identity:
            return None
        written = parse_timestamp(str(recorded.get(time_key)))
        if written is None or now - written > CONCURRENT_INTERVALS * pdd.spec.autoscaling.interval_seconds:
            return None  # an old record of a controller that has since stopped (or deferred)
        return recorded

    def _warn_concurrent(self, pdd: PDDeployment, tracked: _Tracked, other: str, message: str) -> None:
        if tracked.warned_decider != other:
            self.cluster.post_event(pdd, EVENT_CONCURRENT, message, warning=True)
            tracked.warned_decider = other

    def _yields(self, pdd: PDDeployment, body: dict[str, Any], tracked: _Tracked, now: float) -> bool:
        """Two controllers without a Lease on one object would flap its replicas; the one whose identity
        sorts first keeps deciding and the other defers while the first one's decisions stay recent:
        it writes no replicas and no decision, only `status.autoscaler.deferringDecider`, and one
        Warning."""
        decided = self._recent(body, pdd, now, None, "lastDecisionTime")
        if decided is None or decided["decider"] > self.settings.identity:
            return False
        other = str(decided["decider"])
        message = (
            f"another controller ({other}) decides this PDDeployment too; {self.settings.identity} defers "
            "to it while it does: run one controller, or several with leader election"
        )
        logger.warning("%s/%s: %s", pdd.namespace, pdd.name, message)
        self._warn_concurrent(pdd, tracked, other, message)
        deferring = {"decider": self.settings.identity, "seenTime": timestamp(now), "message": message}
        self.cluster.patch_status(pdd.namespace, pdd.name, {"autoscaler": {KEY_DEFERRING: deferring}})
        tracked.desired = None  # when it takes over, the first change is announced from the spec's sizes
        return True

    def _concurrent(self, pdd: PDDeployment, body: dict[str, Any], tracked: _Tracked, now: float) -> str:
        """Another controller decided this object recently (it had not seen this one yet), or defers to
        this one: said in every status while it lasts, and once per other decider as a Warning."""
        decided = self._recent(body, pdd, now, None, "lastDecisionTime")
        deferring = self._recent(body, pdd, now, KEY_DEFERRING, "seenTime")
        if decided is not None:
            other = str(decided["decider"])
            written = parse_timestamp(str(decided["lastDecisionTime"])) or now
            message = (
                f"another controller ({other}) decided this PDDeployment {now - written:.0f}s ago: "
                "run one controller, or several with leader election"
            )
        elif deferring is not None:
            other = str(deferring["decider"])
            message = (
                f"another controller ({other}) runs without a Lease and defers to this one: "
                "run one controller, or several with leader election"
            )
        else:
            return ""
        self._warn_concurrent(pdd, tracked, other, message)
        return message

    def _apply(self, pdd: PDDeployment, tracked: _Tracked, record: DecisionRecord) -> DecisionRecord:
        """Write replicas (Auto, when changed) and post an Event when the desired sizes change."""
        spec = pdd.spec
        current = (spec.prefill.replicas, spec.decode.replicas)
        desired = record.desired
        applied = spec.autoscaling.mode is AutoscalingMode.AUTO and desired != current
        if applied:
            self.cluster.patch_replicas(pdd.namespace, pdd.name, *desired)
        before = tracked.desired or current
        if desired != before:
            decision = record.decision
            verb = "setting" if spec.autoscaling.mode is AutoscalingMode.AUTO else "advising"
            message = (
                f"{verb} prefill {before[0]}→{desired[0]}, decode {before[1]}→{desired[1]}; "
                f"binding {decision.binding or 'none'}; reasons: {', '.join(decision.reasons) or 'none'}"
            )
            self.cluster.post_event(pdd, EVENT_SCALE, message)
        tracked.desired = desired
        return dataclasses.replace(record, applied=applied)

    def _report_problem(
        self, pdd: PDDeployment, body: dict[str, Any], tracked: _Tracked, message: str, now: float
    ) -> None:
        """A spec the policy cannot work with: say so in status and (once) in a Warning Event."""
        logger.warning("%s/%s: %s", pdd.namespace, pdd.name, message)
        status = {
            "observedGeneration": pdd.generation,
            "lastDecisionTime": timestamp(now),
            "mode": str(pdd.spec.autoscaling.mode),
            "binding": BINDING_INVALID_SETUP,
            "message": message,
        }
        self.cluster.patch_status(pdd.namespace, pdd.name, {"autoscaler": _replacing(body, status)})
        if tracked.problem != message:
            self.cluster.post_event(pdd, EVENT_INVALID, message, warning=True)
            tracked.problem = message
        tracked.policy = tracked.context = None


def _checked(decision: Decision, pdd: PDDeployment, bounds: Limits, discarded: list[Signal]) -> Decision:
    """The decision, or a hold where it is not usable: a size that is not a whole number within
    [0, maxReplicas·2] is no answer; with inputs discarded, a size below the current one is held."""
    spec = pdd.spec
    sizes = []
    reasons = list(decision.reasons)
    for role, answer, high in (
        (Role.PREFILL, decision.prefill, bounds.prefill_max),
        (Role.DECODE, decision.decode, bounds.decode_max),
    ):
        size = answer
        if size is not None and not whole(size, 0, 2 * max(high, 1)):
            logger.warning("%s/%s: policy answered %s=%r; holding", pdd.namespace, pdd.name, role, size)
            reasons.append(HOLD_BAD_ANSWER)
            size = None
        if size is not None and discarded and size < spec.pool(role).replicas:
            reasons.append(HOLD_IMPLAUSIBLE)
            size = None
        sizes.append(size)
    details = {k: v for k, v in decision.details.items() if isinstance(v, int | float) and math.isfinite(v)}
    return dataclasses.replace(
        decision,
        prefill=sizes[0],
        decode=sizes[1],
        reasons=tuple(dict.fromkeys(reasons)),
        details=details,
    )


def _desired(decision: Decision, pdd: PDDeployment, bounds: Limits) -> tuple[int, int]:
    """The decision's sizes clamped to the spec's bounds; the spec's replicas where it has no opinion."""
    spec = pdd.spec
    prefill = spec.prefill.replicas if decision.prefill is None else decision.prefill
    decode = spec.decode.replicas if decision.decode is None else decision.decode
    return (
        _clamp(prefill, bounds.prefill_min, bounds.prefill_max),
        _clamp(decode, bounds.decode_min, bounds.decode_max),
    )


def _replacing(body: dict[str, Any], autoscaler: dict[str, Any]) -> dict[str, Any]:
    """Merge patch for `status.autoscaler` that replaces the previous one whole."""
    current = (body.get("status") or {}).get("autoscaler")
    return replacing_patch(current if isinstance(current, dict) else None, autoscaler)
