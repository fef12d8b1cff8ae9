# syntax=docker/dockerfile:1
# The SkipMQ broker image (the default image of helm/skipmq). Build from the repository root:
#
#   docker build -t skipmq:0.1.0 .
#   podman build --build-arg BASE_IMAGE=localhost/skipmq-base:bookworm -t skipmq:0.1.0 .
#                                    # no registry: bash scripts/build_image.sh makes that base
#
# BASE_IMAGE is any Debian-like image with python3 (3.11+, with its venv module), sh, apt-get,
# dpkg and useradd; every stage starts from it. Stage `build` installs SkipMQ and its runtime
# dependencies (the `fast` extra: uvloop; not `dev` or `spark`) into the virtual environment
# /opt/skipmq, then drops pip and setuptools from it, strips the extension modules' debug symbols
# (uvloop's 13.6 MB loop.so becomes 1.6 MB) and compiles every module's bytecode (unchecked-hash:
# valid whatever the files' times, since a read-only root filesystem cannot cache it). Stage
# `runtime-root` is the base with the skipmq user (uid/gid 10001, the chart's runAsUser), trimmed
# by docker/slim-root.sh to what runs the broker (no apt, perl, debconf, user or mount tools, pip
# wheels, stdlib tests/IDLE/Tk/distutils; dpkg and its status stay) and checked against the venv.
# The final stage starts from scratch with that root and the venv: two layers, no compiler, no
# pip, no sources or tests. docs/operations.md "Image" has its layers.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends binutils \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY overlay ./overlay
COPY tools ./tools
# The optional secret build_ca is a CA bundle for pip to trust (a TLS-intercepting proxy's; the
# build script passes the host's): mounted for this step only, in no layer and no history.
RUN --mount=type=secret,id=build_ca \
    if [ -s /run/secrets/build_ca ]; then export PIP_CERT=/run/secrets/build_ca; fi \
    && python3 -m venv /opt/skipmq \
    && /opt/skipmq/bin/pip install --no-cache-dir --no-compile --disable-pip-version-check '.[fast]' \
    && /opt/skipmq/bin/pip uninstall -y -q pip setuptools \
    && rm /opt/skipmq/bin/skipmq-pipeline /opt/skipmq/bin/Activate.ps1 \
    && find /opt/skipmq -name '*.so' -exec strip --strip-unneeded {} + \
    && /opt/skipmq/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/skipmq/lib

FROM ${BASE_IMAGE} AS runtime-root
COPY --from=build /opt/skipmq /opt/skipmq
COPY docker/slim-root.sh /tmp/slim-root.sh
RUN groupadd --system --gid 10001 skipmq \
    && useradd --system --no-log-init --uid 10001 --gid 10001 --no-create-home \
       --home-dir /var/lib/skipmq --shell /usr/sbin/nologin skipmq \
    && mkdir -p /var/lib/skipmq /etc/skipmq \
    && chown skipmq:skipmq /var/lib/skipmq \
    && sh /tmp/slim-root.sh \
    && rm -rf /opt/skipmq /tmp/slim-root.sh

FROM scratch
COPY --from=runtime-root / /
COPY --from=build /opt/skipmq /opt/skipmq
COPY --chown=10001:10001 --from=runtime-root /var/lib/skipmq /var/lib/skipmq
COPY docker/skipmq.toml /etc/skipmq/skipmq.toml
# FROM scratch keeps none of the base's environment: PATH has both Debian's and python:3.11-slim's
# (/usr/local/bin) directories.
ENV PATH=/opt/skipmq/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    SKIPMQ_CONFIG=/etc/skipmq/skipmq.toml \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /var/lib/skipmq
VOLUME ["/var/lib/skipmq"]
# MQTT, MQTT over TLS, MQTT over WebSocket (listeners.*, the last two off by default), HTTP
# (/metrics, /healthz, /readyz, /cluster) and the cluster's gRPC port.
EXPOSE 1883 8883 8080 9090 7883
# /healthz on the HTTP port (SKIPMQ_HTTP_PORT if the container sets another one).
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('SKIPMQ_HTTP_PORT', '9090'), timeout=4)"]
ENTRYPOINT ["skipmq"]
