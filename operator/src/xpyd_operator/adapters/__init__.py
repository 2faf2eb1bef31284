"""The operator's own I/O: engines' and routers' HTTP endpoints (`engine_client`). Kubernetes I/O is the
shared client `xpyd_api.k8s`."""
