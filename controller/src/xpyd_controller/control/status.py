"""`status.autoscaler`, rendered from one decision (pure), and the merge patch that replaces it whole.

Every field is written on every decision, null when unknown (which a merge patch turns into "absent"), so
no stale number of an older decision survives; `missingData` names the inputs that had no data.
`recentRecommendations` keeps the policy's stabilisation window, so that a restarted controller
continues it instead of holding the fleet it finds for a whole window (`kept_recommendations`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeGuard

from xpyd_api.models import HardwareSpec
from xpyd_controller.model.calibration import Fitted, OnlineCalibration
from xpyd_controller.model.specs import GpuSpec
from xpyd_controller.policy.types import Decision, Observation, PoolState, Recommended

KEY_RECENT = "recentRecommendations"
MAX_RECENT = 1000  # more entries than any window at the shortest interval holds: not ours, ignored
FUTURE_SLACK_S = 60.0  # clock skew between controllers a kept time may show
MAX_COUNT = 1_000_000  # a kept recommendation above this is no count of ours


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
    recent: Sequence[Recommended] = ()  # the policy's stabilisation window after this decision


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
        KEY_RECENT: [
            {"time": timestamp(r.time_s), "prefill": r.prefill, "decode": r.decode} for r in record.recent
        ],
    }


def whole(value: object, low: int, high: int) -> TypeGuard[int]:
    """A whole number (not a bool) within [low, high]: what a count read back from anywhere must be."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def kept_recommendations(autoscaler: object, now: float, window_s: float) -> list[Recommended] | None:
    """The stabilisation window a controller kept in `status.autoscaler`: its recommendations of the last
    `window_s`, oldest first. None when the window is lost: nothing kept, all of it older, or anything
    malformed (a time that is no timestamp or lies ahead, a count that is no whole number) — status is
    only evidence, and the caller then holds the fleet it finds for a window rather than trust it."""
    entries = autoscaler.get(KEY_RECENT) if isinstance(autoscaler, Mapping) else None
    if not isinstance(entries, list) or len(entries) > MAX_RECENT:
        return None
    kept = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            return None
        time_s = parse_timestamp(str(entry.get("time")))
        prefill, decode = entry.get("prefill"), entry.get("decode")
        if time_s is None or time_s > now + FUTURE_SLACK_S:
            return None
        if not (whole(prefill, 0, MAX_COUNT) and whole(decode, 0, MAX_COUNT)):
            return None
        if time_s >= now - window_s:
            kept.append(Recommended(time_s, prefill, decode))
    return sorted(kept, key=lambda r: r.time_s) or None


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
