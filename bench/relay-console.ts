/**
 * bench/relay-console.ts: a console for bench/mcp.ts's relayed rows, in its own process. It is
 * engine-cloud from source with a BENCH-ONLY token verifier (the authorization server is another
 * slice): one account, one pre-authorized link key and one `engine:operate` access token,
 * printed as one JSON line on stdout. It runs until SIGTERM.
 *
 * Usage: bun bench/relay-console.ts <data-dir>
 */
import { randomBytes } from "node:crypto";
import { resolveCloudConfig } from "../src/cloud/config";
import type { AccessTokenVerifier, AssistantGrant } from "../src/cloud/oauth/grant";
import { startCloud } from "../src/cloud/server";

const dataDir = process.argv[2];
if (!dataDir) throw new Error("usage: bun bench/relay-console.ts <data-dir>");
const token = `bench_at_${randomBytes(24).toString("base64url")}`;
let grant: AssistantGrant | undefined;
const verifier: AccessTokenVerifier = async (presented) =>
  presented === token && grant ? { ok: true, grant } : { ok: false, error: "invalid_token", description: "not the bench's token" };

const config = resolveCloudConfig(
  { dataDir, port: 0, databaseUrl: `sqlite://${dataDir}/cloud.db`, logLevel: "warn", logToStdout: false },
  {},
);
const cloud = await startCloud(config, { verifyAccessToken: verifier });
const account = await cloud.deps.accounts.add("bench@example.com");
grant = {
  accountId: account.id,
  clientId: "https://bench.example/client",
  grantId: "grant_bench",
  scopes: ["engine:operate"],
  nodeIds: null,
  expiresAt: new Date(Date.now() + 86_400_000),
};
const { token: session } = await cloud.deps.sessions.mint(account.id, "minted");
const minted = await fetch(`${cloud.url}/api/preauth-keys`, {
  method: "POST",
  headers: { authorization: `Bearer ${session}`, "content-type": "application/json" },
  body: "{}",
});
if (minted.status !== 201) throw new Error(`minting a key failed: ${minted.status} ${await minted.text()}`);
const { key } = (await minted.json()) as { key: string };
process.stdout.write(`${JSON.stringify({ url: cloud.url, key, token })}\n`);
process.on("SIGTERM", () => {
  void cloud.stop().then(() => process.exit(0));
});
