// The TypeScript SDK's OAuth client through the gateway: from a bare 401 through discovery,
// dynamic registration and the authorization code flow with PKCE (oidc-provider's login and
// consent pages played with fetch), to a tool call and a core task; then the access token
// expires, the SDK refreshes it on the gateway's 401, and the task's result is read with the
// new token. Prints one JSON transcript. Usage: node oauth.mjs URL WAIT_MS
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema, CreateTaskResultSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, waitMs] = process.argv.slice(2);
const REDIRECT = "http://localhost:3030/callback";

// A person at the login and consent pages: follow redirects, fill each form, keep cookies.
async function authorize(start) {
  const cookies = new Map();
  let target = start, method = "GET", body;
  for (let i = 0; i < 12; i++) {
    if (process.env.DEBUG_OAUTH) process.stderr.write(`${method} ${target} ${body ?? ""}\n`);
    const res = await fetch(target, {
      method, body, redirect: "manual",
      headers: {
        cookie: [...cookies].map(([k, v]) => `${k}=${v}`).join("; "),
        ...(body ? { "content-type": "application/x-www-form-urlencoded" } : {}),
      },
    });
    for (const c of res.headers.getSetCookie()) {
      const [pair] = c.split(";");
      const at = pair.indexOf("=");
      cookies.set(pair.slice(0, at), pair.slice(at + 1));
    }
    const location = res.headers.get("location");
    if (location) {
      target = new URL(location, target).href;
      method = "GET"; body = undefined;
      if (target.startsWith(REDIRECT)) {
        const code = new URL(target).searchParams.get("code");
        if (!code) throw new Error(`redirected back without a code: ${target}`);
        return code;
      }
      continue;
    }
    const page = await res.text();
    const action = page.match(/<form[^>]*action="([^"]+)"[^>]*method="post"/i);
    if (!action) throw new Error(`no form at ${target}: ${page.slice(0, 200)}`);
    const form = new URLSearchParams();
    for (const [, k, v] of page.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)"/gi)) form.set(k, v);
    if (page.includes('name="login"')) { form.set("login", "bob"); form.set("password", "any"); }
    target = new URL(action[1], target).href; method = "POST"; body = form.toString();
  }
  throw new Error("never redirected back");
}

class Provider {
  constructor() { this.seen = []; }
  get redirectUrl() { return REDIRECT; }
  get clientMetadata() {
    return { client_name: "ts-sdk-tests", redirect_uris: [REDIRECT], response_types: ["code"],
             grant_types: ["authorization_code", "refresh_token"], token_endpoint_auth_method: "none" };
  }
  clientInformation() { return this.client; }
  saveClientInformation(info) { this.client = info; }
  tokens() { return this.current; }
  saveTokens(tokens) { this.current = tokens; this.seen.push(tokens.access_token); }
  async redirectToAuthorization(authUrl) { this.code = await authorize(authUrl.href); }
  saveCodeVerifier(verifier) { this.verifier = verifier; }
  codeVerifier() { return this.verifier; }
}

const provider = new Provider();
const connect = async () => {
  const client = new Client({ name: "ts-sdk-oauth", version: "1.0.0" }, { capabilities: {} });
  const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider });
  await client.connect(transport);
  return [client, transport];
};
const out = {};
let client;
try {
  [client] = await connect();
  out.firstTry = "connected";
} catch (e) {
  if (!(e instanceof UnauthorizedError)) throw e;
  out.firstTry = "unauthorized";
  const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider });
  await transport.finishAuth(provider.code);
  [client] = await connect();
}
out.registered = Boolean(provider.client?.client_id);
out.echo = (await client.callTool({ name: "echo", arguments: { text: "ts authorized" } })).content[0].text;
const created = await client.request(
  { method: "tools/call", params: { name: "sleep", arguments: { ms: Number(waitMs) + 1000 }, task: {} } },
  CreateTaskResultSchema);
out.created = created.task.status;
const before = provider.seen.at(-1);
await new Promise((r) => setTimeout(r, Number(waitMs)));
const tasks = client.experimental.tasks;
let task;
for (let i = 0; i < 50; i++) {
  task = await tasks.getTask(created.task.taskId);
  if (task.status === "completed") break;
  await new Promise((r) => setTimeout(r, 200));
}
out.status = task.status;
out.result = (await tasks.getTaskResult(created.task.taskId, CallToolResultSchema)).content[0].text;
out.refreshed = provider.seen.at(-1) !== before;
process.stdout.write(JSON.stringify(out) + "\n");
await client.close();
