import { randomBytes } from "node:crypto";
import type { LinkClaimResponse } from "../../contract/cloud";
import type { RelayTool, ReportedGpu } from "../../contract/relay";
import { digestSecret, randomId } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import { lockAccount } from "../accounts";
import { type Database, num, optionalNum, type PreparedRead, type Sql } from "../db";

/** NODE_CREDENTIAL_PREFIX marks a node's own credential for secret scanners and humans. */
export const NODE_CREDENTIAL_PREFIX = "enc_";

/** EnrollmentRoute says which of the four routes enrolled a node. */
export type EnrollmentRoute = "link_code" | "device" | "preauth_key" | "hosted";

/** Reported is what a machine says about itself: unverified, bounded, control characters stripped. */
export interface Reported {
  hostname: string;
  os: string;
  version: string;
}

/** Node is a linked machine. */
export interface Node {
  id: string;
  accountId: string;
  slug: string;
  hostname: string;
  os: string;
  version: string;
  enrolledVia: EnrollmentRoute;
  createdAt: number;
  lastSeenAt: number | null;
  /** gpus are the GPUs the engine last reported over its tunnel (unverified); null until it first connected. */
  gpus: ReportedGpu[] | null;
}

/** Enrollment is a node and its freshly minted credential (the plaintext exists only in this answer). */
export interface Enrollment {
  node: Node;
  credential: string;
  adopted: boolean;
}

/** REPORTED_MAX bounds each reported string (characters, after stripping). */
export const REPORTED_MAX = { hostname: 253, os: 128, version: 64 } as const;

/**
 * cleanText strips control characters (C0, DEL, C1, and the bidi overrides that can disguise
 * text), trims, and bounds the result to `max` characters, so what a person reads is what was
 * stored. Every string a machine or user labels something with goes through it.
 */
export function cleanText(value: string, max: number): string {
  return value
    .replace(/[\u0000-\u001f\u007f-\u009f\u200e\u200f\u202a-\u202e\u2066-\u2069]/g, "")
    .trim()
    .slice(0, max);
}

/** cleanReported cleans and bounds each reported string with cleanText. */
export function cleanReported(raw: Reported): Reported {
  return {
    hostname: cleanText(raw.hostname, REPORTED_MAX.hostname),
    os: cleanText(raw.os, REPORTED_MAX.os),
    version: cleanText(raw.version, REPORTED_MAX.version),
  };
}

/** slugOf derives a node's slug from its reported hostname: the first label, lower-case, DNS-safe. */
export function slugOf(hostname: string): string {
  const label = (hostname.split(".")[0] ?? "")
    .normalize("NFKD")
    .replace(/\p{M}/gu, "")
    .toLowerCase()
    .replace(/[^a-z0-9-]+/g, "-")
    .replace(/-{2,}/g, "-")
    .replace(/^-+|-+$/g, "")
    .slice(0, 40)
    .replace(/-+$/, "");
  return label || "machine";
}

function rowToNode(row: Record<string, unknown>): Node {
  return {
    id: row.id as string,
    accountId: row.account_id as string,
    slug: row.slug as string,
    hostname: row.hostname as string,
    os: row.os as string,
    version: row.version as string,
    enrolledVia: row.enrolled_via as EnrollmentRoute,
    createdAt: num(row.created_at),
    lastSeenAt: optionalNum(row.last_seen_at),
    gpus: typeof row.gpus === "string" ? (JSON.parse(row.gpus) as ReportedGpu[]) : null,
  };
}

/** cleanGpus bounds and strips what a machine reports about its GPUs, as cleanReported does its strings. */
export function cleanGpus(gpus: readonly ReportedGpu[]): ReportedGpu[] {
  return gpus.map((gpu) => ({
    index: gpu.index,
    name: cleanText(gpu.name, 128),
    memory_total_mb: gpu.memory_total_mb,
    mig_profile: gpu.mig_profile === null ? null : cleanText(gpu.mig_profile, 32),
  }));
}

/** NodeStore enrolls and lists nodes. Every enrollment route ends in `enroll`. */
export class NodeStore {
  /** #list is the account's node list, prepared at its first use (the relay reads it on every assistant call). */
  #list: PreparedRead | undefined;

  constructor(private readonly db: Database) {}

  /**
   * enroll creates a node under an account, or adopts the account's node with the same slug
   * (a reinstalled machine re-linking keeps its identity), and mints the node's credential.
   * It runs inside the caller's transaction: the account's row lock is taken first
   * (src/cloud/accounts `lockAccount`) so concurrent enrollments of one account queue, and the
   * node limit counts only new nodes.
   */
  async enroll(tx: Sql, accountId: string, reported: Reported, via: EnrollmentRoute): Promise<Enrollment> {
    const now = Date.now();
    const { nodeLimit } = await lockAccount(tx, accountId);
    const clean = cleanReported(reported);
    const slug = slugOf(clean.hostname);
    const credential = NODE_CREDENTIAL_PREFIX + randomBytes(32).toString("base64url");
    const digest = digestSecret(credential);
    const [existing] = await tx`SELECT * FROM nodes WHERE account_id = ${accountId} AND slug = ${slug}`;
    if (existing) {
      await tx`UPDATE nodes SET hostname = ${clean.hostname}, os = ${clean.os}, version = ${clean.version},
        credential_digest = ${digest}, enrolled_via = ${via}, updated_at = ${now} WHERE id = ${existing.id}`;
      const node = rowToNode({ ...existing, hostname: clean.hostname, os: clean.os, version: clean.version, enrolled_via: via });
      return { node, credential, adopted: true };
    }
    const [count] = await tx`SELECT COUNT(*) AS n FROM nodes WHERE account_id = ${accountId}`;
    if (num(count.n) >= nodeLimit) {
      throw new AppError("node_limit_reached", `the account has reached its limit of ${nodeLimit} machines`);
    }
    const id = randomId("node");
    await tx`INSERT INTO nodes (id, account_id, slug, hostname, os, version, credential_digest, enrolled_via, created_at, updated_at)
      VALUES (${id}, ${accountId}, ${slug}, ${clean.hostname}, ${clean.os}, ${clean.version}, ${digest}, ${via}, ${now}, ${now})`;
    const node: Node = { id, accountId, slug, ...clean, enrolledVia: via, createdAt: now, lastSeenAt: null, gpus: null };
    return { node, credential, adopted: false };
  }

  /**
   * rotateCredential mints a new credential for an existing node inside the caller's
   * transaction and returns it: the old one stops working at commit. The device link uses
   * it when the machine collects its approval, so the plaintext exists only in that answer.
   * `adopted` is true (rotation never creates a node); a node removed since is `not_found`.
   */
  async rotateCredential(tx: Sql, nodeId: string): Promise<Enrollment> {
    const credential = NODE_CREDENTIAL_PREFIX + randomBytes(32).toString("base64url");
    const [row] = await tx`UPDATE nodes SET credential_digest = ${digestSecret(credential)}, updated_at = ${Date.now()}
      WHERE id = ${nodeId} RETURNING *`;
    if (!row) throw new AppError("not_found", "the approved machine has been removed from the account; link it again");
    return { node: rowToNode(row), credential, adopted: true };
  }

  /**
   * enrollHosted links an account's hosted machine as a node, inside the caller's
   * transaction: the console made the box, so no credential is minted (the console reaches the
   * box itself) and the node limit does not apply (the box is paid for, or a trial).
   */
  async enrollHosted(tx: Sql, accountId: string, allocationId: string, now = Date.now()): Promise<Node> {
    const id = randomId("node");
    const slug = `hosted-${allocationId.replace(/^box_/, "").slice(0, 8)}`;
    const hostname = `${slug}.hosted`;
    await tx`INSERT INTO nodes (id, account_id, slug, hostname, os, version, credential_digest, enrolled_via, created_at, updated_at)
      VALUES (${id}, ${accountId}, ${slug}, ${hostname}, 'linux', '', NULL, 'hosted', ${now}, ${now})`;
    return { id, accountId, slug, hostname, os: "linux", version: "", enrolledVia: "hosted", createdAt: now, lastSeenAt: null, gpus: null };
  }

  /** unlink removes a node inside the caller's transaction (a hosted machine being deleted); an unknown node is no change. */
  async unlink(tx: Sql, nodeId: string): Promise<boolean> {
    const rows = await tx`DELETE FROM nodes WHERE id = ${nodeId} RETURNING id`;
    return rows.length > 0;
  }

  /**
   * list returns the account's nodes. It names the columns a Node is made of: the relay reads it
   * on every assistant call, and `SELECT *` would copy each row's stored tool list (tens of KB).
   */
  async list(accountId: string): Promise<Node[]> {
    this.#list ??= this.db.prepareRead(`SELECT id, account_id, slug, hostname, os, version, enrolled_via, created_at, last_seen_at, gpus
      FROM nodes WHERE account_id = $1 ORDER BY created_at`);
    return (await this.#list(accountId)).map(rowToNode);
  }

  /** authenticate returns the node a credential belongs to, or throws `invalid_session`. */
  async authenticate(credential: string | null | undefined): Promise<Node> {
    if (!credential?.startsWith(NODE_CREDENTIAL_PREFIX)) throw new AppError("unauthenticated", "a node credential is required");
    const [row] = await this.db.sql`SELECT * FROM nodes WHERE credential_digest = ${digestSecret(credential)}`;
    if (!row) throw new AppError("invalid_session", "the node credential is not valid");
    return rowToNode(row);
  }

  /** get returns one of the account's nodes, or undefined. */
  async get(accountId: string, nodeId: string): Promise<Node | undefined> {
    const [row] = await this.db.sql`SELECT * FROM nodes WHERE account_id = ${accountId} AND id = ${nodeId}`;
    return row ? rowToNode(row) : undefined;
  }

  /**
   * recordHello stores what an engine said when its tunnel opened: its version (replacing the
   * one reported at enrollment), its GPUs and its MCP tools, and that it was seen now. All of it
   * is reported, so cleaned and bounded like the enrollment strings.
   */
  async recordHello(nodeId: string, hello: { version: string; gpus: ReportedGpu[]; tools: RelayTool[] }, at: number): Promise<void> {
    await this.db.sql`UPDATE nodes SET version = ${cleanText(hello.version, REPORTED_MAX.version)},
      gpus = ${JSON.stringify(cleanGpus(hello.gpus))}, mcp_tools = ${JSON.stringify(hello.tools)}, last_seen_at = ${at}
      WHERE id = ${nodeId}`;
  }

  /** recordGpus stores a new GPU report from a connected engine. */
  async recordGpus(nodeId: string, gpus: ReportedGpu[], at: number): Promise<void> {
    await this.db.sql`UPDATE nodes SET gpus = ${JSON.stringify(cleanGpus(gpus))}, last_seen_at = ${at} WHERE id = ${nodeId}`;
  }

  /** touch records that a node was seen at `at` (a heartbeat, or its tunnel closing). */
  async touch(nodeId: string, at: number): Promise<void> {
    await this.db.sql`UPDATE nodes SET last_seen_at = ${at} WHERE id = ${nodeId} AND (last_seen_at IS NULL OR last_seen_at < ${at})`;
  }

  /** toolsOf returns the MCP tools the most recently seen of `nodeIds` reported, or null when none ever connected. */
  async toolsOf(accountId: string, nodeIds: readonly string[]): Promise<RelayTool[] | null> {
    if (nodeIds.length === 0) return null;
    const rows = await this.db.sql`SELECT id, mcp_tools, last_seen_at FROM nodes WHERE account_id = ${accountId} AND mcp_tools IS NOT NULL
      ORDER BY last_seen_at DESC`;
    const wanted = new Set(nodeIds);
    const row = rows.find((candidate: Record<string, unknown>) => wanted.has(candidate.id as string));
    return row ? (JSON.parse(row.mcp_tools as string) as RelayTool[]) : null;
  }

  /** remove deletes a node (its enrollment keys stay spent). */
  async remove(accountId: string, nodeId: string): Promise<boolean> {
    const rows = await this.db.sql`DELETE FROM nodes WHERE account_id = ${accountId} AND id = ${nodeId} RETURNING id`;
    return rows.length > 0;
  }
}

/** ClaimAnswer is the one node-identity answer every enrollment route returns (the contract's `LinkClaimResponse`). */
export type ClaimAnswer = LinkClaimResponse;

/** claimAnswer builds `LinkClaimResponse` from an enrollment: one function, so every route answers the same shape. */
export function claimAnswer(enrollment: Enrollment, site: { publicUrl: string; hostedBaseDomain: string }): ClaimAnswer {
  return {
    node_id: enrollment.node.id,
    slug: enrollment.node.slug,
    account_id: enrollment.node.accountId,
    node_credential: enrollment.credential,
    cloud_url: site.publicUrl,
    hosted_base_domain: site.hostedBaseDomain,
  };
}
