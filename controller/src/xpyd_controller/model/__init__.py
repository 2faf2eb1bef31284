"""The xPyD capacity model: pure, vectorised sizing of prefill and decode pools from the seeds.

specs (ModelSpec, GpuSpec, LinkSpec) → roofline (per-request times) → queueing (M/G/x waits) →
sizing (Workload, Slo, PoolConfig → size_pools → Plan) → explain (the plan in words);
calibration inverts the roofline to fit MFU/MBU to measured times.
Derivations: docs/capacity-model.md.
"""
