"""The stand-in's request and flag parsing: prompts, kv_transfer_params, the simulated hardware."""

from __future__ import annotations

import pytest

from xpyd_controller.sim.instance import JobKind
from xpyd_controller.standin.__main__ import hardware_of, kv_lease_of, main
from xpyd_controller.standin.server import RequestError, job_kind, prompt_token_ids


def test_prompts_are_token_ids_or_words() -> None:
    assert prompt_token_ids([5, 6, 7]) == [5, 6, 7]
    assert prompt_token_ids([[5, 6]]) == [5, 6]
    assert len(prompt_token_ids("one two three")) == 3
    assert prompt_token_ids("same words") == prompt_token_ids("same  words")
    with pytest.raises(RequestError, match=r"prompt = .*must be a string or a non-empty list of token ids"):
        prompt_token_ids({"no": 1})


def test_the_transfer_params_say_what_the_request_asks() -> None:
    assert job_kind({"do_remote_decode": True, "do_remote_prefill": False}) is JobKind.PREFILL
    assert job_kind({"do_remote_prefill": True, "remote_block_ids": [1]}) is JobKind.DECODE
    assert job_kind(None) is JobKind.LOCAL


def test_the_simulated_hardware_is_the_pdds_and_bad_input_is_named() -> None:
    hardware = hardware_of('{"hardware": {"gpu": "h100-sxm", "hbmBytes": 2e10}}', "m", 2)
    assert hardware.gpu.hbm_bytes == 2e10 and hardware.gpus_per_instance == 2
    with pytest.raises(ValueError, match=r"--simulate = '\[1\]': must be a JSON object"):
        hardware_of("[1]", "m", 1)
    with pytest.raises(ValueError, match=r"--simulate = .*mfu"):
        hardware_of('{"hardware": {"mfu": 7}}', "m", 1)


def test_the_kv_lease_is_read_from_the_kv_transfer_config_as_vllm_reads_it() -> None:
    assert kv_lease_of(None) == 30.0
    assert kv_lease_of('{"kv_connector": "NixlConnector", "kv_role": "kv_both"}') == 30.0
    assert kv_lease_of('{"kv_connector_extra_config": {"kv_lease_duration": 6}}') == 6.0
    with pytest.raises(
        ValueError, match=r"--kv-transfer-config = .*kv_lease_duration = -1: must be a number >= 0"
    ):
        kv_lease_of('{"kv_connector_extra_config": {"kv_lease_duration": -1}}')
    with pytest.raises(ValueError, match=r"--kv-transfer-config = '\[1\]'"):
        kv_lease_of("[1]")


def test_a_bad_flag_value_exits_2_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--simulate", "{not json"]) == 2
    assert "standin: --simulate = '{not json'" in capsys.readouterr().err
