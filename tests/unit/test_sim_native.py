"""The compiled event loop (hack/native) is the source engine, only faster: same runs, bit for bit.

hack/test builds it before pytest, so these tests need it: without a current build they fail and say
to run hack/native (they do not skip)."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from xpyd_controller.sim import engine, native
from xpyd_controller.sim.config import Fleet, Realism, SimConfig
from xpyd_controller.sim.policies import build_policy
from xpyd_controller.sim.scenarios import Scenario, load_scenario, mix_swing
from xpyd_controller.sim.seed import SEED_HARDWARE, SEED_SLO, seed_requests
from xpyd_controller.sim.traces import Trace


@pytest.fixture
def fresh_choice(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Forget the cached engine choice before and after, so each test decides anew."""
    native.run_events_impl.cache_clear()
    yield monkeypatch
    native.run_events_impl.cache_clear()


def first(trace: Trace, seconds: float) -> Trace:
    keep = trace.arrival_s < seconds
    return Trace(
        trace.arrival_s[keep],
        trace.prompt_tokens[keep],
        trace.output_tokens[keep],
        trace.prefix_hit_tokens[keep],
    )


def assert_same_run(source: engine.RawRun, compiled: engine.RawRun) -> None:
    for field in ("first_token_s", "finish_s", "max_gap_s"):
        np.testing.assert_array_equal(getattr(source, field), getattr(compiled, field), err_msg=field)
    for field in ("gap_histogram", "end_s", "gpu_seconds", "decisions", "scale_ups", "scale_downs"):
        assert getattr(source, field) == getattr(compiled, field), field
    assert (source.conversions, source.events) == (compiled.conversions, compiled.events)
    # Each build defines its own PoolSample class: compare the values.
    assert [dataclasses.astuple(s) for s in source.samples] == [
        dataclasses.astuple(s) for s in compiled.samples
    ]


SEED_FLEETS = [("colocated", 0, 8), ("disagg", 1, 7), ("disagg", 6, 2)]
REALISM = [
    Realism(),
    Realism(kv_capacity=True, decode_kv_reads=True, kv_memory_fraction=0.5),
    Realism(
        layerwise_transfer=True, shared_link_bandwidth=100e9, local_prefill_threshold=1000, prefix_cache=True
    ),
]


@pytest.mark.parametrize("realism", REALISM, ids=["seed", "kv", "link-local-prefix"])
@pytest.mark.parametrize(("mode", "prefill", "decode"), SEED_FLEETS)
def test_static_fleets_run_identically(realism: Realism, mode: str, prefill: int, decode: int) -> None:
    config = SimConfig(SEED_HARDWARE, Fleet(mode, prefill, decode), realism, SEED_SLO)  # type: ignore[arg-type]
    requests = seed_requests(20.0, count=2000, seed=5)
    if realism.prefix_cache:
        requests = Trace(
            requests.arrival_s, requests.prompt_tokens, requests.output_tokens, requests.prompt_tokens // 3
        )
    assert_same_run(engine.run_events(config, requests), native.compiled_run_events()(config, requests))


@pytest.mark.parametrize(
    ("scenario", "seconds"),
    [(load_scenario("step-10-20"), 2400.0), (mix_swing(hours=2.5), 2.5 * 3600)],
    ids=["step-10-20", "mix-swing"],
)
def test_policy_in_the_loop_runs_identically(scenario: Scenario, seconds: float) -> None:
    requests = first(scenario.traffic.build(seed=2), seconds)
    runs = [
        run(scenario.config, requests, build_policy("xpyd", scenario.config, requests), scenario.limits)
        for run in (engine.run_events, native.compiled_run_events())
    ]
    assert runs[0].scale_ups > 0  # the policy acted: the comparison covers lifecycles
    assert runs[0].conversions > 0 or scenario.name != "mix-swing"  # and role conversions
    assert_same_run(*runs)


def test_auto_uses_the_compiled_engine_when_current(fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.setenv(native.CHOICE_VARIABLE, "auto")
    assert native.run_events_impl()[1] == "compiled"


def test_python_is_chosen_on_request(fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.setenv(native.CHOICE_VARIABLE, "python")
    assert native.run_events_impl() == (engine.run_events, "python")


def test_a_stale_build_is_never_run(fresh_choice: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stamp = tmp_path / "engine_native.stamp"
    stamp.write_text("built-from-other-sources\n")
    fresh_choice.setattr(native, "STAMP", stamp)
    fresh_choice.setenv(native.CHOICE_VARIABLE, "auto")
    with pytest.warns(UserWarning, match="older than sim/engine.py"):
        assert native.run_events_impl() == (engine.run_events, "python")
    native.run_events_impl.cache_clear()
    fresh_choice.setenv(native.CHOICE_VARIABLE, "compiled")
    with pytest.raises(native.NativeEngineError, match="compiled simulator engine is stale: run hack/native"):
        native.run_events_impl()


def test_a_missing_build_falls_back_quietly(fresh_choice: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fresh_choice.setattr(native, "STAMP", tmp_path / "absent.stamp")
    fresh_choice.setenv(native.CHOICE_VARIABLE, "auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.run_events_impl()[1] == "python"


def test_an_unknown_choice_names_the_variable_and_the_choices(fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.setenv(native.CHOICE_VARIABLE, "fast")
    with pytest.raises(
        native.NativeEngineError, match=r"XPYD_SIM_ENGINE='fast': must be one of auto, python"
    ):
        native.run_events_impl()


def test_the_digest_covers_the_modules_the_engine_imports() -> None:
    names = {"/".join(path.parts[-3:]) for path in native._compiled_against()}
    assert {
        "xpyd_controller/sim/engine.py",
        "xpyd_controller/sim/engine_instance.py",  # the engine's parts, compiled with it
        "xpyd_controller/sim/engine_link.py",
        "xpyd_controller/sim/engine_observe.py",
        "xpyd_controller/sim/engine_records.py",
        "xpyd_controller/sim/config.py",
        "xpyd_controller/model/roofline.py",
        "xpyd_controller/policy/types.py",
        "src/xpyd_api/resize.py",  # the shared resize rule, interpreted but typed into the build
    } <= names
    assert all(path.is_file() for path in native._compiled_against())
