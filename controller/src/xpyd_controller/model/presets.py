"""Named models, GPUs and links that `xpyd plan` flags fill in (explicit flags override them).

Sources:
- Models: each one's `config.json` on its Hugging Face model card (num_hidden_layers,
  num_key_value_heads, head_dim or hidden_size/num_attention_heads, hidden_size; DeepSeek-V3's
  kv_lora_rank = 512 and qk_rope_head_dim = 64) and the parameter count stated on the card.
- GPUs: NVIDIA datasheets, dense (no sparsity) BF16 tensor-core peak, HBM bandwidth and capacity of
  the SXM parts. The seed article rounds the H100's 989 TFLOP/s to 990.
- Links: the seeds' payload bandwidths (NVLink 4 900 GB/s within a node, 400 Gb/s InfiniBand/RoCE
  ≈ 50 GB/s per GPU, PCIe 5.0 x16 64 GB/s). Setup overheads are 0 here, as in the seeds' transfer
  tables; pass `--link-overhead` to model one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec

MODEL_PRESETS: dict[str, ModelSpec] = {
    # meta-llama/Llama-3.1-8B: 8.03B params, 32 layers, 8 KV heads × 128, d_model 4096, bf16.
    "llama-3.1-8b": ModelSpec(params=8.03e9, layers=32, kv_heads=8, head_dim=128, hidden_size=4096),
    # meta-llama/Llama-3.1-70B: 70.6B params, 80 layers, 8 KV heads × 128, d_model 8192, bf16.
    "llama-3.1-70b": ModelSpec(params=70.6e9, layers=80, kv_heads=8, head_dim=128, hidden_size=8192),
    # meta-llama/Llama-3.1-405B: 405.9B params, 126 layers, 8 KV heads × 128, d_model 16384, bf16.
    "llama-3.1-405b": ModelSpec(params=405.9e9, layers=126, kv_heads=8, head_dim=128, hidden_size=16384),
    # deepseek-ai/DeepSeek-V3: 671B total / 37B active (MoE), 61 layers, d_model 7168, MLA with a
    # 512-dim KV latent + 64-dim RoPE key per layer; FP8 weights as released, bf16 KV cache.
    "deepseek-v3": ModelSpec(
        params=671e9,
        active_params=37e9,
        layers=61,
        kv_heads=128,
        head_dim=128,
        hidden_size=7168,
        kv_latent_dim=512,
        rope_dim=64,
        weight_bytes=1.0,
        kv_bytes=2.0,
    ),
    # Qwen/Qwen3-32B: 32.8B params, 64 layers, 8 KV heads × 128, d_model 5120, bf16.
    "qwen3-32b": ModelSpec(params=32.8e9, layers=64, kv_heads=8, head_dim=128, hidden_size=5120),
    # Qwen/Qwen2.5-72B: 72.7B params, 80 layers, 8 KV heads × 128, d_model 8192, bf16.
    "qwen2.5-72b": ModelSpec(params=72.7e9, layers=80, kv_heads=8, head_dim=128, hidden_size=8192),
}

DATASHEET_GPUS: dict[str, GpuSpec] = {
    # A100 SXM 80GB: 312 TFLOP/s dense bf16, 2.039 TB/s HBM2e, 80 GB.
    "a100-80g": GpuSpec(peak_flops=312e12, hbm_bandwidth=2.039e12, hbm_bytes=80e9),
    # H100 SXM5: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3, 80 GB.
    "h100-sxm": GpuSpec(peak_flops=989e12, hbm_bandwidth=3.35e12, hbm_bytes=80e9),
    # H200 SXM: 989 TFLOP/s dense bf16, 4.8 TB/s HBM3e, 141 GB.
    "h200": GpuSpec(peak_flops=989e12, hbm_bandwidth=4.8e12, hbm_bytes=141e9),
    # B200 (HGX B200): 2.25 PFLOP/s dense bf16, 8 TB/s HBM3e, 180 GB. No public measured profile found:
    # it keeps the seeds' MFU 0.4 and MBU 1 (GpuSpec's defaults).
    "b200": GpuSpec(peak_flops=2.25e15, hbm_bandwidth=8e12, hbm_bytes=180e9),
}
"""The datasheet peaks, at the seeds' efficiencies (MFU 0.4, MBU 1): what GPU_CALIBRATION was fitted from."""

LINK_PRESETS: dict[str, LinkSpec] = {
    "nvlink4": LinkSpec(bandwidth=900e9),  # NVLink 4 within an H100 node
    "ib-400g": LinkSpec(bandwidth=50e9),  # 400 Gb/s InfiniBand / RoCE, one NIC per GPU
    "pcie5": LinkSpec(bandwidth=64e9),  # PCIe 5.0 x16, host to host
}


@dataclass(frozen=True)
class Calibration:
    """Efficiencies fitted to a public measured profile (`benchmarks/calibrate_presets.py`)."""

    mfu: float
    mbu: float
    step_overhead_s: float
    source: str
    prefill_error: float  # median relative error of the fitted roofline's prefill times
    decode_error: float  # median relative error of its decode step times


# Fitted at each source's smallest tensor-parallel size; see docs/capacity-model.md, "Calibration".
# These are the presets' default MFU and MBU (and `xpyd plan`'s default step overhead) while the peaks
# they were fitted against are in use (model/resolve.py); MFU is the
# fraction of the peak of the precision that ran (H200: of the FP8 peak, applied to the BF16 one).
GPU_CALIBRATION: dict[str, Calibration] = {
    "a100-80g": Calibration(
        0.63, 0.60, 0.0, "DistServe A100 profile + splitwise-sim Llama-2-70B TP2", 0.078, 0.047
    ),
    "h100-sxm": Calibration(0.48, 0.54, 0.0, "splitwise-sim Llama-2-70B TP2", 0.068, 0.026),
    "h200": Calibration(0.49, 0.78, 0.0022, "Dynamo's H200 profile, Llama-3.1-8B FP8 TP1", 0.080, 0.041),
}

GPU_PRESETS: dict[str, GpuSpec] = {
    name: dataclasses.replace(gpu, mfu=GPU_CALIBRATION[name].mfu, mbu=GPU_CALIBRATION[name].mbu)
    if name in GPU_CALIBRATION
    else gpu
    for name, gpu in DATASHEET_GPUS.items()
}
"""What `--gpu` and `spec.hardware.gpu` name: the datasheet peaks with the calibrated MFU and MBU."""
