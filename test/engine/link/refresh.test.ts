import { afterEach, describe, expect, test } from "bun:test";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Server } from "bun";
import { IdentityStore, type LinkClaim, MetadataRefresher } from "../../../src/engine/link";
import { createLogger } from "../../../src/lib/logger";
import { eventually, freePort, startTestEngine, tempDir } from "../../helpers";

const claimFor = (cloudUrl: string): LinkClaim => ({
  node_id: "node_1",
  slug: "gpu-box",
  account_id: "acct_1",
  node_credential: "nc_secret",
  cloud_url: cloudUrl,
  hosted_base_domain: "hosted.example",
});

/** metadataServer answers GET /api/link/metadata with each scripted answer in turn (the last repeats). */
function metadataServer(answers: (() => Response)[]): { url: string; hits: () => number } {
  let hits = 0;
  const server = Bun.serve({
    port: 0,
    fetch(request) {
      if (new URL(request.url).pathname !== "/api/link/metadata") return new Response("no", { status: 400 });
      hits += 1;
      const next = answers.length > 1 ? answers.shift() : answers[0];
      return (next as () => Response)();
    },
  });
  servers.push(server);
  return { url: `http://127.0.0.1:${server.port}`, hits: () => hits };
}
const domain = (name: string) => () => Response.json({ hosted_base_domain: name });
const notFound = () => () => Response.json({ error: { code: "not_found", message: "no route", request_id: "r" } }, { status: 404 });
const broken = () => () => new Response("down", { status: 503 });

const servers: Server<undefined>[] = [];
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  for (const server of servers.splice(0)) server.stop(true);
});

/** setup makes a data dir, a logger whose lines the test can read, and a refresher over them. */
function setup(options: { periodMs?: number; retryMs?: number } = {}) {
  const dataDir = tempDir("engine-link-refresh-");
  cleanups.push(() => rmSync(dataDir, { recursive: true, force: true }));
  const { log, flush } = createLogger({ level: "info", dataDir, stdout: false });
  const identity = new IdentityStore(dataDir);
  const refresher = new MetadataRefresher({ identity, log, ...options });
  cleanups.push(() => refresher.stop());
  const logLines = () => {
    flush();
    return readFileSync(join(dataDir, "engine.log"), "utf8");
  };
  return { dataDir, identity, refresher, logLines };
}

describe("MetadataRefresher", () => {
  test("an engine that is not linked asks nothing", async () => {
    const { refresher } = setup();
    expect(await refresher.refreshNow()).toBe("not_linked");
  });

  test("records the cloud's hosted base domain, and logs when it changed", async () => {
    const cloud = metadataServer([domain("hosted.example"), domain("hosted.example.net")]);
    const { identity, refresher, logLines } = setup();
    identity.save(claimFor(cloud.url));
    expect(await refresher.refreshNow()).toBe("unchanged");
    expect(identity.read()?.metadata_refreshed_at).not.toBeNull();
    expect(await refresher.refreshNow()).toBe("updated");
    expect(identity.read()?.hosted_base_domain).toBe("hosted.example.net");
    expect(identity.readLinked()?.node_credential).toBe("nc_secret");
    expect(logLines()).toContain("hosted base domain changed");
  });

  test("a cloud without the route (404) is logged once as refresh unsupported and the stored value kept", async () => {
    const cloud = metadataServer([notFound()]);
    const { identity, refresher, logLines } = setup();
    identity.save(claimFor(cloud.url));
    expect(await refresher.refreshNow()).toBe("unsupported");
    expect(await refresher.refreshNow()).toBe("unsupported");
    expect(cloud.hits()).toBe(2);
    expect(identity.read()?.hosted_base_domain).toBe("hosted.example");
    expect(logLines().match(/refresh unsupported/g)?.length).toBe(1);
  });

  test("an unreachable cloud is a warning, and the refresh is tried again after the retry delay", async () => {
    const { identity, refresher, logLines } = setup({ periodMs: 3600_000, retryMs: 20 });
    identity.save(claimFor(`http://127.0.0.1:${await freePort()}`));
    expect(await refresher.refreshNow()).toBe("failed");
    expect(logLines()).toContain("cannot refresh the link metadata");

    // A cloud that answers 503 first and then the domain: the scheduled retry picks it up.
    const cloud = metadataServer([broken(), domain("hosted.example.org")]);
    identity.save(claimFor(cloud.url));
    refresher.start();
    await eventually(() => identity.read()?.hosted_base_domain === "hosted.example.org");
    expect(cloud.hits()).toBe(2);
    await refresher.stop();
    await refresher.stop();
  });

  test("the running daemon refreshes at start, from the identity `engine link` wrote", async () => {
    const cloud = metadataServer([domain("daemon.example")]);
    const dataDir = tempDir("engine-link-daemon-");
    cleanups.push(() => rmSync(dataDir, { recursive: true, force: true }));
    new IdentityStore(dataDir).save(claimFor(cloud.url));
    const engine = await startTestEngine({ dataDir });
    cleanups.push(() => engine.close());
    await eventually(() => new IdentityStore(dataDir).read()?.hosted_base_domain === "daemon.example", { timeoutMs: 10_000 });
  });
});
