// One tools/call with the official TypeScript SDK under an Idempotency-Key (docs/clients.md:
// the key in the transport's request headers), given up after TIMEOUT_MS. Prints {text} or
// {error}. Usage: node keyed_call.mjs URL TOKEN KEY TOOL ARGS_JSON TIMEOUT_MS
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token, key, tool, args, timeout] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}`, "Idempotency-Key": key } },
});
const client = new Client({ name: "ts-keyed-call", version: "1.0.0" });
await client.connect(transport);
const out = {};
try {
  const result = await client.callTool({ name: tool, arguments: JSON.parse(args) }, undefined,
                                       { timeout: Number(timeout) });
  out.text = result.content.map((c) => c.text ?? c.type).join("\n");
} catch (err) {
  out.error = String(err.message ?? err);
}
await client.close();
console.log(JSON.stringify(out));
