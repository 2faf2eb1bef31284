# The real router the operator deploys (`vllm-router`, PyPI vllm-router), as an image for pods.
# Same bases and offline rules as xpyd.Dockerfile: the context holds .wheels/ when PIP_NO_INDEX=1.
ARG BASE=python:3.11-slim-bookworm
ARG BUILD_BASE=${BASE}

FROM ${BUILD_BASE} AS build
ARG PIP_NO_INDEX=0
ARG VLLM_ROUTER_VERSION=0.1.17
ENV PIP_NO_INDEX=${PIP_NO_INDEX} PIP_FIND_LINKS=/src/.wheels PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
COPY . /src
RUN python3 -m venv /opt/router && /opt/router/bin/pip install "vllm-router==${VLLM_ROUTER_VERSION}"

FROM ${BASE}
COPY --from=build /opt/router /opt/router
ENV PATH=/opt/router/bin:${PATH} PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
USER 65532:65532
ENTRYPOINT ["vllm-router"]
