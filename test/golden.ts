import { expect } from "bun:test";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const GOLDEN_DIR = join(import.meta.dir, "golden");

/** normalize replaces values that change from run to run (ids, secrets, times) with placeholders. */
export function normalize(value: unknown, key = ""): unknown {
  if (key === "pids" && Array.isArray(value)) return `<${value.length} pids>`;
  // A proxy process's CPU depends on the machine's cores (decision 521).
  if (key === "cpus" && Array.isArray(value)) return `<${value.length} cpus>`;
  if (Array.isArray(value)) return value.map((item) => normalize(item));
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, normalize(v, k)]));
  }
  if (typeof value === "number" && ["pid", "uptime_s", "duration_s", "duration_ms"].includes(key)) return "<number>";
  if (typeof value === "number" && ["https_port", "http_port"].includes(key) && value !== 0) return "<port>";
  // Whether the local root is in this machine's stores depends on the machine, not the engine.
  if (key === "trusted_in_system" || key === "trusted_in_nss") return "<trust>";
  if (typeof value !== "string") return value;
  if (/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/.test(value)) return "<date-time>";
  if (/^tok_[a-z0-9]+$/.test(value)) return "<token-id>";
  if (/^svc_[a-z0-9]+$/.test(value)) return "<service-id>";
  if (/^run_[a-z0-9]+$/.test(value)) return "<run-id>";
  if (/^eng_[A-Za-z0-9_-]+$/.test(value)) return "<token-secret>";
  if (/^req_[a-z0-9]+$/.test(value)) return "<request-id>";
  if (key === "hostname" || key === "base_domain" || key === "host") return "<host>";
  if (key === "fingerprint_sha256") return "<fingerprint>";
  if (key === "root_path") return "<path>";
  if (key === "subject" || key === "issuer") return value.replace(/ - [a-z0-9-]+$/, " - <host>");
  if (key === "upstream" || key === "url") return value.replace(/\/\/[^/]+/, "//<host>:<port>");
  return value;
}

/**
 * expectGolden compares a status and a normalized body with test/golden/<name>.json.
 * UPDATE_GOLDEN=1 rewrites the file; the status is asserted separately by the caller too,
 * so regenerating goldens cannot hide a changed status.
 */
export function expectGolden(name: string, status: number, body: unknown): void {
  const file = join(GOLDEN_DIR, `${name}.json`);
  const actual = { status, body: normalize(body) };
  if (process.env.UPDATE_GOLDEN === "1") {
    mkdirSync(GOLDEN_DIR, { recursive: true });
    writeFileSync(file, `${JSON.stringify(actual, null, 2)}\n`);
    return;
  }
  // A missing golden fails: writing it silently would make the comparison unable to fail.
  if (!existsSync(file)) throw new Error(`golden file ${name}.json is missing; run the test with UPDATE_GOLDEN=1`);
  expect(actual).toEqual(JSON.parse(readFileSync(file, "utf8")));
}
