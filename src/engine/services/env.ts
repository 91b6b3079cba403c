import { InputError } from "../../lib/validation";
import { inheritedEnv } from "../config";

/** BoundService is what a binding needs to know of the service it binds to. */
export interface BoundService {
  name: string;
  kind: string;
  template_id: string | null;
  port: number | null;
  env: Record<string, string>;
  secrets: Record<string, string>;
  /** database are the variables a managed database's adapter gives (DATABASE_URL, PG*, ...); they replace the template conventions below. */
  database?: Record<string, string>;
}

/** envPrefix turns a service name into a variable prefix: `my-db` → `MY_DB`. */
export function envPrefix(name: string): string {
  return name.toUpperCase().replace(/-/g, "_");
}

/**
 * bindingVariables are the variables a bound service provides to the services bound to it:
 * `<NAME>_HOST` and `<NAME>_PORT` always; `<NAME>_URL` for HTTP services and models; and for
 * databases from a known template the client conventions of that database (`DATABASE_URL`,
 * libpq's `PG*`, `REDIS_URL`) with its credentials, as Heroku and Render add-ons do.
 */
export function bindingVariables(bound: BoundService): Record<string, string> {
  const prefix = envPrefix(bound.name);
  const host = "127.0.0.1";
  const port = bound.port === null ? "" : String(bound.port);
  const vars: Record<string, string> = { [`${prefix}_HOST`]: host, [`${prefix}_PORT`]: port };
  const value = (key: string) => bound.secrets[key] ?? bound.env[key];
  const enc = encodeURIComponent;
  if (bound.kind === "service" || bound.kind === "model") vars[`${prefix}_URL`] = `http://${host}:${port}`;
  if (bound.database) {
    Object.assign(vars, bound.database);
  } else if (bound.template_id === "postgres") {
    const user = value("POSTGRES_USER") ?? "postgres";
    const password = value("POSTGRES_PASSWORD") ?? "";
    const database = value("POSTGRES_DB") ?? user;
    const url = `postgresql://${enc(user)}:${enc(password)}@${host}:${port}/${enc(database)}`;
    Object.assign(vars, {
      DATABASE_URL: url,
      [`${prefix}_URL`]: url,
      [`${prefix}_USER`]: user,
      [`${prefix}_PASSWORD`]: password,
      PGHOST: host,
      PGPORT: port,
      PGUSER: user,
      PGPASSWORD: password,
      PGDATABASE: database,
    });
  } else if (bound.template_id === "mariadb") {
    const password = value("MARIADB_ROOT_PASSWORD") ?? "";
    const url = `mysql://root:${enc(password)}@${host}:${port}/`;
    Object.assign(vars, { DATABASE_URL: url, [`${prefix}_URL`]: url, [`${prefix}_USER`]: "root", [`${prefix}_PASSWORD`]: password });
  } else if (bound.template_id === "redis") {
    const password = value("REDIS_PASSWORD");
    const url = password ? `redis://:${enc(password)}@${host}:${port}/0` : `redis://${host}:${port}/0`;
    Object.assign(vars, { REDIS_URL: url, [`${prefix}_URL`]: url });
    if (password) vars[`${prefix}_PASSWORD`] = password;
  }
  return vars;
}

/**
 * assertNoBindingCycle refuses a deploy whose bindings would close a cycle (a waits for b
 * waits for a): such services would wait in `pending` forever.
 */
export function assertNoBindingCycle(name: string, bindings: string[], graph: Map<string, string[]>): void {
  const edges = new Map(graph);
  edges.set(name, bindings);
  const path: string[] = [];
  const visiting = new Set<string>();
  const visit = (node: string): string[] | null => {
    if (visiting.has(node)) return [...path.slice(path.indexOf(node)), node];
    visiting.add(node);
    path.push(node);
    for (const next of edges.get(node) ?? []) {
      const cycle = visit(next);
      if (cycle) return cycle;
    }
    path.pop();
    visiting.delete(node);
    return null;
  };
  const cycle = visit(name);
  if (cycle) {
    throw new InputError([
      {
        loc: ["body", "bindings"],
        msg: `the bindings form a cycle: ${cycle.join(" → ")}`,
        type: "binding_cycle",
        input: bindings,
        ctx: { cycle },
      },
    ]);
  }
}

export interface RunEnvInput {
  base: Record<string, string | undefined>;
  engine: Record<string, string>;
  bindings: Record<string, string>;
  env: Record<string, string>;
  secrets: Record<string, string>;
  gpu: Record<string, string>;
}

/**
 * assembleRunEnv layers a run's environment, later layers winning: the daemon's variables
 * workloads inherit (inheritedEnv), the engine's (PORT, SERVICE_DATA_DIR, ...), binding variables, the deploy's env,
 * its secrets, and last the GPU assignment, which no one may override. It returns the keys
 * it injected (never values) for Diagnosis.
 */
export function assembleRunEnv(input: RunEnvInput): { env: Record<string, string>; injectedKeys: string[] } {
  const env = inheritedEnv(input.base);
  const injected = new Set<string>();
  for (const layer of [input.engine, input.bindings, input.env, input.secrets, input.gpu]) {
    for (const [key, value] of Object.entries(layer)) {
      env[key] = value;
      injected.add(key);
    }
  }
  return { env, injectedKeys: [...injected].sort() };
}
