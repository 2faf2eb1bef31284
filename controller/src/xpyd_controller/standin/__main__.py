"""`python -m xpyd_controller.standin [vllm serve flags] [--simulate JSON]`: serve one simulated instance.

The flags `vllm serve` takes that matter here are read (`--model`, `--served-model-name`, `--host`,
`--port`, `--tensor-parallel-size`, `--stream-interval`, `--shutdown-timeout`: on SIGTERM in-flight
requests get that long to finish, 0 aborts them, as in vLLM 0.32; `--kv-transfer-config`: a prefill
keeps unpulled KV for its `kv_connector_extra_config.kv_lease_duration`, 30 s by default, as NIXL
does); every other flag is accepted and ignored, so an instance pod's rendered args run unchanged. The simulated hardware is the
PDDeployment's: `--simulate '{"model": {...spec.model}, "hardware": {...spec.hardware}}'` or the
`XPYD_STANDIN_SPEC` environment variable (default: the llama-3.1-8b preset on an h100-sxm over ib-400g).
The KV side channel's host is `VLLM_NIXL_SIDE_CHANNEL_HOST`, as for vLLM (default: the bind host, or
localhost for 0.0.0.0); its port is the HTTP port.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from aiohttp import web
from pydantic import ValidationError

from xpyd_api.engines import NIXL_DEFAULT_KV_LEASE_S, NIXL_EXTRA_CONFIG, NIXL_HOST_ENV, NIXL_KV_LEASE
from xpyd_api.errors import InputError
from xpyd_api.models import HardwareSpec, ModelSpec
from xpyd_controller.control.setup import gpu_spec, link_spec, model_spec
from xpyd_controller.sim.config import Hardware
from xpyd_controller.sim.instance import SimulatedInstance
from xpyd_controller.standin.server import StandinEngine

SPEC_ENV = "XPYD_STANDIN_SPEC"
DEFAULT_PRESET = "llama-3.1-8b"


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(
        prog="python -m xpyd_controller.standin", description=__doc__.split("\n")[0]
    )
    parse.add_argument("--model", default="standin/model")
    parse.add_argument("--served-model-name", default=None)
    parse.add_argument("--host", default="0.0.0.0")
    parse.add_argument("--port", type=int, default=8000)
    parse.add_argument("--tensor-parallel-size", type=int, default=1)
    parse.add_argument("--stream-interval", type=int, default=1, help="tokens per streamed chunk (vLLM's)")
    parse.add_argument(
        "--shutdown-timeout", type=float, default=0.0, help="seconds in-flight requests get after SIGTERM"
    )
    parse.add_argument("--simulate", default=os.environ.get(SPEC_ENV), help=f"JSON; default ${SPEC_ENV}")
    parse.add_argument("--kv-transfer-config", default=None, help="vLLM's JSON; its KV lease is read")
    return parse


def kv_lease_of(kv_transfer_config: str | None) -> float:
    """The KV lease a vLLM NIXL prefill would hold, from its `--kv-transfer-config`."""
    if kv_transfer_config is None:
        return NIXL_DEFAULT_KV_LEASE_S
    try:
        config = json.loads(kv_transfer_config)
        lease = config.get(NIXL_EXTRA_CONFIG, {}).get(NIXL_KV_LEASE, NIXL_DEFAULT_KV_LEASE_S)
        if isinstance(lease, bool) or not isinstance(lease, int | float) or lease < 0:
            raise ValueError(f"{NIXL_KV_LEASE} = {lease!r}: must be a number >= 0")
        return float(lease)
    except (json.JSONDecodeError, AttributeError, ValueError) as error:
        raise ValueError(f"--kv-transfer-config = {kv_transfer_config!r}: {error}") from None


def hardware_of(simulate: str | None, model_name: str, gpus: int) -> Hardware:
    """The roofline's hardware from the PDDeployment's `model` and `hardware` parts."""
    try:
        given = json.loads(simulate) if simulate else {}
        if not isinstance(given, dict):
            raise ValueError(f"--simulate = {simulate!r}: must be a JSON object with model and hardware")
        model = ModelSpec.model_validate(
            {"name": model_name, "preset": DEFAULT_PRESET, **given.get("model", {})}
        )
        hardware = HardwareSpec.model_validate(given.get("hardware", {}))
        return Hardware(model_spec(model), gpu_spec(hardware), link_spec(hardware), gpus_per_instance=gpus)
    except (json.JSONDecodeError, ValidationError, InputError) as error:
        raise ValueError(f"--simulate = {simulate!r}: {error}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args, _ignored = parser().parse_known_args(argv)
    try:
        hardware = hardware_of(args.simulate, args.model, args.tensor_parallel_size)
        instance = SimulatedInstance(hardware, kv_lease_s=kv_lease_of(args.kv_transfer_config))
        side_host = os.environ.get(NIXL_HOST_ENV) or ("localhost" if args.host == "0.0.0.0" else args.host)
        engine = StandinEngine(
            instance,
            model_name=args.served_model_name or args.model,
            side_channel_host=side_host,
            side_channel_port=args.port,
            stream_interval=args.stream_interval,
        )
    except ValueError as error:
        print(f"standin: {error}", file=sys.stderr)
        return 2
    web.run_app(
        engine.app(),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
        shutdown_timeout=max(args.shutdown_timeout, 0.01),  # aiohttp waits without limit on 0
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
