"""The two names Dynamo 1.6.1's planner imports from `aisimulate_core.sdk`, answering from xpyd's roofline.

Dynamo's SLA planner sizes pools from forward-pass time estimates (`estimate_forward_pass_time_ms` on a
list of per-rank ForwardPassMetrics dicts); upstream those come from AISimulate's native model, which
is fetched from a registry this project cannot reach. Here every estimate is xpyd's roofline for the
deployment the benchmark configured with `use_roofline`, so Dynamo and xpyd plan from the same cost
model, as Dynamo's pre-deployment profiling of the very engines would give it. The estimates are not
tuned by observed forward passes (`tune_with_fpms` records only how many it was fed): xpyd's simulator
runs the same roofline, so there is nothing to correct.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xpyd_controller.model.roofline import decode_step_seconds, prefill_seconds
from xpyd_controller.model.specs import GpuSpec, ModelSpec


@dataclass(frozen=True)
class RooflineDeployment:
    """What one role's engine is: model, GPU, GPUs per instance, fixed cost per forward pass."""

    model: ModelSpec
    gpu: GpuSpec
    gpus: int
    step_overhead_s: float
    decode_kv_reads: bool = True  # xpyd's simulator reads resident KV in decode steps only when asked


_DEPLOYMENT: dict[str, RooflineDeployment] = {}


def use_roofline(prefill: RooflineDeployment, decode: RooflineDeployment) -> None:
    """Set the engines every later `RustForwardPassPerfModel.best_available` answers for."""
    _DEPLOYMENT.update(prefill=prefill, decode=decode, aggregated=decode)


@dataclass
class _LegacyMigration:
    estimator_config: dict[str, Any]


@dataclass
class ForwardPassPerfModelConfig:
    """The configuration record Dynamo builds and passes back to `best_available` as a dict."""

    model: str = ""
    system: str = "unprofiled"
    backend: str = "vllm"
    worker_type: str = "decode"
    estimation_mode: str = "fpm_regression"
    tp: int = 1
    pp: int = 1
    attention_dp: int = 1
    kv_block_size: int | None = None
    nextn: int = 0
    estimator_config: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_legacy_engine_config(
        legacy: Mapping[str, Any], worker_type: str, options: Mapping[str, Any]
    ) -> _LegacyMigration:
        """Dynamo reads only `.estimator_config` of the migrated record: keep its options there."""
        return _LegacyMigration({"fpm_regression": {"sampling": dict(options)}, "worker_type": worker_type})


class RustForwardPassPerfModel:
    """Forward-pass time of one engine iteration from xpyd's roofline (ms)."""

    def __init__(self, deployment: RooflineDeployment) -> None:
        self._deployment = deployment
        self.tuned_iterations = 0

    @classmethod
    def best_available(cls, config: Mapping[str, Any]) -> RustForwardPassPerfModel:
        role = str(config["worker_type"])
        if role not in _DEPLOYMENT:
            raise RuntimeError(f"no roofline deployment set for {role!r}: call use_roofline() first")
        return cls(_DEPLOYMENT[role])

    def estimate_forward_pass_time_ms(self, metrics_by_rank: Sequence[Mapping[str, Any]]) -> float:
        """The slowest rank's iteration: its prompts' prefill plus one decode step of its batch."""
        return max(self._iteration_ms(rank["scheduled_requests"]) for rank in metrics_by_rank)

    def _iteration_ms(self, scheduled: Mapping[str, Any]) -> float:
        d = self._deployment
        seconds = 0.0
        prompts, prompt_tokens = (
            int(scheduled["num_prefill_requests"]),
            float(scheduled["sum_prefill_tokens"]),
        )
        if prompts > 0 and prompt_tokens > 0:
            seconds += prompts * float(prefill_seconds(d.model, d.gpu, prompt_tokens / prompts, d.gpus))
        batch, kv_tokens = int(scheduled["num_decode_requests"]), float(scheduled["sum_decode_kv_tokens"])
        if batch > 0:
            context = kv_tokens / batch if d.decode_kv_reads else 0.0
            seconds += float(decode_step_seconds(d.model, d.gpu, batch, context, gpus=d.gpus))
        if seconds == 0.0:
            return 0.0
        return (seconds + d.step_overhead_s) * 1e3

    def tune_with_fpms(self, iterations: Sequence[Sequence[Mapping[str, Any]]]) -> None:
        self.tuned_iterations += len(iterations)

    def diagnostics(self) -> dict[str, Any]:
        return {"readiness": "ready", "source": "xpyd-roofline", "tuned_iterations": self.tuned_iterations}
