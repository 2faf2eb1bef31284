"""One simulated instance (the engine stand-in's core): prefill jobs keep KV for the lease, decode jobs pull
it and batch, local jobs do both; times are the roofline's."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from xpyd_controller.model.presets import GPU_PRESETS, LINK_PRESETS, MODEL_PRESETS
from xpyd_controller.model.roofline import decode_step_seconds, kv_transfer_seconds, prefill_seconds
from xpyd_controller.sim.config import Hardware
from xpyd_controller.sim.instance import KV_BLOCK_TOKENS, InstanceError, Job, JobKind, SimulatedInstance

SMALL_GPU = dataclasses.replace(
    GPU_PRESETS["h100-sxm"], peak_flops=3e14, mfu=0.4, hbm_bandwidth=1e12, hbm_bytes=20e9
)
HARDWARE = Hardware(MODEL_PRESETS["llama-3.1-8b"], SMALL_GPU, LINK_PRESETS["ib-400g"])


def run_until_idle(instance: SimulatedInstance, limit: float = 1e4) -> list[tuple[float, str, int, bool]]:
    """Every progress event (time, job, generated, finished) until nothing but leases is due."""
    events = []
    while (due := instance.next_due()) < limit and instance.in_flight:
        events += [(due, p.job.id, p.generated, p.finished) for p in instance.advance(due)]
    return events


def sample(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in:\n{text}"
    return float(match.group(1))


def test_a_prefill_job_answers_after_its_roofline_time_and_keeps_its_blocks_for_the_lease() -> None:
    instance = SimulatedInstance(HARDWARE, kv_lease_s=30.0)
    job = Job("p", JobKind.PREFILL, prompt_tokens=1000, output_tokens=1, received_s=0.0)
    instance.submit(job, 0.0)
    assert instance.in_flight == 1
    events = run_until_idle(instance)
    expected = float(prefill_seconds(HARDWARE.model, HARDWARE.gpu, 1000))
    assert [e[1:] for e in events] == [("p", 1, True)]
    assert events[0][0] == pytest.approx(expected)
    assert len(job.blocks) == math.ceil(1000 / KV_BLOCK_TOKENS)
    assert instance.in_flight == 0 and instance.leased_blocks == len(job.blocks)
    assert sample(instance.metrics_text("m"), "vllm:kv_cache_usage_perc") > 0  # the held KV counts
    instance.advance(expected + 29.0)
    assert instance.leased_blocks == len(job.blocks)
    instance.advance(expected + 30.0)
    assert instance.leased_blocks == 0  # nobody pulled: the lease ran out
    assert not instance.release(job.blocks[0])


def test_a_pulled_prefill_frees_its_blocks_at_once() -> None:
    instance = SimulatedInstance(HARDWARE)
    job = Job("p", JobKind.PREFILL, 100, 1, 0.0)
    instance.submit(job, 0.0)
    run_until_idle(instance)
    assert instance.release(job.blocks[0]) and instance.leased_blocks == 0


def test_a_decode_job_waits_for_the_transfer_then_generates_one_token_per_step() -> None:
    instance = SimulatedInstance(HARDWARE)
    instance.submit(Job("d", JobKind.DECODE, prompt_tokens=500, output_tokens=3, received_s=0.0), 0.0)
    events = run_until_idle(instance)
    transfer = float(kv_transfer_seconds(HARDWARE.model, HARDWARE.link, 500))
    step = float(decode_step_seconds(HARDWARE.model, HARDWARE.gpu, batch=1, context_tokens=500))
    assert [e[2:] for e in events] == [(1, False), (2, False), (3, True)]
    assert events[0][0] == pytest.approx(transfer + step)
    text = instance.metrics_text("m")
    assert sample(text, "vllm:request_generation_tokens_sum") == 3
    assert sample(text, "vllm:time_to_first_token_seconds_sum") == pytest.approx(transfer + step)
    assert sample(text, "vllm:num_requests_running") == 0


def test_a_local_job_prefills_then_decodes_here_and_jobs_batch_together() -> None:
    instance = SimulatedInstance(HARDWARE)
    instance.submit(Job("a", JobKind.LOCAL, 200, 4, 0.0), 0.0)
    instance.submit(Job("b", JobKind.DECODE, 200, 4, 0.0), 0.0)
    events = run_until_idle(instance)
    finished = {job: at for at, job, _, done in events if done}
    assert set(finished) == {"a", "b"}
    prefill = float(prefill_seconds(HARDWARE.model, HARDWARE.gpu, 200))
    first_a = min(at for at, job, _, _ in events if job == "a")
    assert first_a > prefill
    assert sample(instance.metrics_text("m"), "vllm:request_prompt_tokens_count") == 2


def test_bad_jobs_and_settings_are_refused_by_name() -> None:
    with pytest.raises(InstanceError, match="kv_lease_s = 0"):
        SimulatedInstance(HARDWARE, kv_lease_s=0)
    with pytest.raises(InstanceError, match=r"job = \(0, 1\): needs >= 1 prompt and output token"):
        SimulatedInstance(HARDWARE).submit(Job("x", JobKind.LOCAL, 0, 1, 0.0), 0.0)
