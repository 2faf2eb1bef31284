"""The seed article's setup (8B-class fp16 on H100-class GPUs, 400G RDMA) and its random draws.

The article draws, from one `random.Random(seed)`, every inter-arrival time first (`expovariate`),
then one `randint` prompt and one `randint` output per request; the first arrival is at t=0 and the
last inter-arrival draw is unused. Drawing the same way makes the comparison with its table
draw for draw.
"""

from __future__ import annotations

import random

from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec
from xpyd_controller.sim.config import GoodputSlo, Hardware
from xpyd_controller.sim.traces import Trace

SEED_MODEL = ModelSpec(params=8e9, layers=32, kv_heads=8, head_dim=128)  # no hidden size: no attention term
SEED_GPU = GpuSpec(peak_flops=990e12, hbm_bandwidth=3.35e12, hbm_bytes=80e9, mfu=0.4)
SEED_LINK = LinkSpec(bandwidth=50e9, overhead=2e-3)
SEED_HARDWARE = Hardware(SEED_MODEL, SEED_GPU, SEED_LINK, step_overhead_s=5e-3, prefill_chunks=4)
SEED_SLO = GoodputSlo(ttft_s=0.600, tpot_s=None, max_token_gap_s=0.100)
SEED_GPUS = 8
SEED_ARRIVALS = 6000
SEED_PROMPT_RANGE = (500, 8000)
SEED_OUTPUT_RANGE = (80, 480)


def seed_requests(
    rate: float,
    count: int = SEED_ARRIVALS,
    seed: int = 7,
    prompt_range: tuple[int, int] = SEED_PROMPT_RANGE,
    output_range: tuple[int, int] = SEED_OUTPUT_RANGE,
) -> Trace:
    """Poisson arrivals and uniform lengths, drawn in the article's order from `random.Random(seed)`."""
    rng = random.Random(seed)
    arrivals = [0.0] * count
    t = 0.0
    for i in range(count):
        arrivals[i] = t
        t += rng.expovariate(rate)
    lengths = [(rng.randint(*prompt_range), rng.randint(*output_range)) for _ in range(count)]
    return Trace(  # Python lists: the trace (and a seed-table run) needs no numpy
        arrival_s=arrivals,
        prompt_tokens=[p for p, _ in lengths],
        output_tokens=[o for _, o in lengths],
        prefix_hit_tokens=[0] * count,
        name=f"seed-{rate:g}",
    )
