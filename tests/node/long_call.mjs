// One long tools/call with the official TypeScript SDK, as a user who lets progress keep the
// request alive: `timeout` ms of silence fails it unless a progress notification resets
// the timer (resetTimeoutOnProgress). Prints {text, progress: [[value, total, message]...]}
// or {error}. Usage: node long_call.mjs URL TOOL ARGS_JSON TIMEOUT_MS
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, tool, args, timeout] = process.argv.slice(2);
const client = new Client({ name: "ts-long-call", version: "1.0.0" });
const out = { progress: [] };
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const started = Date.now();
try {
  const result = await client.callTool({ name: tool, arguments: JSON.parse(args) }, undefined, {
    timeout: Number(timeout),
    resetTimeoutOnProgress: true,
    onprogress: (p) => out.progress.push([p.progress, p.total ?? null, p.message ?? null]),
  });
  out.text = result.content.map((c) => c.text ?? c.type).join("\n");
} catch (err) {
  out.error = String(err.message ?? err);
}
out.seconds = (Date.now() - started) / 1000;
await client.close();
console.log(JSON.stringify(out));
