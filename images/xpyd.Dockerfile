# The xpyd image: the operator (`python -m xpyd_operator`), the controller and the CLI (`xpyd`) in one
# virtualenv, with the simulator's engine compiled by mypyc (hack/native) inside the build stage.
# Runs as the numeric non-root user 65532 and writes nothing outside /tmp, so it fits the restricted
# Pod Security profile with readOnlyRootFilesystem (the chart mounts /tmp as an emptyDir).
# The base keeps `sh` and `cat`: as the engine stand-in under switchMethod InPlace, the instance pods'
# liveness probe runs them (render.ROLE_LIVENESS_COMMAND).
#
# Ordinary build (a registry answers):   docker build -f images/xpyd.Dockerfile -t IMAGE .
# Offline build (hack/kind does this):   BASE/BUILD_BASE are Debian rootfs images made with mmdebstrap,
#   the context holds .wheels/ (downloaded on the host) and PIP_NO_INDEX=1: the build needs no network.
# Only classic-builder features are used, so DOCKER_BUILDKIT=0 works as well as BuildKit.
ARG BASE=python:3.11-slim-bookworm
ARG BUILD_BASE=${BASE}

FROM ${BUILD_BASE} AS build
ARG PIP_NO_INDEX=0
ENV PIP_NO_INDEX=${PIP_NO_INDEX} PIP_FIND_LINKS=/deps PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
# mypyc needs a C compiler: the offline build base has one, python:slim gets it from apt.
RUN command -v cc >/dev/null || { apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
      && rm -rf /var/lib/apt/lists/*; }
# Dependencies first (their layer survives source changes), then xpyd itself. `.wheel[s]` matches the
# offline build's wheels (copied into /deps beside pyproject.toml) and nothing elsewhere.
COPY pyproject.toml .wheel[s] /deps/
RUN python3 -m venv /opt/xpyd && /opt/xpyd/bin/python -c 'import tomllib; \
    print("\n".join(tomllib.load(open("/deps/pyproject.toml", "rb"))["project"]["dependencies"]))' >/tmp/deps \
    && /opt/xpyd/bin/pip install -r /tmp/deps mypy && /opt/xpyd/bin/pip install --upgrade setuptools wheel
COPY . /src
RUN /opt/xpyd/bin/pip install --no-deps --no-build-isolation /src
# hack/native compiles sim/engine.py from the source tree with the venv's mypyc; the build and its
# stamp then go beside the installed engine.py (same sources, so the stamp is current there too).
# Build-only packages leave the venv afterwards (the compiled engine needs librt, mypy's runtime).
RUN cd /src && ln -s /opt/xpyd .venv && XPYD_CACHE=/tmp/native-cache hack/native \
    && sim=$(/opt/xpyd/bin/python -c 'import xpyd_controller.sim as s, os; print(os.path.dirname(s.__file__))') \
    && cp controller/src/xpyd_controller/sim/engine_native* "$sim/" \
    && XPYD_SIM_ENGINE=compiled /opt/xpyd/bin/xpyd version \
    && /opt/xpyd/bin/pip uninstall -y mypy pathspec setuptools pip

FROM ${BASE}
COPY --from=build /opt/xpyd /opt/xpyd
# A passwd entry for the numeric user: Kopf names its peering identity after getpass.getuser(), which
# fails for a uid /etc/passwd does not know (found on kind: the operator pod crashed at start).
RUN echo 'xpyd:x:65532:65532:xpyd:/tmp:/usr/sbin/nologin' >>/etc/passwd && echo 'xpyd:x:65532:' >>/etc/group
# HOME and matplotlib's cache in /tmp: the root filesystem may be read-only.
ENV PATH=/opt/xpyd/bin:${PATH} PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
USER 65532:65532
CMD ["xpyd", "--help"]
