import { afterAll, beforeAll, expect, test } from "bun:test";
import { num } from "../../../src/cloud/db";
import { describeEachDialect, startTestCloud, type TestCloud } from "../helpers";
import { type ManagedCloud, startManagedCloud } from "./helpers";

/** MANAGED_ROUTES are the contract's nine hosted-machine routes. */
const MANAGED_ROUTES: [string, string, unknown][] = [
  ["GET", "/api/managed/purchase", undefined],
  ["POST", "/api/managed/purchase", undefined],
  ["GET", "/api/managed/allocation", undefined],
  ["POST", "/api/managed/allocation", undefined],
  ["DELETE", "/api/managed/allocation", undefined],
  ["POST", "/api/managed/allocation/wake", undefined],
  ["GET", "/api/managed/allocation/update", undefined],
  ["POST", "/api/managed/allocation/update", { version: "9.9.9" }],
  ["GET", "/api/managed/allocation/backups", undefined],
];

describeEachDialect("hosted machines: sessions, and a console that offers none", (dialect) => {
  let off: TestCloud;
  beforeAll(async () => {
    off = await startTestCloud(dialect, { boxProvider: "off" });
  });
  afterAll(async () => {
    await off?.close();
  });

  test.each(MANAGED_ROUTES)("%s %s answers 401 without a session", async (method, path, body) => {
    const answer = await off.api(method, path, { body });
    expect(answer.status).toBe(401);
    expect(answer.headers.get("www-authenticate")).toContain("Bearer");
    expect((await off.api(method, path, { body, token: "ecs_invented" })).status).toBe(401);
  });

  test.each(MANAGED_ROUTES)("%s %s answers 404 managed_not_offered when no provider is configured", async (method, path, body) => {
    const { token } = await off.signIn("offered@example.com");
    const answer = await off.api(method, path, { token, body });
    expect(answer.status).toBe(404);
    expect(answer.body.error.code).toBe("managed_not_offered");
  });
});

describeEachDialect("hosted machines: purchase (derived from seats, invoices and places)", (dialect) => {
  let cloud: ManagedCloud;
  const purchase = (token: string, method = "GET") => cloud.api(method, "/api/managed/purchase", { token });
  const requests = async (accountId: string) => {
    const [row] = await cloud.deps.db.sql`SELECT COUNT(*) AS n FROM managed_purchase_requests WHERE account_id = ${accountId}`;
    return num(row.n);
  };

  beforeAll(async () => {
    cloud = await startManagedCloud(dialect, { places: { launch: 2, trial: 0 } });
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test("none until asked; asking answers 201 once, and a repeat 200 with nothing written", async () => {
    const { token, accountId } = await cloud.signIn("buyer@example.com");
    const before = await purchase(token);
    expect(before.status).toBe(200);
    expect(before.body).toEqual({ state: "none", requested_at: null, invoice: null, seat_since: null, launch_place_free: true });
    const asked = await purchase(token, "POST");
    expect(asked.status).toBe(201);
    expect(asked.body.state).toBe("requested");
    expect(Date.parse(asked.body.requested_at)).toBeGreaterThan(0);
    const again = await purchase(token, "POST");
    expect(again.status).toBe(200);
    expect(again.body).toEqual(asked.body);
    expect(await requests(accountId)).toBe(1);
    expect(await cloud.auditCount("managed.purchase_requested", "")).toBe(1);
    expect((await purchase(token)).body).toEqual(asked.body);
  });

  test.each(["suspended", "closed"] as const)("a %s account may not ask (403), and nothing is written", async (standing) => {
    const { token, accountId } = await cloud.signIn(`${standing}-buyer@example.com`, { standing });
    const refused = await purchase(token, "POST");
    expect(refused.status).toBe(403);
    expect(refused.body.error.code).toBe("account_suspended");
    expect(await requests(accountId)).toBe(0);
    // Reading is not refused: the contract lists no 403 on GET purchase.
    expect((await purchase(token)).body.state).toBe("none");
  });

  test("an open invoice makes it invoiced, paying it gives a seat (paid), voiding it goes back to requested", async () => {
    const { token } = await cloud.signIn("invoiced@example.com");
    expect((await purchase(token, "POST")).status).toBe(201);
    const invoice = await cloud.managed.openInvoice("invoiced@example.com", "EUR 90", "first month");
    const invoiced = await purchase(token);
    expect(invoiced.body).toMatchObject({ state: "invoiced", invoice: { id: invoice.id, state: "open", amount: "EUR 90" } });
    await cloud.managed.decideInvoice(invoice.id, "void");
    expect((await purchase(token)).body).toMatchObject({ state: "requested", invoice: { id: invoice.id, state: "void" } });
    const second = await cloud.managed.openInvoice("invoiced@example.com", "EUR 90", "");
    await cloud.managed.decideInvoice(second.id, "paid");
    const paid = await purchase(token);
    expect(paid.body).toMatchObject({ state: "paid", invoice: { id: second.id, state: "paid" } });
    expect(Date.parse(paid.body.seat_since)).toBeGreaterThan(0);
    // A repeat of a decided invoice, or an unknown one, changes nothing.
    await expect(cloud.managed.decideInvoice(second.id, "void")).rejects.toMatchObject({ code: "invoice_not_found" });
    expect((await purchase(token, "POST")).status).toBe(200);
    for (const action of ["managed.invoice_opened", "managed.invoice_voided", "managed.invoice_paid"]) {
      const [row] = await cloud.deps.db.sql`SELECT COUNT(*) AS n FROM audit WHERE action = ${action}`;
      expect({ action, n: num(row.n) }).toEqual({ action, n: action === "managed.invoice_opened" ? 2 : 1 });
    }
  });

  test("launch places are seats held plus open invoices: with none free, asking is 409 no_launch_place", async () => {
    await cloud.managed.setPlaces("launch", 2);
    // One seat is held (the paid account above); one invoice more fills the two places.
    await cloud.signIn("filler@example.com");
    await cloud.managed.openInvoice("filler@example.com", "", "");
    const summary = await cloud.managed.placesSummary();
    expect(summary.launch).toEqual({ places: 2, seats: 1, open_invoices: 1, free: 0 });
    const { token, accountId } = await cloud.signIn("late@example.com");
    expect((await purchase(token)).body.launch_place_free).toBe(false);
    const refused = await purchase(token, "POST");
    expect(refused.status).toBe(409);
    expect(refused.body.error.code).toBe("no_launch_place");
    expect(await requests(accountId)).toBe(0);
    await expect(cloud.managed.openInvoice("late@example.com", "", "")).rejects.toMatchObject({ code: "no_launch_place" });
    // Releasing the seat frees a place.
    expect(await cloud.managed.releaseSeat("invoiced@example.com")).toBe(true);
    expect((await purchase(token, "POST")).status).toBe(201);
  });
});
