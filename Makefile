# Two entry points; both do all set-up on a fresh machine (venv, cluster binaries, Prometheus).
.PHONY: demo test
ARGS ?=

demo:  ## run the local demo: cluster, operator, Prometheus, vLLM engine stand-ins behind the real vllm-router, drifting traffic through the router, the controller converting roles live (~5 min)
	hack/demo $(ARGS)

test:  ## run every gate: ruff, mypy --strict, import-linter, unit + integration + e2e tests
	hack/test $(ARGS)
