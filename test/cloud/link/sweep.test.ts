import { afterAll, beforeAll, expect, test } from "bun:test";
import { KEEP_EXPIRED_MS, sweepLinkRows } from "../../../src/cloud/link";
import { digestSecret } from "../../../src/lib/crypto";
import { describeEachDialect } from "../helpers";
import { type LinkTestCloud, startLinkCloud } from "./helpers";

describeEachDialect("the link module's sweep", (dialect) => {
  let link: LinkTestCloud;
  beforeAll(async () => {
    link = await startLinkCloud(dialect);
  });
  afterAll(async () => {
    await link?.cloud.close();
  });

  test("device requests and link codes are kept a day past their expiry, then deleted, and counted", async () => {
    const device = await link.requestDevice({ hostname: "swept-box" });
    const { token } = await link.cloud.signIn("sweep@example.com");
    const minted = await link.cloud.api("POST", "/api/link/codes", { token });
    expect(minted.status).toBe(201);
    const { db } = link.cloud.deps;
    const id = (device.device_code as string).split(".")[0] as string;
    const [request] = await db.sql`SELECT expires_at FROM device_requests WHERE id = ${id}`;
    const [code] = await db.sql`SELECT expires_at FROM link_codes WHERE digest = ${digestSecret(minted.body.code)}`;
    const expiries = [Number(request.expires_at), Number(code.expires_at)];
    const stillThere = async () => ({
      request: (await db.sql`SELECT id FROM device_requests WHERE id = ${id}`).length,
      code: (await db.sql`SELECT id FROM link_codes WHERE digest = ${digestSecret(minted.body.code)}`).length,
    });

    // A day after the earlier expiry, less a second: both are kept for support questions.
    await sweepLinkRows(link.cloud.deps, Math.min(...expiries) + KEEP_EXPIRED_MS - 1000);
    expect(await stillThere()).toEqual({ request: 1, code: 1 });

    const swept = await sweepLinkRows(link.cloud.deps, Math.max(...expiries) + KEEP_EXPIRED_MS + 1000);
    expect(swept.device_requests).toBeGreaterThanOrEqual(1);
    expect(swept.link_codes).toBeGreaterThanOrEqual(1);
    expect(await stillThere()).toEqual({ request: 0, code: 0 });
  });
});
