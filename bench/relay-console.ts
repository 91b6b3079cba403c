/**
 * bench/relay-console.ts: a console for bench/mcp.ts's relayed rows, in its own process. It is
 * engine-cloud from source with its own authorization server: one account with the remote-link
 * entitlement, one pre-authorized link key, and one `engine:operate` access token issued the way
 * an assistant gets one (PKCE authorization as the pre-registered Claude client, the consent
 * decision, the code exchanged at /oauth/token), so every relayed call meets the real token
 * check. It prints `{url, key, token}` as one JSON line on stdout and runs until SIGTERM.
 *
 * Usage: bun bench/relay-console.ts <data-dir>
 */
import { createHash, randomBytes } from "node:crypto";
import { resolveCloudConfig } from "../src/cloud/config";
import { startCloud } from "../src/cloud/server";

const dataDir = process.argv[2];
if (!dataDir) throw new Error("usage: bun bench/relay-console.ts <data-dir>");

const config = resolveCloudConfig(
  { dataDir, port: 0, databaseUrl: `sqlite://${dataDir}/cloud.db`, logLevel: "warn", logToStdout: false },
  {},
);
const cloud = await startCloud(config);
const account = await cloud.deps.accounts.add("bench@example.com", { remoteLink: true });
const { token: session } = await cloud.deps.sessions.mint(account.id, "minted");

/** post sends JSON (or a form) to the console and answers the parsed body, failing on another status. */
async function post(path: string, body: unknown, status: number, form = false): Promise<Record<string, unknown>> {
  const response = await fetch(`${cloud.url}${path}`, {
    method: "POST",
    headers: form
      ? { "content-type": "application/x-www-form-urlencoded" }
      : { authorization: `Bearer ${session}`, "content-type": "application/json" },
    body: form ? new URLSearchParams(body as Record<string, string>).toString() : JSON.stringify(body),
  });
  const text = await response.text();
  if (response.status !== status) throw new Error(`POST ${path} answered ${response.status}: ${text}`);
  return JSON.parse(text);
}

const { key } = await post("/api/preauth-keys", {}, 201);

// The access token, as an assistant gets one: PKCE authorization, the person's consent, the exchange.
const client = { client_id: "engine-claude", redirect_uri: "https://claude.ai/api/mcp/auth_callback" };
const resource = `${cloud.deps.site.publicUrl}/mcp`;
const verifier = randomBytes(32).toString("base64url");
const authorize = await fetch(
  `${cloud.url}/oauth/authorize?${new URLSearchParams({
    ...client,
    response_type: "code",
    code_challenge: createHash("sha256").update(verifier).digest("base64url"),
    code_challenge_method: "S256",
    scope: "engine:operate",
    state: "bench",
    resource,
  })}`,
  { redirect: "manual" },
);
const rid = new URL(authorize.headers.get("location") ?? "", cloud.url).searchParams.get("rid");
if (authorize.status !== 302 || !rid) throw new Error(`the authorization request answered ${authorize.status}`);
const decided = await post("/api/oauth/authorize/decision", { rid, approve: true, access: "operate" }, 200);
const code = new URL(decided.redirect_to as string).searchParams.get("code") ?? "";
const tokens = await post(
  "/oauth/token",
  { ...client, grant_type: "authorization_code", code, code_verifier: verifier, resource },
  200,
  true,
);

process.stdout.write(`${JSON.stringify({ url: cloud.url, key, token: tokens.access_token })}\n`);
process.on("SIGTERM", () => {
  void cloud.stop().then(() => process.exit(0));
});
