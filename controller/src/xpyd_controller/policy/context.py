"""What a policy factory is given: the deployment's model, hardware, SLOs and policy-specific knobs.

The simulator, the CLI and the live controller build one `PolicyContext` and ask the registry for a
policy by name, so every policy is configured the same way wherever it runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from xpyd_api.errors import InputError
from xpyd_controller.model.sizing import REQUEST_FLOWS, RequestFlow
from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec


class PolicyConfigError(InputError):
    """A rejected policy setting; names the policy, the field, its value and the rule."""

    def __init__(self, policy: str, field: str, value: object, rule: str) -> None:
        super().__init__(field, value, rule, message=f"policy {policy!r}: {field} = {value!r}: {rule}")
        self.policy = policy


@dataclass(frozen=True)
class PolicyContext:
    """Everything a factory may use. `knobs` overrides the chosen policy's config defaults by name.

    `request_flow` is how the deployment's router hands a request over (`PoolConfig.request_flow`):
    the simulator and vLLM's router are prefill-first; the default is the seeds' decode-first.
    """

    model: ModelSpec
    gpu: GpuSpec
    link: LinkSpec
    ttft_slo_s: float
    tpot_slo_s: float
    prefill_gpus_per_instance: int = 1
    decode_gpus_per_instance: int = 1
    scrape_interval_s: float = 15.0
    initial_prefill: int = 1  # the split the fleet starts with (what `static` keeps)
    initial_decode: int = 1
    step_overhead_s: float = 0.0
    request_flow: RequestFlow = "decode_first"
    knobs: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("ttft_slo_s", "tpot_slo_s", "scrape_interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise PolicyConfigError("*", name, value, "must be a finite number > 0")
        for name in ("prefill_gpus_per_instance", "decode_gpus_per_instance"):
            if getattr(self, name) < 1:
                raise PolicyConfigError("*", name, getattr(self, name), "must be an integer >= 1")
        for name in ("initial_prefill", "initial_decode"):
            if getattr(self, name) < 0:
                raise PolicyConfigError("*", name, getattr(self, name), "must be an integer >= 0")
        if self.request_flow not in REQUEST_FLOWS:
            raise PolicyConfigError(
                "*", "request_flow", self.request_flow, f"must be one of {', '.join(REQUEST_FLOWS)}"
            )
        if not (math.isfinite(self.step_overhead_s) and self.step_overhead_s >= 0):
            raise PolicyConfigError(
                "*", "step_overhead_s", self.step_overhead_s, "must be a finite number >= 0"
            )


@runtime_checkable
class Recalibrable(Protocol):
    """A policy that sizes with new efficiencies without losing its windows (the controller's online
    calibration hands it a GPU with the fitted MFU/MBU)."""

    def use_gpu(self, gpu: GpuSpec) -> None: ...


ConfigT = TypeVar("ConfigT")


def configure(policy: str, defaults: ConfigT, knobs: Mapping[str, float]) -> ConfigT:
    """`defaults` with `knobs` applied; unknown names and non-numbers are rejected, naming the policy.

    The config dataclass validates values in its own `__post_init__` (raising PolicyConfigError).
    """
    known = {f.name: f for f in dataclasses.fields(defaults)}  # type: ignore[arg-type]
    changes: dict[str, Any] = {}
    for name, value in knobs.items():
        if name not in known:
            raise PolicyConfigError(policy, name, value, f"unknown knob; known: {', '.join(sorted(known))}")
        current = getattr(defaults, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PolicyConfigError(policy, name, value, "must be a number")
        changes[name] = type(current)(value) if isinstance(current, int | float) else value
        if isinstance(current, int) and changes[name] != value:
            raise PolicyConfigError(policy, name, value, "must be a whole number")
    return dataclasses.replace(defaults, **changes)  # type: ignore[type-var]
