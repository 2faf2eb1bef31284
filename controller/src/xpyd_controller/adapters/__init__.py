"""The controller's I/O, one system per module: Kubernetes (`k8s`), Prometheus (`prometheus`), its own
`/metrics` (`telemetry`) and health endpoint (`health`)."""
