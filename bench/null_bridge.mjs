// An MCP Streamable HTTP endpoint in Node with no server behind it: it answers `echo`,
// `blob` and `sleep` itself. What the host and the load generator allow any bridge, in any
// language (bench/README.md, "ceiling"); node's own http module, nothing installed.
//
//     node bench/null_bridge.mjs 9108
import http from "node:http";

const port = Number(process.argv[2] ?? 9108);
const headers = { "content-type": "application/json", "mcp-session-id": "null" };

function answer(msg) {
  if (msg.method === "initialize") {
    return { protocolVersion: msg.params.protocolVersion, capabilities: { tools: {} },
             serverInfo: { name: "null", version: "1" } };
  }
  if (msg.method === "tools/list") {
    return { tools: ["echo", "blob", "sleep"].map((name) => ({ name, inputSchema: { type: "object" } })) };
  }
  const a = msg.params.arguments;
  const text = { echo: () => a.text, blob: () => "b".repeat(a.bytes),
                 sleep: () => `slept ${a.ms}` }[msg.params.name]();
  return { content: [{ type: "text", text }], isError: false };
}

http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    if (req.method !== "POST") { res.writeHead(405, headers).end(); return; }
    const msg = JSON.parse(Buffer.concat(chunks));
    if (msg.id === undefined) { res.writeHead(202, headers).end(); return; }
    const reply = () => res.writeHead(200, headers).end(
      JSON.stringify({ jsonrpc: "2.0", id: msg.id, result: answer(msg) }));
    if (msg.params?.name === "sleep") setTimeout(reply, msg.params.arguments.ms);
    else reply();
  });
}).listen(port, "127.0.0.1");
