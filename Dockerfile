# syntax=docker/dockerfile:1
# The SkipMQ broker image (the default image of helm/skipmq). Build from the repository root:
#
#   docker build -t skipmq:0.1.0 .
#
# Stage 1 builds wheels for SkipMQ and every dependency once (uvloop included: the `fast` extra);
# stage 2 installs only those wheels, without compilers, pip cache or sources, and runs as the
# unprivileged user skipmq (uid/gid 10001, the chart's runAsUser). docs/operations.md "Image".
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS wheels
WORKDIR /src
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY overlay ./overlay
COPY tools ./tools
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[fast]'

FROM python:${PYTHON_VERSION}-slim
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels 'skipmq[fast]' \
    && groupadd --system --gid 10001 skipmq \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/skipmq \
       --shell /usr/sbin/nologin skipmq \
    && mkdir -p /var/lib/skipmq /etc/skipmq \
    && chown skipmq:skipmq /var/lib/skipmq
COPY docker/skipmq.toml /etc/skipmq/skipmq.toml
ENV SKIPMQ_CONFIG=/etc/skipmq/skipmq.toml \
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
