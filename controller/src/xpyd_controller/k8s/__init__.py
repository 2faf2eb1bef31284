"""The controller's only Kubernetes I/O (PDDeployments, instance pods, Events, the leader Lease)."""
