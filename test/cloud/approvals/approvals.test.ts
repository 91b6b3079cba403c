import { afterAll, beforeAll, expect, test } from "bun:test";
import { describeEachDialect } from "../helpers";
import { type LinkTestCloud, startLinkCloud } from "../link/helpers";

describeEachDialect("device approvals", (dialect) => {
  let link: LinkTestCloud;
  beforeAll(async () => {
    link = await startLinkCloud(dialect);
  });
  afterAll(async () => {
    await link?.cloud.close();
  });

  const call = (route: "lookup" | "approve" | "deny", token: string | undefined, userCode: unknown, address = link.source()) =>
    link.cloud.api("POST", `/api/nodes/device-approvals/${route}`, { token, body: { user_code: userCode }, headers: link.from(address) });
  const attemptsLeft = async (deviceCode: string) => {
    const [row] = await link.cloud.deps.db.sql`SELECT attempts_left FROM device_requests WHERE id = ${deviceCode.split(".")[0]}`;
    return Number(row.attempts_left);
  };

  test("lookup shows the pending request: reported strings unverified, the source, the times and attempts; it spends nothing", async () => {
    const { token } = await link.cloud.signIn("lookup@example.com");
    const address = link.source();
    const requested = await link.cloud.api("POST", "/api/link/device", {
      body: { hostname: "shown\u202e-box", os: "Ubuntu 24.04", version: "0.6.0" },
      headers: link.from(address),
    });
    const { user_code, device_code } = requested.body;
    for (let i = 0; i < 3; i++) {
      const view = await call("lookup", token, user_code);
      expect(view.status).toBe(200);
      expect(view.body).toEqual({
        user_code,
        state: "pending",
        reported: { hostname: "shown-box", os: "Ubuntu 24.04", version: "0.6.0", verified: false },
        source_address: address,
        requested_at: new Date(link.clock.read()).toISOString(),
        expires_at: new Date(link.clock.read() + 900_000).toISOString(),
        attempts_left: 5,
      });
    }
    expect(await attemptsLeft(device_code)).toBe(5);
  });

  test.each([
    ["lower case", (code: string) => code.toLowerCase()],
    ["no dash", (code: string) => code.replace("-", "")],
    ["spaces", (code: string) => ` ${code.slice(0, 4)} ${code.slice(5)} `],
  ])("the user code may be typed with %s", async (_label, typed) => {
    const { token } = await link.cloud.signIn("lookup@example.com");
    const { user_code } = await link.requestDevice();
    const view = await call("lookup", token, typed(user_code));
    expect(view.status).toBe(200);
    expect(view.body.user_code).toBe(user_code);
  });

  test.each([
    ["an unknown code", "BCDF-GHJK"],
    ["a malformed code", "AAAA-1111"],
    ["an empty code", "-"],
  ])("lookup, approve and deny of %s answer 404", async (_label, userCode) => {
    const { token } = await link.cloud.signIn("lookup@example.com");
    for (const route of ["lookup", "approve", "deny"] as const) {
      const answer = await call(route, token, userCode);
      expect(answer.status).toBe(404);
      expect(answer.body.error.code).toBe("device_request_not_found");
    }
  });

  test("every route needs a session: 401 even before the body is validated", async () => {
    const { user_code } = await link.requestDevice();
    for (const route of ["lookup", "approve", "deny"] as const) {
      expect((await call(route, undefined, user_code)).status).toBe(401);
      expect((await call(route, undefined, 12345)).status).toBe(401);
      expect((await call(route, "ecs_forged", user_code)).status).toBe(401);
    }
    const { token } = await link.cloud.signIn("lookup@example.com");
    expect((await call("lookup", token, 12345)).status).toBe(422);
    expect((await call("approve", token, "X".repeat(33))).status).toBe(422);
  });

  test("lookup is limited per session (20) and per address (30), charged first", async () => {
    const { token } = await link.cloud.signIn("lookup-limits@example.com");
    const bySession = [];
    for (let i = 0; i < 21; i++) bySession.push((await call("lookup", token, "BCDF-GHJK")).status);
    expect(bySession).toEqual([...Array(20).fill(404), 429]);
    const address = link.source();
    const byAddress = [];
    for (let i = 0; i < 31; i++) {
      // A fresh session each time, so only the address's bucket empties.
      const session = await link.cloud.signIn("lookup-limits@example.com");
      byAddress.push((await call("lookup", session.token, "BCDF-GHJK", address)).status);
    }
    expect(byAddress).toEqual([...Array(30).fill(404), 429]);
  });

  test("approve enrolls the machine: 200 DeviceApprovalGrant, the row names the account and node, an audit row", async () => {
    const { token, accountId } = await link.cloud.signIn("approve@example.com");
    const { user_code, device_code } = await link.requestDevice({ hostname: "granted-box.local" });
    const grant = await call("approve", token, user_code);
    expect(grant.status).toBe(200);
    expect(grant.body).toEqual({ approved: true, node_id: expect.stringMatching(/^node_/), slug: "granted-box", adopted: false });
    const [row] = await link.cloud.deps.db.sql`SELECT * FROM device_requests WHERE id = ${device_code.split(".")[0]}`;
    expect(row).toMatchObject({ state: "approved", account_id: accountId, node_id: grant.body.node_id });
    expect(Number(row.attempts_left)).toBe(4);
    const audit = await link.cloud.deps.audit.list(accountId);
    const approved = audit.find((entry) => entry.action === "device_link.approved");
    expect(approved).toMatchObject({ subject: row.id });
    expect(JSON.parse(approved?.details as string)).toEqual({ node_id: grant.body.node_id, slug: "granted-box", adopted: false });
    expect(JSON.stringify(audit)).not.toContain(user_code);
    // Decided: no longer pending, so lookup is 404, and deciding again is a 409 that spends nothing.
    expect((await call("lookup", token, user_code)).status).toBe(404);
    const again = await call("approve", token, user_code);
    expect(again.status).toBe(409);
    expect(again.body.error.code).toBe("conflict");
    expect((await call("deny", token, user_code)).status).toBe(409);
    expect(await attemptsLeft(device_code)).toBe(4);
  });

  test("approving a hostname the account already has adopts that node", async () => {
    const { token } = await link.cloud.signIn("adopt@example.com");
    const first = await call("approve", token, (await link.requestDevice({ hostname: "same-box" })).user_code);
    const second = await call("approve", token, (await link.requestDevice({ hostname: "SAME-BOX.lan" })).user_code);
    expect(second.body).toMatchObject({ approved: true, node_id: first.body.node_id, adopted: true });
  });

  test("deny answers 200 DeviceDenial, spends an attempt and writes an audit row; the poll then says access_denied", async () => {
    const { token, accountId } = await link.cloud.signIn("deny@example.com");
    const { user_code, device_code } = await link.requestDevice();
    const denied = await call("deny", token, user_code);
    expect(denied.status).toBe(200);
    expect(denied.body).toEqual({ denied: true });
    expect(await attemptsLeft(device_code)).toBe(4);
    expect((await link.cloud.deps.audit.list(accountId)).some((entry) => entry.action === "device_link.denied")).toBe(true);
    expect((await link.poll(device_code)).body.error.code).toBe("access_denied");
  });

  test("a suspended account may not approve (403) and the attempt stays spent; it may still deny", async () => {
    const { token } = await link.cloud.signIn("suspended@example.com", { standing: "suspended" });
    const { user_code, device_code } = await link.requestDevice();
    const refused = await call("approve", token, user_code);
    expect(refused.status).toBe(403);
    expect(refused.body.error.code).toBe("account_suspended");
    expect(await attemptsLeft(device_code)).toBe(4);
    const [row] = await link.cloud.deps.db.sql`SELECT state, node_id FROM device_requests WHERE id = ${device_code.split(".")[0]}`;
    expect(row).toMatchObject({ state: "pending", node_id: null });
    expect((await call("deny", token, user_code)).status).toBe(200);
  });

  test("the budget: five decisions per code, refused ones included; then 403 user_code_attempts_exhausted", async () => {
    const { token, accountId } = await link.cloud.signIn("full@example.com", { nodeLimit: 0 });
    const { user_code, device_code } = await link.requestDevice({ hostname: "one-too-many" });
    for (let i = 0; i < 5; i++) {
      const refused = await call("approve", token, user_code);
      expect(refused.status).toBe(403);
      expect(refused.body.error.code).toBe("node_limit_reached");
    }
    expect(await attemptsLeft(device_code)).toBe(0);
    // Raising the limit does not refill the budget: the machine must start again.
    await link.cloud.deps.accounts.set(accountId, { nodeLimit: 5 });
    for (const route of ["approve", "deny"] as const) {
      const exhausted = await call(route, token, user_code);
      expect(exhausted.status).toBe(403);
      expect(exhausted.body.error.code).toBe("user_code_attempts_exhausted");
    }
    // Lookup still shows it (it spends nothing), with no attempts left.
    expect((await call("lookup", token, user_code)).body.attempts_left).toBe(0);
    expect(await link.cloud.deps.nodes.list(accountId)).toEqual([]);
  });

  let scenario = 0;
  // Each row spreads a burst of guesses round-robin over its sessions, accounts and addresses.
  test.each([
    {
      label: "one account, 10 sessions, one address (the reported 180-guess burst)",
      accounts: 1,
      sessions: 10,
      addresses: 1,
      guesses: 180,
      processed: 10,
    },
    { label: "one account, 10 sessions, 10 addresses", accounts: 1, sessions: 10, addresses: 10, guesses: 60, processed: 10 },
    { label: "10 accounts, one session each, one address", accounts: 10, sessions: 1, addresses: 1, guesses: 60, processed: 20 },
    { label: "25 accounts from one address, two guesses each", accounts: 25, sessions: 1, addresses: 1, guesses: 50, processed: 20 },
    { label: "10 accounts from 10 addresses, five guesses each", accounts: 10, sessions: 1, addresses: 10, guesses: 50, processed: 50 },
  ])(
    "approve and deny are limited per account (10) and per address (20): $label",
    async ({ accounts, sessions, addresses, guesses, processed }) => {
      scenario += 1;
      const callers = [];
      for (let a = 0; a < accounts; a++) {
        for (let s = 0; s < sessions; s++) callers.push((await link.cloud.signIn(`guesser-${scenario}-${a}@example.com`)).token);
      }
      const sources = Array.from({ length: addresses }, () => link.source());
      const statuses: number[] = [];
      let retryAfter: string | null = null;
      for (let i = 0; i < guesses; i++) {
        const answer = await call(i % 2 ? "deny" : "approve", callers[i % callers.length], "BCDF-GHJK", sources[i % sources.length]);
        statuses.push(answer.status);
        if (answer.status === 429) retryAfter ??= answer.headers.get("retry-after");
      }
      expect(statuses.filter((status) => status === 404).length).toBe(processed);
      expect(statuses.filter((status) => status === 429).length).toBe(guesses - processed);
      if (processed < guesses) expect(Number(retryAfter)).toBeGreaterThan(0);
    },
  );

  test("a refused account does not drain its address: a neighbour behind it still decides; a real user never meets the limits", async () => {
    const address = link.source();
    const guesser = await link.cloud.signIn("greedy@example.com");
    const spent = [];
    for (let i = 0; i < 15; i++) spent.push((await call("approve", guesser.token, "BCDF-GHJK", address)).status);
    expect(spent).toEqual([...Array(10).fill(404), ...Array(5).fill(429)]);
    // The address paid for 10 of the 15: the neighbour has the other 10 of its 20.
    const neighbour = await link.cloud.signIn("neighbour@example.com");
    const machines = await Promise.all([1, 2, 3].map((n) => link.requestDevice({ hostname: `desk-${n}` })));
    expect((await call("approve", neighbour.token, "BCDF-GHJK", address)).status).toBe(404); // a typo
    for (const machine of machines) expect((await call("approve", neighbour.token, machine.user_code, address)).status).toBe(200);
    expect((await call("deny", neighbour.token, (await link.requestDevice()).user_code, address)).status).toBe(200);
  });

  test("an expired request is 404 to lookup, approve and deny, and spends nothing", async () => {
    const { token } = await link.cloud.signIn("expired@example.com");
    const { user_code, device_code } = await link.requestDevice();
    link.clock.advance(900_000);
    for (const route of ["lookup", "approve", "deny"] as const) {
      const answer = await call(route, token, user_code);
      expect(answer.status).toBe(404);
    }
    expect(await attemptsLeft(device_code)).toBe(5);
  });

  test("10 concurrent approvals of one code by one account: exactly one 200 and one node", async () => {
    const { accountId } = await link.cloud.signIn("race@example.com");
    // Ten sessions (the account's burst), more than the code's five attempts, all at once.
    const tokens = await Promise.all(Array.from({ length: 10 }, async () => (await link.cloud.signIn("race@example.com")).token));
    const { user_code, device_code } = await link.requestDevice({ hostname: "contested-box" });
    const answers = await Promise.all(tokens.map((token) => call("approve", token, user_code)));
    const statuses = answers.map((a) => a.status);
    expect(statuses.filter((s) => s === 200).length).toBe(1);
    // The others lost the compare-and-set (409), or found the budget spent (403).
    expect(statuses.every((s) => s === 200 || s === 409 || s === 403)).toBe(true);
    expect((await link.cloud.deps.nodes.list(accountId)).length).toBe(1);
    const left = await attemptsLeft(device_code);
    expect(left).toBeGreaterThanOrEqual(0);
    expect(left).toBeLessThan(5);
    const audit = await link.cloud.deps.audit.list(accountId);
    expect(audit.filter((entry) => entry.action === "device_link.approved").length).toBe(1);
  });
});
