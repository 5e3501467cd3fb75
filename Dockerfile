# The gateway in front of Python or Node stdio servers. Build (docker or podman; it makes
# the base images itself where no registry is reachable) and run:
#   scripts/image.sh
#   docker run -p 8080:8080 -v "$PWD/my.yaml:/etc/mcp-task-gateway/gateway.yaml:ro" mcp-task-gateway

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
# A CA bundle for an intercepting proxy is a build secret (scripts/image.sh passes the
# host's): mounted for this step only, never in a layer.
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && python -m venv /opt/gateway \
 && /opt/gateway/bin/pip install --no-cache-dir --disable-pip-version-check '.[otel]' \
 && /opt/gateway/bin/pip uninstall --yes --quiet pip setuptools

FROM node:22-bookworm-slim AS node

FROM python:3.11-slim
# Node and npm/npx, for servers started with npx.
COPY --from=node /usr/local/bin/node /usr/local/bin/node
COPY --from=node /usr/local/lib/node_modules /usr/local/lib/node_modules
RUN ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm \
 && ln -s ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx \
 && useradd --create-home --uid 10001 gateway \
 && install -d -o gateway -g gateway -m 0700 /var/lib/mcp-task-gateway
# Finished tasks across a restart (store.snapshot_path of config/docker.yaml): a volume the
# gateway's user owns, so that a named volume mounted there (-v gateway-data:/var/lib/...)
# starts as its own. Made and owned above: what a step changes under a VOLUME is dropped.
VOLUME /var/lib/mcp-task-gateway
COPY --from=build /opt/gateway /opt/gateway
COPY config/docker.yaml /etc/mcp-task-gateway/gateway.yaml
ENV PATH=/opt/gateway/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 10001
WORKDIR /home/gateway
EXPOSE 8080
# Probes the port the configuration serves: GATEWAY_PORT, as config/docker.yaml reads it.
HEALTHCHECK --interval=30s --timeout=3s \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('GATEWAY_PORT', '8080'), timeout=2)"]
ENTRYPOINT ["mcp-task-gateway"]
CMD ["--config", "/etc/mcp-task-gateway/gateway.yaml"]
