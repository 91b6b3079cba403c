import { afterAll, beforeAll } from "bun:test";
import { readFileSync } from "node:fs";
import type { Diagnosis, ServiceRecord } from "../../../src/contract/engine";
import { eventually, startTestEngine, type TestEngine } from "../../helpers";

/** ApiCaller is what ServiceClient needs of an engine: an in-process test engine or a spawned one. */
export interface ApiCaller {
  json<T = unknown>(
    method: string,
    path: string,
    options?: { token?: string | null; body?: unknown },
  ): Promise<{ status: number; body: T }>;
}

/** ServiceClient wraps the services API of a test engine with the waits tests need. */
export class ServiceClient {
  constructor(readonly engine: ApiCaller) {}

  async deploy(body: Record<string, unknown>, token?: string): Promise<{ status: number; body: ServiceRecord & Record<string, unknown> }> {
    return this.engine.json("POST", "/api/services", { body, token });
  }

  /** deployed deploys and returns the record, failing unless the engine answered 201. */
  async deployed(body: Record<string, unknown>): Promise<ServiceRecord> {
    const { status, body: record } = await this.deploy(body);
    if (status !== 201) throw new Error(`deploy ${body.name}: ${status} ${JSON.stringify(record)}`);
    return record;
  }

  async get(name: string): Promise<ServiceRecord> {
    const response = await this.engine.json<ServiceRecord>("GET", `/api/services/${name}`);
    if (response.status !== 200) throw new Error(`GET ${name}: ${response.status} ${JSON.stringify(response.body)}`);
    return response.body;
  }

  async diagnose(name: string): Promise<Diagnosis> {
    const response = await this.engine.json<Diagnosis>("GET", `/api/services/${name}/diagnose`);
    if (response.status !== 200) throw new Error(`diagnose ${name}: ${response.status}`);
    return response.body;
  }

  async control(name: string, action: string): Promise<{ status: number; body: ServiceRecord & { error?: { code: string } } }> {
    return this.engine.json("POST", `/api/services/${name}/${action}`);
  }

  /** waitFor polls until the service has the status (and the predicate holds), failing with its last state. */
  async waitFor(name: string, status: string, predicate: (record: ServiceRecord) => boolean = () => true, timeoutMs = 10_000) {
    let last: ServiceRecord | undefined;
    try {
      return await eventually(
        async () => {
          last = await this.get(name);
          return last.status === status && predicate(last) ? last : null;
        },
        { timeoutMs, intervalMs: 25 },
      );
    } catch {
      throw new Error(`${name} did not become ${status} within ${timeoutMs} ms; last: ${last?.status} (${last?.status_message})`);
    }
  }
}

/** processExists says whether a pid names a live (non-zombie) process. */
export function processExists(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const state = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
    return state !== "Z" && state !== "X";
  } catch {
    return false;
  }
}

/** processState is the one-letter state of /proc/<pid>/stat (R, S, T for stopped, ...). */
export function processState(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0] ?? null;
  } catch {
    return null;
  }
}

/**
 * testEngineWithClient starts one in-process engine for the file's tests (beforeAll) and closes
 * it after them (afterAll); the getters answer it and its ServiceClient.
 */
export function testEngineWithClient(): { engine: () => TestEngine; api: () => ServiceClient } {
  let engine: TestEngine | undefined;
  let api: ServiceClient | undefined;
  beforeAll(async () => {
    engine = await startTestEngine();
    api = new ServiceClient(engine);
  });
  afterAll(async () => {
    await engine?.close();
  });
  const started = <T>(value: T | undefined): T => {
    if (value === undefined) throw new Error("the test engine is not started: call this inside a test");
    return value;
  };
  return { engine: () => started(engine), api: () => started(api) };
}
