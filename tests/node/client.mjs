// The official TypeScript SDK client through an MCP endpoint; prints what a user would see as
// one JSON transcript. Usage: node client.mjs URL fixture|everything
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import {
  CallToolResultSchema,
  CreateMessageRequestSchema,
  ElicitRequestSchema,
} from "@modelcontextprotocol/sdk/types.js";

const [url, plan] = process.argv.slice(2);
const client = new Client(
  { name: "ts-sdk-test", version: "1.0.0" },
  { capabilities: { elicitation: {}, sampling: {} } },
);
const out = { asked: [], progress: [] };
client.setRequestHandler(ElicitRequestSchema, async (req) => {
  out.asked.push(req.params.message);
  return { action: "accept", content: { response: "yes", name: "Ada" } };
});
client.setRequestHandler(CreateMessageRequestSchema, async (req) => {
  out.asked.push(req.params.messages[0].content.text);
  return { role: "assistant", model: "test-model", content: { type: "text", text: "42" } };
});
const onprogress = (p) => out.progress.push([p.progress, p.total ?? null]);
const text = (r) => r.content.map((c) => c.text ?? c.type).join("\n");

await client.connect(new StreamableHTTPClientTransport(new URL(url)));
out.server = client.getServerVersion().name;
out.tools = (await client.listTools()).tools.map((t) => t.name).sort();
if (plan === "fixture") {
  out.text = text(await client.callTool({ name: "test_simple_text", arguments: {} }));
  out.progressResult = text(await client.callTool(
    { name: "test_tool_with_progress", arguments: {} }, undefined, { onprogress }));
  out.elicit = text(await client.callTool({ name: "test_elicitation", arguments: { message: "Proceed?" } }));
  out.sample = text(await client.callTool({ name: "test_sampling", arguments: { prompt: "6 x 7?" } }));
  out.prompts = (await client.listPrompts()).prompts.map((p) => p.name).sort();
  out.prompt = (await client.getPrompt({ name: "test_prompt_with_arguments", arguments: { arg1: "a", arg2: "b" } }))
    .messages[0].content.text;
  out.resources = (await client.listResources()).resources.map((r) => r.uri).sort();
  out.resource = (await client.readResource({ uri: "test://static-text" })).contents[0].text;
} else {
  out.longRunning = text(await client.callTool(
    { name: "trigger-long-running-operation", arguments: { duration: 1, steps: 4 } },
    undefined, { onprogress }));
  out.elicit = text(await client.callTool({ name: "trigger-elicitation-request", arguments: {} }));
  out.sample = text(await client.callTool(
    { name: "trigger-sampling-request", arguments: { prompt: "6 x 7?", maxTokens: 10 } }));
  out.prompts = (await client.listPrompts()).prompts.map((p) => p.name).sort();
  out.resourceCount = (await client.listResources()).resources.length;
  // A tool the server runs only as a task of its own (2025-11-25 core tasks).
  out.research = [];
  for await (const m of client.experimental.tasks.callToolStream(
    { name: "simulate-research-query", arguments: { topic: "tides" } }, CallToolResultSchema)) {
    out.research.push(m.type === "result" ? text(m.result) : m.type === "error" ? `error: ${m.error.message}` : m.type);
  }
}
await client.close();
console.log(JSON.stringify(out));
