"""Roofline timing against the seeds' published numbers.

Unit conventions: the seeds round with mixed K/Ki, so each case states which one reproduces it.
"K tokens" = 1000 or 1024 tokens; "KiB"/"MiB"/"GiB" are binary bytes; "KB"/"MB"/"GB" decimal.
"""

from __future__ import annotations

import numpy as np
import pytest

from xpyd_controller.model.presets import GPU_PRESETS, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.roofline import (
    attention_factor,
    decode_step_seconds,
    decode_step_times,
    kv_bytes_per_token,
    kv_transfer_seconds,
    kv_transfer_times,
    prefill_seconds,
    prefill_times,
)
from xpyd_controller.model.specs import GpuSpec, LinkSpec, ModelSpec, SpecError

KIB = 1024
MIB = 1024**2
GIB = 1024**3

# The seed article's setup: an "8B-class" fp16 model with no hidden size (so no attention
# correction), 40 % of 990 TFLOP/s, 3.35 TB/s, 5 ms step overhead.
ARTICLE_MODEL = ModelSpec(params=8e9, layers=32, kv_heads=8, head_dim=128)
ARTICLE_GPU = GpuSpec(peak_flops=990e12, hbm_bandwidth=3.35e12, hbm_bytes=80e9, mfu=0.4)
ARTICLE_STEP_OVERHEAD = 5e-3


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ("llama-3.1-8b", 128 * KIB),  # article: "128 KB" is 128 KiB
        ("llama-3.1-70b", 320 * KIB),  # article: "320 KB" is 320 KiB
        ("deepseek-v3", 61 * (512 + 64) * 2),  # MLA: layers·(latent+rope)·bytes
    ],
)
def test_kv_bytes_per_token(preset: str, expected: int) -> None:
    assert kv_bytes_per_token(MODEL_PRESETS[preset]) == expected


@pytest.mark.parametrize(
    ("preset", "tokens", "expected_bytes", "convention"),
    [
        ("llama-3.1-8b", 4096, 512 * MIB, "4K = 4096 tokens, 512 MB = 512 MiB"),
        ("llama-3.1-8b", 8000, 1.05e9, "8K = 8000 tokens, 1.05 GB decimal"),
        ("llama-3.1-70b", 4000, 1.31e9, "4K = 4000 tokens, 1.31 GB decimal"),
        ("llama-3.1-70b", 8000, 2.62e9, "8K = 8000 tokens, 2.62 GB decimal"),
    ],
)
def test_per_request_kv_matches_article(
    preset: str, tokens: int, expected_bytes: float, convention: str
) -> None:
    actual = tokens * kv_bytes_per_token(MODEL_PRESETS[preset])
    assert actual == pytest.approx(expected_bytes, rel=5e-3), convention


@pytest.mark.parametrize(
    ("link", "expected_seconds"),
    [("pcie5", 41e-3), ("ib-400g", 52e-3), ("nvlink4", 2.9e-3)],
)
def test_article_transfer_of_70b_8k_cache(link: str, expected_seconds: float) -> None:
    # 2.62 GB = 8000 tokens × 320 KiB (decimal K tokens, binary KiB bytes).
    seconds = kv_transfer_seconds(MODEL_PRESETS["llama-3.1-70b"], LINK_PRESETS[link], 8000)
    assert float(seconds) == pytest.approx(expected_seconds, rel=0.02)


@pytest.mark.parametrize(
    ("link", "expected_seconds"),
    [("nvlink4", 4.8e-3), ("pcie5", 67e-3), ("ib-400g", 86e-3)],
)
def test_lecture_transfer_of_4gib_at_32k(link: str, expected_seconds: float) -> None:
    # 32K = 32768 tokens × 128 KiB = 4 GiB exactly (binary throughout), decimal GB/s links.
    model = MODEL_PRESETS["llama-3.1-8b"]
    assert 32768 * kv_bytes_per_token(model) == 4 * GIB
    seconds = kv_transfer_seconds(model, LINK_PRESETS[link], 32768)
    assert float(seconds) == pytest.approx(expected_seconds, rel=0.01)


def test_article_prefill_of_mean_prompt() -> None:
    assert float(prefill_seconds(ARTICLE_MODEL, ARTICLE_GPU, 4250)) == pytest.approx(0.172, rel=2e-3)


def test_article_decode_step_at_batch_30() -> None:
    step = decode_step_seconds(
        ARTICLE_MODEL, ARTICLE_GPU, batch=30, context_tokens=0, step_overhead=ARTICLE_STEP_OVERHEAD
    )
    assert float(step) == pytest.approx(9.8e-3, rel=5e-3)


def test_article_step_formula_is_reproduced_exactly() -> None:
    batches = np.arange(1, 400, dtype=np.float64)
    ours = decode_step_seconds(
        ARTICLE_MODEL, ARTICLE_GPU, batch=batches, context_tokens=0, step_overhead=ARTICLE_STEP_OVERHEAD
    )
    article = ARTICLE_STEP_OVERHEAD + np.maximum(2 * 8e9 / 3.35e12, 2 * 8e9 * batches / (0.4 * 990e12))
    np.testing.assert_array_equal(ours, article)


def test_kv_reads_lengthen_the_step() -> None:
    model = MODEL_PRESETS["llama-3.1-8b"]
    gpu = GPU_PRESETS["h100-sxm"]
    without = decode_step_seconds(model, gpu, batch=64, context_tokens=0)
    with_kv = decode_step_seconds(model, gpu, batch=64, context_tokens=4096)
    expected_extra = 64 * 4096 * 128 * KIB / gpu.effective_bandwidth
    assert float(with_kv - without) == pytest.approx(expected_extra, rel=1e-9)


def test_attention_factor_uses_crossover_and_defaults_to_one() -> None:
    model = MODEL_PRESETS["llama-3.1-8b"]
    crossover = 2 * 8.03e9 / (4 * 4096 * 32)
    assert float(attention_factor(model, crossover)) == pytest.approx(2.0)
    np.testing.assert_array_equal(attention_factor(ARTICLE_MODEL, np.array([1.0, 1e6])), [1.0, 1.0])


def test_prefill_scales_inversely_with_gpus_and_broadcasts() -> None:
    times = prefill_seconds(ARTICLE_MODEL, ARTICLE_GPU, np.array([1000.0, 2000.0]), gpus=np.array([1.0, 2.0]))
    assert times[0] == pytest.approx(times[1])


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: ModelSpec(params=-1, layers=1, kv_heads=1, head_dim=1), "params"),
        (lambda: ModelSpec(params=float("nan"), layers=1, kv_heads=1, head_dim=1), "params"),
        (lambda: ModelSpec(params=1e9, layers=0, kv_heads=1, head_dim=1), "layers"),
        (lambda: ModelSpec(params=1e9, layers=1, kv_heads=1, head_dim=1, kv_latent_dim=512), "rope_dim"),
        (lambda: ModelSpec(params=1e9, layers=1, kv_heads=1, head_dim=1, active_params=2e9), "active_params"),
        (lambda: GpuSpec(peak_flops=1e12, hbm_bandwidth=1e12, hbm_bytes=1e9, mfu=1.5), "mfu"),
        (lambda: GpuSpec(peak_flops=1e12, hbm_bandwidth=0.0, hbm_bytes=1e9), "hbm_bandwidth"),
        (lambda: LinkSpec(bandwidth=1e9, overhead=-1e-3), "overhead"),
    ],
)
def test_invalid_specs_name_field_value_and_rule(build: object, field: str) -> None:
    with pytest.raises(SpecError) as caught:
        build()  # type: ignore[operator]
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field} = ")
    assert caught.value.rule


@pytest.mark.parametrize("hidden_size", [None, 4096])
def test_the_list_roofline_is_the_vectorised_one_to_the_bit(hidden_size: int | None) -> None:
    """The event loop times requests with the `*_times` functions (no numpy); the tables were measured
    with the vectorised ones."""
    model = ModelSpec(params=8e9, layers=32, kv_heads=8, head_dim=128, hidden_size=hidden_size)
    gpu, link = GpuSpec(990e12, 3.35e12, 80e9, mfu=0.43, mbu=0.71), LinkSpec(50e9, 2e-3)
    tokens = np.arange(1.0, 20_000.0, 7.0)
    for gpus in (1, 4):
        vectorised = prefill_seconds(model, gpu, tokens, gpus=gpus).tolist()
        assert prefill_times(model, gpu, tokens.tolist(), gpus) == vectorised
        for context, overhead in ((0.0, 5e-3), (1408.0, 0.0)):
            steps = decode_step_seconds(
                model, gpu, np.arange(600.0), context, gpus=gpus, step_overhead=overhead
            )
            listed = decode_step_times(model, gpu, range(600), context, gpus=gpus, step_overhead=overhead)
            assert listed == steps.tolist()
    assert (
        kv_transfer_times(model, link, tokens.tolist()) == kv_transfer_seconds(model, link, tokens).tolist()
    )
