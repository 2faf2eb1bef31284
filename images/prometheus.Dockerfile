# Prometheus for the kind tests: the binary hack/testbin unpacks from Debian's package (the version the
# other tests run), on the same base as the project images. The context holds only that binary.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
COPY prometheus /usr/local/bin/prometheus
USER 65534:65534
ENTRYPOINT ["/usr/local/bin/prometheus"]
