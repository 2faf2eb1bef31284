"""The controller's pure core: pool counts, policy setup from a PDDeployment, status rendering, lease
arithmetic and the decision loop over Protocol-typed ports (the adapters in `k8s` and `metrics` do I/O)."""
