# The broker image used by helm/skipmq. Build: docker build -t skipmq:0.1.0 .
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY overlay ./overlay
COPY tools ./tools
RUN pip install --no-cache-dir '.[fast]'
EXPOSE 1883 9090
ENTRYPOINT ["skipmq"]
