"""`status.autoscaler`, rendered from one decision (pure), and the merge patch that replaces it whole.

Every field is written on every decision, null when unknown (which a merge patch turns into "absent"), so
no stale number of an older decision survives; `missingData` names the inputs that had no data.
`policyState` keeps the policy's whole state (`Resumable.state`), so that a restarted controller, or
one taking over from another, continues exactly where the last decision left off (`policy_state`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeGuard

from xpyd_api.models import HardwareSpec
from xpyd_controller.model.calibration import Fitted, OnlineCalibration
from xpyd_controller.model.specs import GpuSpec
from xpyd_controller.policy.types import Decision, Observation, PoolState, Resumable

logger = logging.getLogger(__name__)

KEY_STATE = "policyState"
MAX_STATE_BYTES = 64 * 1024  # a policy state's JSON above this is not kept (status objects must stay small)


@dataclass(frozen=True)
class DecisionRecord:
    """One decision for one PDDeployment, with what it was based on."""

    observation: Observation
    decision: Decision
    desired: tuple[int, int]  # (prefill, decode)
    missing: Sequence[str]  # signals without data
    applied: bool  # replicas were written (mode Auto and the desired sizes differ from the spec)
    mode: str
    policy: str
    generation: int
    note: str = ""  # why data was missing (Prometheus unreachable, a query rejected), if known
    decider: str = ""  # identity of the controller that decided (another one's means two are deciding)
    calibration: Mapping[str, Any] | None = None  # status.autoscaler.calibration (calibration_report)
    policy_state: Mapping[str, Any] | None = None  # the policy's whole state after this decision (JSON)


def timestamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str) -> float | None:
    """Epoch seconds of a `timestamp()` string; None if it is not one."""
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except (TypeError, ValueError):
        return None


def _pool(pool: PoolState) -> dict[str, int]:
    return {"ready": pool.ready, "starting": pool.starting, "draining": pool.draining}


def _number(value: float | None) -> float | None:
    """A finite number rounded for status, else None: a NaN or ±Inf must never reach a patch
    (the API server refuses the whole patch, and the status goes stale)."""
    if value is None or not math.isfinite(value):
        return None
    return round(value, 6)


def _efficiency(fit: Fitted, in_use: float, preset: float, given: float | None) -> dict[str, Any]:
    source = "spec" if given is not None else "calibrated" if in_use != preset else "preset"
    return {
        "inUse": _number(in_use),
        "source": source,
        "fitted": _number(fit.value),
        "samples": fit.samples,
        "spread": _number(fit.spread),
        "confident": fit.confident,
    }


def calibration_report(
    calibration: OnlineCalibration, in_use: GpuSpec, preset: GpuSpec, hardware: HardwareSpec
) -> dict[str, Any]:
    """`status.autoscaler.calibration`: per efficiency, the value the sizing uses and where it comes from
    (the spec, the online fit, or the preset), and the fit itself (median, readings, spread)."""
    return {
        "mfu": _efficiency(calibration.mfu, in_use.mfu, preset.mfu, hardware.mfu),
        "mbu": _efficiency(calibration.mbu, in_use.mbu, preset.mbu, hardware.mbu),
    }


def render_autoscaler(record: DecisionRecord) -> dict[str, Any]:
    """The `status.autoscaler` object (camelCase, numbers in SI units, times in RFC 3339)."""
    obs, decision = record.observation, record.decision
    details = decision.details
    return {
        "observedGeneration": record.generation,
        "lastDecisionTime": timestamp(obs.time_s),
        "mode": record.mode,
        "policy": record.policy,
        "decider": record.decider or None,
        "desired": {"prefill": record.desired[0], "decode": record.desired[1]},
        "applied": record.applied,
        "binding": decision.binding or None,
        "reasons": list(decision.reasons),
        "message": record.note or None,
        "missingData": list(record.missing),
        "predicted": {
            "ttftSeconds": _number(details.get("predicted_ttft_seconds")),
            "tpotSeconds": _number(details.get("predicted_tpot_seconds")),
        },
        "inputs": {
            "windowSeconds": obs.window_s,
            "arrivalRate": _number(obs.arrival_rate),
            "meanInputTokens": _number(obs.mean_input_tokens),
            "meanOutputTokens": _number(obs.mean_output_tokens),
            "p90InputTokens": _number(obs.p90_input_tokens),
            "p90OutputTokens": _number(obs.p90_output_tokens),
            "prefixHitRate": _number(obs.prefix_hit_rate),
            "prefillQueue": _number(obs.prefill_queue),
            "decodeRunning": _number(obs.decode_running),
            "decodeWaiting": _number(obs.decode_waiting),
            "decodeKvUsage": _number(obs.decode_kv_usage),
            "ttftP90Seconds": _number(obs.ttft_p90_s),
            "tpotP90Seconds": _number(obs.tpot_p90_s),
            "tpotMeanSeconds": _number(obs.tpot_mean_s),
            "prefill": _pool(obs.prefill),
            "decode": _pool(obs.decode),
        },
        "details": {key: _number(value) for key, value in sorted(details.items())},
        "calibration": dict(record.calibration) if record.calibration is not None else None,
        KEY_STATE: dict(record.policy_state) if record.policy_state is not None else None,
    }


def whole(value: object, low: int, high: int) -> TypeGuard[int]:
    """A whole number (not a bool) within [low, high]: what a count read back from anywhere must be."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def policy_state(policy: object, where: str = "") -> dict[str, Any] | None:
    """What status keeps of `policy`'s state: a JSON copy of `Resumable.state`, or None for a policy
    without one, and (logged, never blocking the decision) for a state that fails to serialise as
    finite JSON or whose JSON exceeds MAX_STATE_BYTES."""
    if not isinstance(policy, Resumable):
        return None
    try:
        text = json.dumps(policy.state(), allow_nan=False, separators=(",", ":"))
    except Exception:  # a policy's bug must not cost the decision: the state is just not kept
        logger.exception("%s: the policy's state is not JSON; not kept in status", where or "policy")
        return None
    if len(text.encode()) > MAX_STATE_BYTES:
        logger.warning(
            "%s: the policy's state is %d bytes of JSON, above %d; not kept in status (a restart "
            "holds the fleet it finds for a window)",
            where or "policy",
            len(text.encode()),
            MAX_STATE_BYTES,
        )
        return None
    kept = json.loads(text)
    if not isinstance(kept, dict):
        logger.warning("%s: the policy's state is no JSON object; not kept in status", where or "policy")
        return None
    return kept


def replacing_patch(current: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch that turns `current` into exactly `new` (keys only in `current` become null)."""
    patch: dict[str, Any] = {}
    for key, old in (current or {}).items():
        if key not in new:
            patch[key] = None
        elif isinstance(old, Mapping) and isinstance(new[key], Mapping):
            patch[key] = replacing_patch(old, new[key])
    for key, value in new.items():
        if key not in patch:
            patch[key] = value
    return patch
