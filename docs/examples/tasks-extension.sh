#!/bin/sh
# A modern client (protocol 2026-07-28) using the tasks extension, with curl, against the
# gateway's default configuration (server-everything behind it). Run:
#   GATEWAY_URL=http://127.0.0.1:8080/mcp sh docs/examples/tasks-extension.sh
set -eu
GATEWAY_URL=${GATEWAY_URL:-http://127.0.0.1:8080/mcp}
# Every modern request carries its envelope in _meta; declaring the extension is what lets
# the gateway answer a slow call with a task.
META='"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
  "io.modelcontextprotocol/clientCapabilities":
    {"extensions": {"io.modelcontextprotocol/tasks": {}}}}'

post() {  # METHOD NAME PARAMS: one request; Mcp-Method and Mcp-Name mirror the body
  curl -sS "$GATEWAY_URL" -H 'Content-Type: application/json' \
    -H 'Accept: application/json, text/event-stream' -H 'MCP-Protocol-Version: 2026-07-28' \
    -H "Mcp-Method: $1" -H "Mcp-Name: $2" \
    -d "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"$1\", \"params\": {$3, $META}}"
}

# 1. A call that runs longer than sync_budget_ms (1 s by default) is answered at once with
#    a task: {"resultType": "task", "taskId": "...", "status": "working", ...}
CREATED=$(post tools/call trigger-long-running-operation \
  '"name": "trigger-long-running-operation", "arguments": {"duration": 3, "steps": 3}')
echo "created: $CREATED"
TASK=$(echo "$CREATED" | sed -n 's/.*"taskId":"\([^"]*\)".*/\1/p')

# 2. Poll tasks/get (no more often than pollIntervalMs) until the task ends; its status
#    message follows the server's progress ("2/3: ..."), and the final answer inlines the
#    tool's result.
while :; do
  TASK_NOW=$(post tasks/get "$TASK" "\"taskId\": \"$TASK\"")
  case "$TASK_NOW" in
    *'"status":"working"'* | *'"status":"input_required"'*) echo "polled: $TASK_NOW"; sleep 1 ;;
    *) break ;;
  esac
done
echo "ended: $TASK_NOW"
