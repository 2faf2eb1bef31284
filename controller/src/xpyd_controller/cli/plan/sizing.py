"""Size the plan's scenarios: a sweep's valid points in one vectorised call, its invalid ones in words."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from xpyd_controller.cli.plan.arguments import PlanInputError, PlanInputs, build_inputs, spec_error_words
from xpyd_controller.model.explain import format_bytes, format_seconds
from xpyd_controller.model.sizing import Plan, size_pools
from xpyd_controller.model.specs import SpecError

if TYPE_CHECKING:
    from xpyd_controller.model.roofline import FloatArray


def physical_floor_errors(plan: Plan, inputs: PlanInputs) -> dict[int, str]:
    """SLOs no amount of GPUs can meet, by flat scenario index: the flag, the value and the floor."""
    errors: dict[int, str] = {}

    def flag(mask: npt.NDArray[np.bool_], message: Callable[[int], str]) -> None:
        for index in np.flatnonzero(np.broadcast_to(mask, np.shape(plan.prefill_instances))):
            errors.setdefault(int(index), message(int(index)))

    def flat(array: object, index: int) -> float:
        return float(np.ravel(np.broadcast_to(np.asarray(array), np.shape(plan.prefill_instances)))[index])

    decode_fits = np.asarray(plan.decode_weights_fit)
    flag(
        decode_fits & (plan.tpot_slo_seconds <= plan.tpot_floor_seconds),
        lambda i: (
            f"--tpot-slo {flat(plan.tpot_slo_seconds, i):g}: below the physical floor "
            f"{format_seconds(flat(plan.tpot_floor_seconds, i))} per decode step (step overhead + weight read W/β of "
            f"{format_bytes(inputs.model.weight_footprint_bytes)} at {format_bytes(inputs.gpu.effective_bandwidth)}/s per GPU)"
        ),
    )
    ttft_floor = plan.prefill_seconds + plan.exposed_transfer_seconds + plan.tpot_floor_seconds
    flag(
        np.asarray(plan.prefill_weights_fit) & (plan.ttft_slo_seconds <= ttft_floor),
        lambda i: (
            f"--ttft-slo {flat(plan.ttft_slo_seconds, i):g}: below the physical floor "
            f"{format_seconds(flat(ttft_floor, i))} (prefill of the mean prompt + exposed "
            "KV transfer + one decode step, before any queueing)"
        ),
    )
    flag(
        plan.transfer_budget_seconds <= inputs.link.overhead,
        lambda i: (
            f"--transfer-budget {flat(plan.transfer_budget_seconds, i):g}: at or below the "
            f"link's fixed overhead {format_seconds(inputs.link.overhead)}, so no transfer fits"
        ),
    )
    return errors


def _floor_error(message: str) -> PlanInputError:
    """A physical_floor_errors() message ("--flag value: rule") as the error carrying its three parts."""
    head, _, rule = message.partition(": ")
    flag, _, value = head.partition(" ")
    return PlanInputError(flag, value, rule, message=message)


def check_physical_floors(plan: Plan, inputs: PlanInputs) -> None:
    """An SLO no amount of GPUs can meet is an input error (a single plan stops there)."""
    errors = physical_floor_errors(plan, inputs)
    if errors:
        raise _floor_error(errors[min(errors)])


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """A sweep's plan over its valid points, and why each other point is invalid."""

    name: str  # argparse dest of the swept quantity
    values: FloatArray  # every swept value, in order
    plan: Plan  # over the valid values only
    inputs: PlanInputs
    plan_index: dict[int, int]  # swept position → index into `plan`
    invalid: dict[int, str]  # swept position → the input error, in words

    @property
    def flag(self) -> str:
        return self.name.replace("_", "-")


MAX_CHECKED_ONE_BY_ONE = 100_000  # points validated one at a time when the whole sweep is rejected


def _input_error_words(error: SpecError | PlanInputError) -> str:
    return spec_error_words(error) if isinstance(error, SpecError) else str(error)


def run_sweep(args: argparse.Namespace, name: str, values: FloatArray) -> SweepResult:
    """Size every swept point; a point the specs or the physical floors reject becomes a marked row.

    Raises the error when no point is valid (or the rejection is not about the swept value).
    """
    invalid: dict[int, str] = {}
    try:
        inputs = build_inputs(args, {name: values})
        valid = np.arange(values.size)
    except (SpecError, PlanInputError) as whole:
        if values.size > MAX_CHECKED_ONE_BY_ONE:
            raise
        for i in range(values.size):
            try:
                build_inputs(args, {name: values[i : i + 1]})
            except (SpecError, PlanInputError) as error:
                invalid[i] = _input_error_words(error)
        valid = np.array([i for i in range(values.size) if i not in invalid], dtype=np.int64)
        if valid.size == 0:
            raise whole from None
        inputs = build_inputs(args, {name: values[valid]})
    plan = size_pools(inputs.model, inputs.gpu, inputs.link, inputs.workload, inputs.slo, pools=inputs.pools)
    for j, message in physical_floor_errors(plan, inputs).items():
        invalid[int(valid[j])] = message
    if len(invalid) == values.size:
        raise _floor_error(invalid[0])
    return SweepResult(name, values, plan, inputs, {int(i): j for j, i in enumerate(valid)}, invalid)
