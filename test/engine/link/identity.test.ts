import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { chmodSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { IdentityStore, type LinkClaim } from "../../../src/engine/link";
import type { Clock } from "../../../src/lib/clock";
import { loadSecretKey } from "../../../src/lib/files";
import { tempDir } from "../../helpers";

const CREDENTIAL = "nc_ThisIsTheNodeCredential0042";
const claim: LinkClaim = {
  node_id: "node_1",
  slug: "gpu-box",
  account_id: "acct_1",
  node_credential: CREDENTIAL,
  cloud_url: "https://cloud.example",
  hosted_base_domain: "hosted.example",
};

let dataDir: string;
let nowMs: number;
const clock: Clock = { now: () => new Date(nowMs) };
let store: IdentityStore;
beforeEach(() => {
  dataDir = join(tempDir("engine-link-identity-"), "data");
  nowMs = Date.parse("2026-03-01T12:00:00.000Z");
  store = new IdentityStore(dataDir, clock);
});
afterEach(() => rmSync(join(dataDir, ".."), { recursive: true, force: true }));

describe("IdentityStore", () => {
  test("an engine that never linked has no identity", () => {
    expect(store.read()).toBeNull();
    expect(store.readLinked()).toBeNull();
    expect(store.remove()).toBeNull();
  });

  test("save keeps the claim in <data-dir>/link/identity.json (dir 0700, file 0600) with the credential sealed", () => {
    const saved = store.save(claim);
    expect(store.path).toBe(join(dataDir, "link", "identity.json"));
    expect(statSync(join(dataDir, "link")).mode & 0o777).toBe(0o700);
    expect(statSync(store.path).mode & 0o777).toBe(0o600);
    const text = readFileSync(store.path, "utf8");
    expect(text).not.toContain(CREDENTIAL);
    expect(JSON.parse(text)).toMatchObject({ format: 1, node_id: "node_1", sealed_node_credential: expect.stringMatching(/^v1\./) });
    expect(saved).toEqual({
      cloud_url: "https://cloud.example",
      node_id: "node_1",
      slug: "gpu-box",
      account_id: "acct_1",
      hosted_base_domain: "hosted.example",
      linked_at: "2026-03-01T12:00:00.000Z",
      metadata_refreshed_at: null,
    });
    expect(store.read()).toEqual(saved);
    expect(JSON.stringify(store.read())).not.toContain(CREDENTIAL);
    expect(store.readLinked()).toEqual({ ...saved, node_credential: CREDENTIAL });
    // Atomic writes leave no temporary file behind.
    expect(readdirSync(join(dataDir, "link"))).toEqual(["identity.json"]);
  });

  test("the credential is sealed under the data dir's secret.key, the daemon's key", () => {
    store.save(claim);
    const key = loadSecretKey(dataDir);
    expect(key.length).toBe(32);
    writeFileSync(join(dataDir, "secret.key"), Buffer.alloc(32, 7).toString("base64"));
    chmodSync(join(dataDir, "secret.key"), 0o600);
    expect(() => store.readLinked()).toThrow(/cannot open.*engine unlink/);
    // The rest of the identity stays readable: status works even then.
    expect(store.read()?.slug).toBe("gpu-box");
  });

  test("a link directory made earlier with a looser mode is made private", () => {
    mkdirSync(join(dataDir, "link"), { recursive: true, mode: 0o755 });
    chmodSync(join(dataDir, "link"), 0o755);
    store.save(claim);
    expect(statSync(join(dataDir, "link")).mode & 0o777).toBe(0o700);
  });

  test("updateMetadata records the refreshed domain only for the node it was read for", () => {
    store.save(claim);
    nowMs += 60_000;
    const updated = store.updateMetadata("node_1", "hosted.example.net");
    expect(updated).toMatchObject({ hosted_base_domain: "hosted.example.net", metadata_refreshed_at: "2026-03-01T12:01:00.000Z" });
    expect(store.readLinked()?.node_credential).toBe(CREDENTIAL);
    // A refresh that raced a new `engine link` leaves the new identity alone.
    expect(store.updateMetadata("node_old", "stale.example")).toBeNull();
    expect(store.read()?.hosted_base_domain).toBe("hosted.example.net");
    store.remove();
    expect(store.updateMetadata("node_1", "stale.example")).toBeNull();
    expect(store.read()).toBeNull();
  });

  test("remove says what it removed, and removes a damaged file too", () => {
    const saved = store.save(claim);
    expect(store.remove()).toEqual({ path: store.path, identity: saved });
    expect(store.read()).toBeNull();
    mkdirSync(join(dataDir, "link"), { recursive: true });
    writeFileSync(store.path, "{not json");
    expect(() => store.read()).toThrow(/not valid JSON.*engine unlink/);
    expect(store.remove()).toEqual({ path: store.path, identity: null });
    expect(store.read()).toBeNull();
  });

  test.each([
    ["missing fields", JSON.stringify({ format: 1, node_id: "n" }), /missing cloud_url, slug/],
    ["an unknown format", JSON.stringify({ format: 2 }), /not a node identity this engine understands/],
  ])("a file with %s is refused with a way out", (_name, text, message) => {
    mkdirSync(join(dataDir, "link"), { recursive: true });
    writeFileSync(store.path, text);
    expect(() => store.read()).toThrow(message);
  });
});
