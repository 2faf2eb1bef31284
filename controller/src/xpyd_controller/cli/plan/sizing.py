"""Size the plan's scenarios: a sweep's valid points in one vectorised call, its invalid ones in words.

An SLO no pool size can meet (a TTFT floor over the SLO, a TPOT under the weight-read floor) is not an
invalid input: the point is sized and reported infeasible with the gap, as every other constraint is.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from xpyd_controller.cli.plan.arguments import PlanInputError, PlanInputs, build_inputs, spec_error_words
from xpyd_controller.model.sizing import Plan, size_pools
from xpyd_controller.model.specs import SpecError

if TYPE_CHECKING:
    from xpyd_controller.model.roofline import FloatArray


def size(inputs: PlanInputs) -> Plan:
    """The capacity model's plan for the parsed flags (every scenario of a swept quantity at once)."""
    return size_pools(inputs.model, inputs.gpu, inputs.link, inputs.workload, inputs.slo, pools=inputs.pools)


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
    """Size every swept point; a point the specs reject becomes a row marked invalid.

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
    plan_index = {int(i): j for j, i in enumerate(valid)}
    return SweepResult(name, values, size(inputs), inputs, plan_index, invalid)
