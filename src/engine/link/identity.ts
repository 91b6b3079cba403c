import { chmodSync, existsSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { LinkClaimResponse } from "../../contract/cloud";
import { type Clock, iso, systemClock } from "../../lib/clock";
import { SecretBox } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import { loadSecretKey, writePrivateFile } from "../../lib/files";

/** LINK_DIR and IDENTITY_FILE name where a linked engine keeps its node identity: `<data-dir>/link/identity.json`. */
export const LINK_DIR = "link";
export const IDENTITY_FILE = "identity.json";

/**
 * NodeIdentity is what a linked engine knows about itself in the cloud. It is everything a
 * claim answer (`LinkClaimResponse`) gave, plus when it was linked and when the link
 * metadata was last refreshed.
 */
export interface NodeIdentity {
  cloud_url: string;
  node_id: string;
  slug: string;
  account_id: string;
  hosted_base_domain: string;
  linked_at: string;
  /** metadata_refreshed_at is when the hosted base domain was last confirmed by the cloud; null until then. */
  metadata_refreshed_at: string | null;
}

/** LinkedNode is a NodeIdentity with its opened node credential, for the calls that present it. */
export interface LinkedNode extends NodeIdentity {
  node_credential: string;
}

/** IdentityFile is the on-disk shape: the credential only ever sealed. */
interface IdentityFile extends NodeIdentity {
  format: 1;
  /** sealed_node_credential is the node credential sealed (AES-256-GCM) under `<data-dir>/secret.key`, bound to node_id. */
  sealed_node_credential: string;
}

/** LinkClaim is the node identity a claim, an approved poll or a preauth enrollment answers (`LinkClaimResponse`). */
export type LinkClaim = LinkClaimResponse;

const STRING_FIELDS = ["cloud_url", "node_id", "slug", "account_id", "hosted_base_domain", "linked_at", "sealed_node_credential"] as const;

/**
 * IdentityStore keeps the node identity in `<data-dir>/link/identity.json`: the directory is
 * 0700, the file 0600 and replaced atomically, and the node credential inside is sealed with
 * the data dir's key (the same key the daemon seals the code-host token with), so a copy of
 * the file alone does not leak it. The CLI writes it; the daemon reads it at each metadata
 * refresh, so neither needs the other running.
 */
export class IdentityStore {
  readonly path: string;
  readonly #dataDir: string;
  readonly #clock: Clock;

  constructor(dataDir: string, clock: Clock = systemClock) {
    this.#dataDir = dataDir;
    this.#clock = clock;
    this.path = join(dataDir, LINK_DIR, IDENTITY_FILE);
  }

  /** read returns the stored identity without its credential, or null when the engine is not linked. */
  read(): NodeIdentity | null {
    const file = this.#readFile();
    if (!file) return null;
    const { format: _format, sealed_node_credential: _sealed, ...identity } = file;
    return identity;
  }

  /** readLinked returns the identity with its node credential opened, or null when not linked. */
  readLinked(): LinkedNode | null {
    const file = this.#readFile();
    if (!file) return null;
    const { format: _format, sealed_node_credential: sealed, ...identity } = file;
    let credential: string;
    try {
      credential = this.#box().open(sealed, file.node_id);
    } catch {
      throw new AppError(
        "config_invalid",
        `${this.path} holds a node credential this data dir's secret.key cannot open; run \`engine unlink\` and link again`,
      );
    }
    return { ...identity, node_credential: credential };
  }

  /** save stores a fresh claim answer as this engine's identity, replacing any previous one. */
  save(claim: LinkClaim): NodeIdentity {
    const identity: NodeIdentity = {
      cloud_url: claim.cloud_url,
      node_id: claim.node_id,
      slug: claim.slug,
      account_id: claim.account_id,
      hosted_base_domain: claim.hosted_base_domain,
      linked_at: iso(this.#clock.now()),
      metadata_refreshed_at: null,
    };
    this.#write({ format: 1, ...identity, sealed_node_credential: this.#box().seal(claim.node_credential, claim.node_id) });
    return identity;
  }

  /**
   * updateMetadata records a refreshed hosted base domain for the node `nodeId`. It re-reads
   * the file first and changes nothing when the engine was unlinked or linked anew meanwhile,
   * so a refresh that raced `engine unlink` or `engine link` never resurrects an old identity.
   */
  updateMetadata(nodeId: string, hostedBaseDomain: string): NodeIdentity | null {
    const file = this.#readFile();
    if (!file || file.node_id !== nodeId) return null;
    const next: IdentityFile = { ...file, hosted_base_domain: hostedBaseDomain, metadata_refreshed_at: iso(this.#clock.now()) };
    this.#write(next);
    const { format: _format, sealed_node_credential: _sealed, ...identity } = next;
    return identity;
  }

  /**
   * remove deletes the identity file and returns what it held (identity null when the file was
   * damaged), or null when the engine was not linked.
   */
  remove(): { path: string; identity: NodeIdentity | null } | null {
    if (!existsSync(this.path)) return null;
    let identity: NodeIdentity | null = null;
    try {
      identity = this.read();
    } catch {
      // A damaged file is removed all the same: that is how a user gets out of it.
    }
    rmSync(this.path, { force: true });
    return { path: this.path, identity };
  }

  #box(): SecretBox {
    return new SecretBox(loadSecretKey(this.#dataDir));
  }

  #write(file: IdentityFile): void {
    const dir = join(this.#dataDir, LINK_DIR);
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    // mkdir's mode applies only to a directory it creates: make an older one private too.
    chmodSync(dir, 0o700);
    writePrivateFile(this.path, `${JSON.stringify(file, null, 2)}\n`);
  }

  #readFile(): IdentityFile | null {
    let text: string;
    try {
      text = readFileSync(this.path, "utf8");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw new AppError("config_invalid", `cannot read ${this.path}: ${(error as Error).message}`);
    }
    let parsed: Partial<IdentityFile>;
    try {
      parsed = JSON.parse(text) as Partial<IdentityFile>;
    } catch {
      throw new AppError("config_invalid", `${this.path} is not valid JSON; run \`engine unlink\` and link again`);
    }
    const missing = STRING_FIELDS.filter((field) => typeof parsed[field] !== "string");
    if (parsed.format !== 1 || missing.length > 0) {
      throw new AppError(
        "config_invalid",
        `${this.path} is not a node identity this engine understands${missing.length > 0 ? ` (missing ${missing.join(", ")})` : ""}; run \`engine unlink\` and link again`,
      );
    }
    return { ...(parsed as IdentityFile), metadata_refreshed_at: parsed.metadata_refreshed_at ?? null };
  }
}
