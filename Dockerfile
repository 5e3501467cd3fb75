# syntax=docker/dockerfile:1
# The gateway in front of Python or Node stdio servers. Build and run:
#   docker build -t mcp-task-gateway .
#   docker run -p 8080:8080 -v "$PWD/my.yaml:/etc/mcp-task-gateway/gateway.yaml:ro" mcp-task-gateway

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
RUN python -m venv /opt/gateway \
 && /opt/gateway/bin/pip install --no-cache-dir '.[otel]'

FROM node:22-bookworm-slim AS node

FROM python:3.11-slim
# Node and npm/npx, for servers started with npx.
COPY --from=node /usr/local/bin/node /usr/local/bin/node
COPY --from=node /usr/local/lib/node_modules /usr/local/lib/node_modules
RUN ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm \
 && ln -s ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx \
 && useradd --create-home --uid 10001 gateway
COPY --from=build /opt/gateway /opt/gateway
COPY config/docker.yaml /etc/mcp-task-gateway/gateway.yaml
ENV PATH=/opt/gateway/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 10001
WORKDIR /home/gateway
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=3s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz')"]
ENTRYPOINT ["mcp-task-gateway"]
CMD ["--config", "/etc/mcp-task-gateway/gateway.yaml"]
