# Prometheus for the kind tests: the binary the kwok groups run, which hack/testbin builds from the Go
# module proxy with kubernetes_sd_configs (Debian's package leaves that discovery out), on the same base
# as the project images. The context holds only that binary.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
COPY prometheus /usr/local/bin/prometheus
USER 65534:65534
ENTRYPOINT ["/usr/local/bin/prometheus"]
