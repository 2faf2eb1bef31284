"""Engine metrics for the controller: PromQL per engine family (pure), the Observation built from the
answers (pure), and the one Prometheus adapter (I/O)."""
