// The TypeScript SDK's experimental tasks API (protocol 2025-11-25 core tasks) through the
// gateway in front of tests/servers/basic.py; prints what a user would see as one JSON
// transcript. Usage: node tasks.mjs URL
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import {
  CallToolResultSchema,
  CreateTaskResultSchema,
  ElicitRequestSchema,
} from "@modelcontextprotocol/sdk/types.js";

const [url] = process.argv.slice(2);
const client = new Client(
  { name: "ts-sdk-tasks", version: "1.0.0" },
  { capabilities: { elicitation: {} } },
);
const out = { asked: [] };
client.setRequestHandler(ElicitRequestSchema, async (req) => {
  out.asked.push([req.params.message, req.params._meta?.["io.modelcontextprotocol/related-task"]?.taskId ?? null]);
  return { action: "accept", content: { name: "Ada" } };
});
const text = (r) => r.content.map((c) => c.text ?? c.type).join("\n");
const tasks = client.experimental.tasks;
const errorOf = async (promise) => {
  try { await promise; return null; } catch (e) { return e.code ?? String(e); }
};

const create = (name, args, task = {}) => client.request(
  { method: "tools/call", params: { name, arguments: args, task } }, CreateTaskResultSchema);

async function stream(name, args) {
  const seen = [];
  for await (const m of tasks.callToolStream({ name, arguments: args }, CallToolResultSchema)) {
    if (m.type === "taskCreated") seen.push(["created", m.task.status, m.task.ttl]);
    else if (m.type === "taskStatus") seen.push(["status", m.task.status]);
    else if (m.type === "result") seen.push(["result", text(m.result), m.result._meta?.["io.modelcontextprotocol/related-task"]?.taskId ? "related" : "unrelated"]);
    else seen.push(["error", m.error.message]);
  }
  return seen;
}

await client.connect(new StreamableHTTPClientTransport(new URL(url)));
out.capabilities = client.getServerCapabilities().tasks;
out.support = Object.fromEntries((await client.listTools()).tools.map((t) => [t.name, t.execution?.taskSupport]));
out.sleep = await stream("sleep", { ms: 300 });
out.ask = await stream("ask", { message: "Name?" });
out.failed = await stream("blob", { bytes: "many" });

// Created by hand: a task, its result before completion, and its status after.
const slow = await create("sleep", { ms: 400 }, { ttl: 30000 });
out.early = text(await tasks.getTaskResult(slow.task.taskId, CallToolResultSchema));
out.after = (await tasks.getTask(slow.task.taskId)).status;

// Cancel while running, then after completion.
const long = await create("sleep", { ms: 5000 });
out.cancelled = (await tasks.cancelTask(long.task.taskId)).status;
out.cancelAgain = await errorOf(tasks.cancelTask(long.task.taskId));
out.cancelDone = await errorOf(tasks.cancelTask(slow.task.taskId));
out.unknown = await errorOf(tasks.getTask("no-such-task"));

// More tasks than one page of tasks/list.
out.forbidden = await errorOf(create("echo", { text: "x" }));
for (let i = 0; i < 52; i++) await create("sleep", { ms: 0 });
const pages = [];
let cursor;
do {
  const page = await tasks.listTasks(cursor);
  pages.push(page.tasks.length);
  cursor = page.nextCursor;
} while (cursor);
out.pages = pages;
await client.close();
console.log(JSON.stringify(out));
