# One image for the operator, the router and the simulated accelerator nodes:
#   docker build -t tiergate:0.1.0 .      then   tiergate operator | router | sim-node ...
# It runs as a numeric non-root user with a read-only root filesystem: nothing is written
# outside /tmp (HOME and TMPDIR; the chart mounts an emptyDir there) and the mounted volumes.
# Pin by digest too where the registry is reachable: python:3.11.13-slim-bookworm@sha256:...
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/tiergate
WORKDIR /src
# Only what `pip install .` needs (.dockerignore keeps the rest out of the context too).
COPY pyproject.toml README.md ./
COPY tiergate ./tiergate
COPY sim_nodes ./sim_nodes
COPY router ./router
COPY operator ./operator
# Runtime dependencies only (no dev extras). pip compiles the bytecode here, at build time:
# the running container cannot write it.
RUN /opt/tiergate/bin/pip install .

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/tiergate/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp
COPY --from=build /opt/tiergate /opt/tiergate
# A passwd entry for the UID: some libraries look the user up (getpass, Path.home() fallbacks).
RUN groupadd --gid 10001 tiergate \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin tiergate
# Numeric, so that Kubernetes can verify runAsNonRoot without reading /etc/passwd.
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["tiergate"]
CMD ["--help"]
