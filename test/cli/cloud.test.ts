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

test("operators keep places, invoices, seats and trial places for hosted machines", async () => {
  const places = await cloud("--json", "places", "--launch", "2");
  expect(places.code).toBe(0);
  expect(JSON.parse(places.stdout).launch).toEqual({ places: 2, seats: 0, open_invoices: 0, free: 2 });
  expect((await cloud("accounts", "add", "buyer@example.com")).code).toBe(0);
  const opened = await cloud("--json", "invoices", "open", "buyer@example.com", "--amount", "EUR 90");
  expect(opened.code).toBe(0);
  const invoice = JSON.parse(opened.stdout) as { id: string; state: string };
  expect(invoice.state).toBe("open");
  expect((await cloud("places")).stdout).toContain("launch places 2: 0 seats held + 1 open invoices, 1 free");
  expect((await cloud("invoices")).stdout).toContain(`${invoice.id}  buyer@example.com  open  EUR 90`);
  expect((await cloud("invoices", "paid", invoice.id)).stdout).toContain("paid: the account holds a seat");
  const again = await cloud("invoices", "void", invoice.id);
  expect(again.code).toBe(1);
  expect(again.stderr).toContain("[invoice_not_found]");
  expect((await cloud("seats")).stdout).toContain("buyer@example.com");
  expect((await cloud("seats", "release", "buyer@example.com")).stdout).toContain("no longer holds a seat");
  const trials = await cloud("--json", "trials", "--places", "3");
  expect(JSON.parse(trials.stdout)).toMatchObject({ places: 3, running: 0, free: 3, boxes: [] });
  expect((await cloud("places", "--launch", "many")).stderr).toContain("whole number");
  expect((await cloud("boxes")).stdout).toContain("no hosted machines");
  expect((await cloud("boxes", "restore", "bak_missing")).stderr).toContain("[not_found]");
});
