"""Policies by name for simulated runs: the live registry's plug-ins plus the hindsight oracles."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from xpyd_controller.policy.context import PolicyConfigError, PolicyContext
from xpyd_controller.policy.registry import POLICIES, make_policy
from xpyd_controller.policy.types import Policy
from xpyd_controller.sim.config import SimConfig
from xpyd_controller.sim.oracles import ORACLES, make_oracle
from xpyd_controller.sim.traces import Trace


def policy_names() -> tuple[str, ...]:
    """Every policy a simulation can run: registered plug-ins, then the oracles."""
    return (*sorted(POLICIES), *ORACLES)


def policy_context(config: SimConfig) -> PolicyContext:
    """What a policy factory is told about the simulated deployment.

    The simulator admits a request to decode after its prefill and KV transfer: prefill-first.
    """
    hw, slo = config.hardware, config.slo
    per_token = slo.tpot_s if slo.tpot_s is not None else slo.max_token_gap_s
    return PolicyContext(
        model=hw.model,
        gpu=hw.gpu,
        link=hw.link,
        ttft_slo_s=slo.ttft_s,
        tpot_slo_s=per_token if per_token is not None else 0.1,
        prefill_gpus_per_instance=hw.gpus_per_instance,
        decode_gpus_per_instance=hw.gpus_per_instance,
        scrape_interval_s=config.control.scrape_interval_s,
        initial_prefill=config.fleet.prefill,
        initial_decode=config.fleet.decode,
        step_overhead_s=hw.step_overhead_s,
        request_flow="prefill_first",
    )


def build_policy(
    name: str, config: SimConfig, trace: Trace, knobs: Mapping[str, float] | None = None
) -> Policy:
    """A fresh policy by name (whether it may convert roles, each decision says).

    `knobs` override the policy's config defaults, validated as `PolicyContext.knobs` always are.
    """
    if name in ORACLES:
        if knobs:
            knob = next(iter(knobs))
            raise PolicyConfigError(name, knob, knobs[knob], "the hindsight oracles take no knobs")
        return make_oracle(name, trace, config)
    return make_policy(name, dataclasses.replace(policy_context(config), knobs=dict(knobs or {})))
