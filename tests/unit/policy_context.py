"""The deployment every policy test decides for."""

from __future__ import annotations

from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec
from xpyd_controller.policy.context import PolicyContext

# The seed article's deployment (8B fp16, H100-class, IB link, 5 ms step overhead), shared by the
# policy tests.
CONTEXT = PolicyContext(
    model=ModelSpec(params=8e9, layers=32, kv_heads=8, head_dim=128),
    gpu=GpuSpec(peak_flops=990e12, hbm_bandwidth=3.35e12, hbm_bytes=80e9),
    link=LinkSpec(bandwidth=50e9, overhead=2e-3),
    ttft_slo_s=0.6,
    tpot_slo_s=0.1,
    step_overhead_s=5e-3,
    initial_prefill=6,
    initial_decode=2,
)
