#!/bin/sh
# A legacy client on protocol 2025-11-25 using core tasks, with curl, against the gateway's
# default configuration (server-everything behind it). Run:
#   GATEWAY_URL=http://127.0.0.1:8080/mcp sh docs/examples/core-tasks.sh
set -eu
GATEWAY_URL=${GATEWAY_URL:-http://127.0.0.1:8080/mcp}
HEADERS=$(mktemp)
trap 'rm -f "$HEADERS"' EXIT

post() {  # BODY: one request of the session (after initialize)
  curl -sS "$GATEWAY_URL" -H 'Content-Type: application/json' \
    -H 'Accept: application/json, text/event-stream' -H 'MCP-Protocol-Version: 2025-11-25' \
    -H "Mcp-Session-Id: $SESSION" -d "$1"
}

# 1. initialize at 2025-11-25: the answer declares capabilities.tasks, and the session id
#    comes in the Mcp-Session-Id header.
curl -sS "$GATEWAY_URL" -D "$HEADERS" -o /dev/null -H 'Content-Type: application/json' \
  -H 'Accept: application/json, text/event-stream' \
  -d '{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "curl", "version": "1"}}}'
SESSION=$(sed -n 's/^[Mm]cp-[Ss]ession-[Ii]d: *\([^[:space:]]*\).*/\1/p' "$HEADERS")
post '{"jsonrpc": "2.0", "method": "notifications/initialized"}'

# 2. Here the client decides: params.task asks for a task (ttl optional); the answer comes
#    at once: {"result": {"task": {"taskId": "...", "status": "working", ...}}}
CREATED=$(post '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
  "name": "trigger-long-running-operation", "arguments": {"duration": 3, "steps": 3},
  "task": {"ttl": 60000}}}')
echo "created: $CREATED"
TASK=$(echo "$CREATED" | sed -n 's/.*"taskId":"\([^"]*\)".*/\1/p')

# 3. tasks/get tells the status; tasks/result waits for the end and returns exactly what
#    the call returned.
post "{\"jsonrpc\": \"2.0\", \"id\": 2, \"method\": \"tasks/get\", \"params\": {\"taskId\": \"$TASK\"}}"
echo
echo "result: $(post "{\"jsonrpc\": \"2.0\", \"id\": 3, \"method\": \"tasks/result\",
  \"params\": {\"taskId\": \"$TASK\"}}")"
