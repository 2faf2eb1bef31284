# Two entry points; both do all set-up on a fresh machine (venv, cluster binaries, Prometheus).
.PHONY: demo test
ARGS ?=

demo:  ## run the local demo: a real (kwok) cluster comes up, shows its nodes, tears down
	hack/demo $(ARGS)

test:  ## run every gate: ruff, mypy --strict, import-linter, unit + integration + e2e tests
	hack/test $(ARGS)
