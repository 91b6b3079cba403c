import { afterAll, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { eventually, freePort, REPO_ROOT, runCli, tempDir } from "../helpers";

const CLOUD_ENTRY = [process.execPath, join(REPO_ROOT, "cli", "cloud.ts")];
const dataDir = tempDir("engine-cloud-cli-");
const cloud = (...args: string[]) => runCli(["--data-dir", dataDir, ...args], {}, CLOUD_ENTRY);

afterAll(() => rmSync(dataDir, { recursive: true, force: true }));

test("accounts add, set and list change what the console enforces", async () => {
  const added = await cloud("--json", "accounts", "add", "Ops@Example.com", "--node-limit", "2");
  expect(added.code).toBe(0);
  expect(JSON.parse(added.stdout)).toMatchObject({ email: "ops@example.com", nodeLimit: 2, standing: "active", paid: false });
  const again = await cloud("accounts", "add", "ops@example.com");
  expect(again.code).toBe(1);
  expect(again.stderr).toContain("[conflict]");
  const set = await cloud("--json", "accounts", "set", "ops@example.com", "--standing", "suspended", "--paid", "on", "--remote-link", "on");
  expect(set.code).toBe(0);
  expect(JSON.parse(set.stdout)).toMatchObject({ standing: "suspended", paid: true, remoteLink: true });
  const bad = await cloud("accounts", "set", "ops@example.com", "--node-limit", "many");
  expect(bad.code).toBe(1);
  expect(bad.stderr).toContain("whole number");
  const missing = await cloud("accounts", "set", "nobody@example.com", "--paid", "on");
  expect(missing.stderr).toContain("[account_not_found]");
  const list = await cloud("accounts", "list");
  expect(list.stdout).toContain("ops@example.com  suspended  paid remote-link");
});

test("sessions mint prints a token as its last line, and a running console accepts it", async () => {
  const minted = await cloud("sessions", "mint", "--email", "dev@example.com", "--create");
  expect(minted.code).toBe(0);
  const token = minted.stdout.trim().split("\n").at(-1) as string;
  expect(token).toMatch(/^ecs_[A-Za-z0-9_-]{43}$/);
  expect(minted.stderr).not.toContain(token);
  const refused = await cloud("sessions", "mint", "--email", "ghost@example.com");
  expect(refused.code).toBe(1);
  expect(refused.stderr).toContain("[account_not_found]");

  const port = await freePort();
  const server = Bun.spawn([...CLOUD_ENTRY, "--data-dir", dataDir, "serve", "--port", String(port), "--log-level", "warn"], {
    stdout: "ignore",
    stderr: "pipe",
  });
  try {
    const session = await eventually(
      async () => {
        const answer = await fetch(`http://127.0.0.1:${port}/api/auth/session`, { headers: { authorization: `Bearer ${token}` } });
        return answer.status === 200 ? ((await answer.json()) as { account: { email: string } }) : null;
      },
      { timeoutMs: 15_000, intervalMs: 100 },
    );
    expect(session.account.email).toBe("dev@example.com");
  } finally {
    server.kill("SIGTERM");
    expect(await server.exited).toBe(0);
  }
});

test("a bad setting stops the console with the field's name", async () => {
  const bad = await cloud("serve", "--port", "70000");
  expect(bad.code).toBe(1);
  expect(bad.stderr).toContain("config: port");
  const role = await runCli(["--data-dir", dataDir, "serve", "--port", "0"], { ENGINE_CLOUD_ROLE: "gateway" }, CLOUD_ENTRY);
  expect(role.stderr).toContain("config: role");
});
