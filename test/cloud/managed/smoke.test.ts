import { expect, test } from "bun:test";
import { boxPids, startManagedCloud } from "./helpers";

test("smoke", async () => {
  const cloud = await startManagedCloud("sqlite", { places: { launch: 2, trial: 2 } });
  try {
    const { token } = await cloud.signIn("a@example.com");
    const created = await cloud.api("POST", "/api/managed/allocation", { token });
    console.log(created.status, created.body);
    const ready = await cloud.waitFor(token, (v) => v.status === "ready" || v.status === "failed", 5000);
    console.log(ready);
    const health = await fetch(`${ready.url}api/health`, { headers: { authorization: `Bearer ${token}` } });
    console.log(health.status, await health.text());
    console.log(boxPids(cloud.dataDir));
    const del = await cloud.api("DELETE", "/api/managed/allocation", { token });
    console.log(del.status, del.body.status);
    const gone = await cloud.waitFor(token, (v) => v.status === "deleted");
    console.log(gone.status, boxPids(cloud.dataDir));
    console.log((await cloud.api("GET", "/api/managed/allocation/backups", { token })).body);
  } finally {
    console.log(require("node:fs").readFileSync(cloud.dataDir + "/cloud.log", "utf8").slice(-3000));
    await cloud.close();
  }
  expect(1).toBe(1);
}, 60000);
