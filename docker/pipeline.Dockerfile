# syntax=docker/dockerfile:1
# The data pipeline's image (skipmq-pipeline, Spark in local mode; the chart's pipeline.image).
# Build from the repository root (BuildKit reads docker/pipeline.Dockerfile.dockerignore):
#
#   docker build -f docker/pipeline.Dockerfile -t skipmq-pipeline:0.1.0 .
#
# Java 17 (PySpark 4 needs 17+) from Debian, SkipMQ with the `spark` extra built as wheels in the
# first stage; runs as the same unprivileged uid/gid 10001 as the broker. docs/pipeline.md.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS wheels
WORKDIR /src
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY overlay ./overlay
COPY tools ./tools
COPY pipeline ./pipeline
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[spark]'

FROM python:${PYTHON_VERSION}-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels 'skipmq[spark]' \
    && groupadd --system --gid 10001 skipmq \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
       --shell /usr/sbin/nologin skipmq \
    && mkdir -p /var/lib/skipmq-pipeline && chown skipmq:skipmq /var/lib/skipmq-pipeline
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /var/lib/skipmq-pipeline
VOLUME ["/var/lib/skipmq-pipeline"]
ENTRYPOINT ["skipmq-pipeline"]
