# syntax=docker/dockerfile:1
# One image for both components; the manifests choose the program with `command:`
# (dra-operator for the Deployment, dra-node-agent for the DaemonSet).
#
#   docker build -t accel-dra:0.1.0 .
#
# Without Docker, `make image` builds the same image from Debian packages (see the README).
#
# Reproducible inputs: the base image is pinned by digest, the runtime dependencies are installed
# from requirements.lock (exact versions, no resolution), the build tools are pinned below, and the
# project itself goes in as a wheel built from this tree.

# python:3.11.13-slim-bookworm (multi-arch index digest).
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1

FROM ${PYTHON_IMAGE} AS build
ARG SETUPTOOLS_VERSION=84.2.1
ARG WHEEL_VERSION=0.48.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN pip install "setuptools==${SETUPTOOLS_VERSION}" "wheel==${WHEEL_VERSION}"
COPY pyproject.toml README.md ./
COPY api ./api
COPY operator ./operator
COPY node_agent ./node_agent
# The local development cluster is part of the same distribution (dra-local-cluster); nothing in
# the operator or the agent imports it.
COPY devcluster ./devcluster
# --no-build-isolation: build with the pinned tools above instead of whatever is newest.
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
# The same layout as `make image` (dra_devcluster/productimage.py, built without Docker): a venv
# at /opt/accel-dra first on PATH, user 65532, the OCI labels, CMD. VERSION follows pyproject.toml
# (a unit test checks); pass the others, e.g.
#   --build-arg REVISION=$(git rev-parse HEAD) --build-arg CREATED=$(date -u +%FT%TZ)
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
# No org.opencontainers.image.source label: the project has no public URL to name.
LABEL org.opencontainers.image.title=accel-dra \
      org.opencontainers.image.version=${VERSION} \
      org.opencontainers.image.revision=${REVISION} \
      org.opencontainers.image.created=${CREATED}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/accel-dra/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY requirements.lock /tmp/requirements.lock
# --no-deps: the lock is the complete closure; nothing may be resolved at build time.
RUN python -m venv /opt/accel-dra \
    && /opt/accel-dra/bin/pip install --no-deps -r /tmp/requirements.lock \
    && rm /tmp/requirements.lock
COPY --from=build /wheels /tmp/wheels
RUN /opt/accel-dra/bin/pip install --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels \
    && /opt/accel-dra/bin/pip check \
    && groupadd --gid 65532 nonroot \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin nonroot
# Non-root by default. The node agent's DaemonSet overrides this with runAsUser: 0 because it
# writes into root-owned kubelet directories on the host (see manifests/base/node-agent-daemonset.yaml).
USER 65532:65532
EXPOSE 8080 8081
CMD ["dra-operator", "run"]
