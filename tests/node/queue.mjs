// The TypeScript SDK's experimental tasks API (protocol 2025-11-25 core tasks) against a tool
// that runs one call at a time behind the gateway's queue: three tasks at once, the third
// cancelled while it waits; prints what a user would see as one JSON transcript.
// Usage: node queue.mjs URL
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema, CreateTaskResultSchema } from "@modelcontextprotocol/sdk/types.js";

const [url] = process.argv.slice(2);
const client = new Client({ name: "ts-sdk-queue", version: "1.0.0" }, { capabilities: {} });
const tasks = client.experimental.tasks;
const text = (r) => r.content.map((c) => c.text ?? c.type).join("\n");
const create = (t) => client.request(
  { method: "tools/call", params: { name: "render", arguments: { text: t, ms: 400 }, task: {} } },
  CreateTaskResultSchema);

await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const created = [];
for (const t of ["a", "b", "c"]) created.push(await create(t));
const ids = created.map((c) => c.task.taskId);
const out = { created: created.map((c) => c.task.statusMessage ?? null) };
out.cancelled = (await tasks.cancelTask(ids[2])).status;
out.results = [];
for (const id of ids.slice(0, 2)) out.results.push(text(await tasks.getTaskResult(id, CallToolResultSchema)));
out.rendered = JSON.parse(text(await client.callTool({ name: "rendered", arguments: {} })));
console.log(JSON.stringify(out));
await client.close();
