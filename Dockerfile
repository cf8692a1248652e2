# syntax=docker/dockerfile:1
# trainmedic: one image for every role (`trainmedic run --role node|cluster|brain|all`) and the CLI.
#
#   docker build -t trainmedic:0.1.0 .
#   docker run --rm trainmedic:0.1.0 diagnose --logs /logs   # with the logs mounted at /logs
#
# Two stages: the package and its dependencies are installed into a virtualenv in the first, which
# alone is copied into the second, so no build tool or pip cache ships. The image runs as an
# unprivileged user (10001); the node agent's DaemonSet chooses root for itself (deploy/node-daemonset.yaml).
# EXTRAS=fast adds Hyperscan (wheels for x86_64 and aarch64); build with --build-arg EXTRAS= elsewhere.

ARG PYTHON_IMAGE=python:3.12.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/trainmedic
WORKDIR /src
COPY pyproject.toml README.md ./
COPY trainmedic ./trainmedic
COPY udal ./udal
COPY detectors ./detectors
COPY remediations ./remediations
COPY reports ./reports
COPY rules ./rules
COPY agent ./agent
ARG EXTRAS=fast
RUN if [ -n "${EXTRAS}" ]; then spec=".[${EXTRAS}]"; else spec="."; fi \
 && /opt/trainmedic/bin/pip install "${spec}" \
 && /opt/trainmedic/bin/trainmedic version

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="trainmedic" \
      org.opencontainers.image.description="Fault diagnosis and self-healing for AI training jobs on Kubernetes (NVIDIA, Ascend, Cambricon)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/trainmedic/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# State (incident store, scenes, read positions) lives in /var/lib/trainmedic: owned by the user and
# writable by group 0 as well, so the image also runs under an arbitrary uid with gid 0.
RUN groupadd --system --gid 10001 trainmedic \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/trainmedic \
      --shell /usr/sbin/nologin trainmedic \
 && mkdir -p /var/lib/trainmedic /etc/trainmedic \
 && chown 10001:0 /var/lib/trainmedic \
 && chmod 0775 /var/lib/trainmedic
COPY --from=build /opt/trainmedic /opt/trainmedic
USER 10001:10001
WORKDIR /var/lib/trainmedic
EXPOSE 8080
# The API's liveness endpoint on api.port (TRAINMEDIC_API__PORT when set). Kubernetes ignores this
# and uses the probes in deploy/; docker and docker compose use it.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % (os.environ.get('TRAINMEDIC_API__PORT') or '8080'), timeout=4)"]
ENTRYPOINT ["trainmedic"]
CMD ["run", "--role", "all"]
