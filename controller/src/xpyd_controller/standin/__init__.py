"""An engine stand-in that speaks vLLM's HTTP API, timed by the simulator's roofline (an I/O adapter).

For the many-instance tests and the kind images, where a real vLLM cannot run: `python -m
xpyd_controller.standin` takes the flags `vllm serve` takes (unknown ones are ignored, so the operator's
rendered engine args work as they are) and serves one simulated instance (`xpyd_controller.sim.instance`).
"""
