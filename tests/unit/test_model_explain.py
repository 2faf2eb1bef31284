"""The words a plan is explained with: one case per binding constraint, infeasibility and note."""

from __future__ import annotations

import pytest

from xpyd_controller.model.explain import explain, format_bytes, format_seconds
from xpyd_controller.model.presets import DATASHEET_GPUS, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.sizing import PoolConfig, Slo, Workload, size_pools
from xpyd_controller.model.specs import LinkSpec

LLAMA_8B = MODEL_PRESETS["llama-3.1-8b"]
LLAMA_70B = MODEL_PRESETS["llama-3.1-70b"]
H100 = DATASHEET_GPUS["h100-sxm"]  # at the seeds' MFU 0.4 and MBU 1, which the hand numbers below use
IB = LINK_PRESETS["ib-400g"]


def words(**case: object) -> str:
    plan = size_pools(
        case.get("model", LLAMA_8B),  # type: ignore[arg-type]
        H100,
        case.get("link", IB),  # type: ignore[arg-type]
        Workload(rate=case.get("rate", 2.0), isl=case.get("isl", 4096), osl=256),  # type: ignore[arg-type]
        Slo(
            ttft=case.get("ttft", 2.0),  # type: ignore[arg-type]
            tpot=case.get("tpot", 0.05),  # type: ignore[arg-type]
            transfer_budget=case.get("budget"),  # type: ignore[arg-type]
            ttft_quantile=case.get("quantile"),  # type: ignore[arg-type]
            context_quantile=case.get("context"),  # type: ignore[arg-type]
        ),
        pools=case.get("pools", PoolConfig()),  # type: ignore[arg-type]
    )
    explanation = explain(plan, link_name="the-link")
    return "\n".join([*explanation.binding, *explanation.infeasible, *explanation.notes])


@pytest.mark.parametrize(
    ("case", "phrase"),
    [
        ({}, "prefill: 1 instance sized by throughput"),
        ({}, "bound by KV capacity"),
        (
            {"rate": 8.0, "ttft": 0.6, "quantile": 0.99},
            "to meet the TTFT quantile with queueing (throughput alone needs 2",
        ),
        ({"tpot": 0.012, "isl": 512}, "bound by TPOT bandwidth"),
        ({"rate": 10.0, "isl": 6000, "ttft": 0.6, "tpot": 0.03, "context": 0.99}, "Poisson swings"),
        (
            {
                "model": LLAMA_70B,
                "isl": 131072,
                "ttft": 400,
                "budget": 0.2,
                "pools": PoolConfig(8, 8, layerwise_transfer=False),
            },
            "KV transfer of 42.9 GB takes 859 ms on the-link (serialized: layer-wise pipelining off): 659 ms "
            "over the 200 ms budget; needs NVLink or KV compression",
        ),
        (
            {"model": LLAMA_70B, "isl": 131072, "ttft": 400, "budget": 0.2, "pools": PoolConfig(8, 8)},
            "it fits only because it overlaps the prefill",
        ),
        (
            {"link": LinkSpec(bandwidth=1e9), "isl": 8192, "ttft": 30, "budget": 0.1},
            "and leaves 665 ms exposed even pipelined layer by layer: 565 ms over the 100 ms budget",
        ),
        ({"model": LLAMA_70B}, "needs 2 or more GPUs per prefill instance"),
        (
            {"model": LLAMA_70B, "isl": 131072, "pools": PoolConfig(2, 2), "ttft": 400},
            "does not fit in the HBM",
        ),
        (
            {"tpot": 0.004},
            "leaves no batch: one step already takes 4.79 ms (step overhead + weight read W/\u03b2), 794 \u00b5s over it",
        ),
        ({"ttft": 0.15}, "TTFT floor"),
        ({"ttft": 0.15}, "over the 150 ms SLO: no pool size meets it"),
        ({"rate": 9.5, "ttft": 0.5}, "with queueing is over the 500 ms SLO"),
        (
            {"link": LinkSpec(bandwidth=1e9), "rate": 40.0, "isl": 8192, "ttft": 30},
            "carrying it takes the links of",
        ),
        ({"link": LinkSpec(bandwidth=1e9), "rate": 40.0, "isl": 8192, "ttft": 30}, "latency can be hidden"),
        ({"link": LinkSpec(bandwidth=1e9), "isl": 8192, "ttft": 30}, "layer-wise overlap fails on the-link"),
        ({}, "layer-wise overlap holds"),
        ({"link": LinkSpec(bandwidth=1e6), "ttft": 3000}, "remote prefill never beats local prefill"),
        ({}, "remote prefill wins at every prompt length"),
        ({"pools": PoolConfig(remote_overhead=0.02)}, "tokens are faster prefilled locally (L_thresh)"),
    ],
)
def test_explanation_names_the_constraint(case: dict[str, object], phrase: str) -> None:
    assert phrase in words(**case)


def test_feasible_plan_has_no_infeasibilities() -> None:
    plan = size_pools(LLAMA_8B, H100, IB, Workload(rate=2, isl=4096, osl=256), Slo(ttft=2, tpot=0.05))
    assert explain(plan).infeasible == ()


@pytest.mark.parametrize(
    ("value", "text"),
    [(43e9, "43 GB"), (2.62e9, "2.62 GB"), (131072, "131 KB"), (512, "512 B"), (1.2e12, "1.2 TB")],
)
def test_format_bytes(value: float, text: str) -> None:
    assert format_bytes(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.86, "860 ms"), (2.0, "2 s"), (0.000336, "336 µs"), (0.0, "0 s"), (float("inf"), "unbounded")],
)
def test_format_seconds(value: float, text: str) -> None:
    assert format_seconds(value) == text
