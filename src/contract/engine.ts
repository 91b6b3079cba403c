/**
 * Schemas of the local engine API (../shared/spec/local-engine-api.md).
 *
 * Every route validates its input with these and declares its output with them, so the
 * document served at GET /api/openapi.json is generated from the same source the routes
 * check against and cannot drift. The link client and the cloud server import the same ones.
 */
import { type Static, Type as t } from "@sinclair/typebox";
import { MAX_RESTORE_TIMEOUT_S } from "./defaults";

/** A date-time string in RFC 3339 form, as the spec's `date-time` fields are. */
export const DateTime = t.String({ format: "date-time" });
/**
 * SafeInteger is every integer these schemas leave otherwise unbounded: within the range a JSON
 * number holds exactly (2^53 - 1), so no value is silently rounded or overflows a column.
 */
const SafeInteger = t.Integer({ minimum: Number.MIN_SAFE_INTEGER, maximum: Number.MAX_SAFE_INTEGER });
/** Duration is a non-negative count of seconds. */
const Duration = t.Number({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const NullableDateTime = t.Union([DateTime, t.Null()]);
const NullableInteger = t.Union([SafeInteger, t.Null()]);

/** Names of services, tokens and templates: lower-case DNS label rules, so they can be host names too. */
export const NAME_PATTERN = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$";
export const ServiceName = t.String({ pattern: NAME_PATTERN, minLength: 1, maxLength: 63 });

export const Role = t.Union([t.Literal("admin"), t.Literal("submitter"), t.Literal("readonly")]);
export type Role = Static<typeof Role>;
export const ROLES: readonly Role[] = ["admin", "submitter", "readonly"];

export const Token = t.Object(
  {
    id: t.String(),
    name: t.String(),
    role: Role,
    created_at: DateTime,
    max_gpus: NullableInteger,
    max_concurrent_jobs: NullableInteger,
    last_used_at: NullableDateTime,
    revoked: t.Boolean(),
    expires_at: NullableDateTime,
    scope_services: t.Array(t.String()),
  },
  { $id: "Token", description: "An access token. The secret itself is never part of this record." },
);
export type Token = Static<typeof Token>;

export const TokenCreate = t.Object(
  {
    name: t.String({ minLength: 1, maxLength: 64, pattern: "^[A-Za-z0-9][A-Za-z0-9 ._-]*$" }),
    role: t.Optional(Role),
    max_gpus: t.Optional(t.Union([t.Integer({ minimum: 0, maximum: 1024 }), t.Null()])),
    max_concurrent_jobs: t.Optional(t.Union([t.Integer({ minimum: 1, maximum: 100000 }), t.Null()])),
    expires_at: t.Optional(t.Union([DateTime, t.Null()])),
    scope_services: t.Optional(t.Array(ServiceName, { maxItems: 256, uniqueItems: true })),
  },
  { additionalProperties: false },
);
export type TokenCreate = Static<typeof TokenCreate>;

export const CreatedToken = t.Composite([Token, t.Object({ token: t.String({ description: "The secret, shown once." }) })], {
  $id: "CreatedToken",
});
export type CreatedToken = Static<typeof CreatedToken>;

export const TokenIdParams = t.Object({ id: t.String({ minLength: 1, maxLength: 64 }) });

/** DatabaseEngineName names the database engines the engine manages (src/engine/databases). */
export const DatabaseEngineName = t.Union([t.Literal("postgres"), t.Literal("mariadb"), t.Literal("redis"), t.Literal("sqlite")], {
  description: "A database engine the engine manages: it initializes, starts, checks, stops and restores it",
});

export const DeployDefaults = t.Object({
  port: t.Integer({ minimum: 0, maximum: 65535 }),
  gpus: t.Integer({ minimum: 0, maximum: 64 }),
  start: t.String({ minLength: 1 }),
  health: t.String(),
  health_start_period_s: t.Optional(
    t.Integer({
      minimum: 0,
      maximum: 86400,
      description:
        "Seconds after start during which failed health probes do not count (the app's usual start-up time); a pass ends them sooner.",
    }),
  ),
  engine: t.Optional(DatabaseEngineName),
});

export const EnvSchemaEntry = t.Object({
  name: t.String({ pattern: "^[A-Za-z_][A-Za-z0-9_]*$" }),
  required: t.Boolean(),
  secret: t.Boolean(),
});

export const AppTemplate = t.Object(
  {
    id: t.String({ pattern: NAME_PATTERN }),
    name: t.String({ minLength: 1 }),
    icon: t.String(),
    category: t.String({ minLength: 1 }),
    repo_url: t.String(),
    ref: t.String(),
    subdir: t.String(),
    ai_hint: t.String(),
    deploy_defaults: DeployDefaults,
    env_schema: t.Array(EnvSchemaEntry),
  },
  { $id: "AppTemplate", additionalProperties: false },
);
export type AppTemplate = Static<typeof AppTemplate>;

export const TemplateIdParams = t.Object({ template_id: t.String({ pattern: NAME_PATTERN, maxLength: 63 }) });

const Obj = (description: string) => t.Record(t.String(), t.Unknown(), { description });

const NullableString = t.Union([t.String(), t.Null()]);

export const ProxyTls = t.Object(
  {
    listening: t.Boolean(),
    https_port: SafeInteger,
    http_port: t.Integer({ description: "Plain HTTP: ACME http-01 answers, `.localhost` names, and a 308 to HTTPS for the rest" }),
    http_redirect: t.Boolean(),
    protocols: t.Array(t.String()),
    certificates: t.Integer({ description: "Certificates served (one per name, chosen by SNI)" }),
    leaf_lifetime_hours: SafeInteger,
    last_renewal: t.Union([t.Object({ at: DateTime, names: t.Array(t.String()) }), t.Null()]),
    max_body_bytes: SafeInteger,
    error: NullableString,
  },
  { description: "The listeners and the certificates they serve" },
);
export const ProxyCa = t.Object(
  {
    initialized: t.Boolean(),
    subject: t.String(),
    fingerprint_sha256: t.String({ description: "SHA-256 of the root certificate, as `openssl x509 -fingerprint -sha256` prints it" }),
    not_after: t.String(),
    intermediate_not_after: t.String(),
    root_path: t.String({ description: "The root certificate's file (`engine ca` prints it)" }),
    trusted_in_system: t.Boolean({ description: "Whether the root is in the system trust store (`engine trust`)" }),
    trusted_in_nss: t.Union([t.Boolean(), t.Null()], {
      description: "Whether the root is in the NSS store (Chrome, Firefox); null without certutil",
    }),
  },
  { description: "The local certificate authority" },
);
export const ProxyApex = t.Object(
  { host: t.String(), routed: t.Boolean(), upstream: t.String(), url: t.String() },
  { description: "`<hostname>.local`: routes to the engine's own API and web UI" },
);
export const ProxyRespawn = t.Object(
  {
    processes: t.Integer({ description: "Proxy processes serving now (they share the ports with SO_REUSEPORT)" }),
    pids: t.Array(SafeInteger),
    count: t.Integer({ description: "Proxy processes respawned after an unexpected exit" }),
    last_at: NullableDateTime,
    last_reason: NullableString,
    retired_on_start: t.Integer({ description: "Processes of the previous daemon retired after this one bound (restart in place)" }),
    cpus: t.Array(t.Union([SafeInteger, t.Null()]), {
      description: "Beside each of pids, the CPU its event loop is pinned to (ENGINE_PROXY_CPU_AFFINITY=auto), or null where it is not",
    }),
  },
  { description: "Proxy process restarts" },
);
export const ProxyRoutes = t.Object(
  {
    count: SafeInteger,
    items: t.Array(
      t.Object({
        host: t.String(),
        path_prefix: t.String(),
        service: t.String(),
        upstream: t.String(),
        state: t.Union([t.Literal("up"), t.Literal("starting"), t.Literal("down")], {
          description: "up: forwarded; starting: 503 with Retry-After; down: 502",
        }),
      }),
    ),
  },
  { description: "The routing table" },
);
export const ProxyMdns = t.Object(
  {
    enabled: t.Boolean(),
    backend: t.String({ description: "avahi, bonjour or off" }),
    published: t.Boolean(),
    names: t.Array(t.String()),
  },
  { description: "mDNS publication of .local names", additionalProperties: true },
);
export const ProxyAcme = t.Object(
  {
    enabled: t.Boolean(),
    directory_url: NullableString,
    orders: t.Array(
      t.Object(
        {
          domain: t.String(),
          state: t.String({ description: "pending, valid, retrying or failed" }),
          attempts: SafeInteger,
          last_error: NullableString,
          next_retry_at: NullableString,
          not_after: NullableString,
        },
        { additionalProperties: true },
      ),
    ),
  },
  { description: "ACME account and orders (public domains); never a key", additionalProperties: true },
);
export const ProxyDomain = t.Object({
  domain: t.String(),
  path_prefix: t.String(),
  service: t.String(),
  source: t.Union([t.Literal("default"), t.Literal("user")]),
  kind: t.Union([t.Literal("mdns"), t.Literal("localhost"), t.Literal("private"), t.Literal("public")]),
  url: t.String(),
  certificate: t.Object({ issuer: NullableString, source: NullableString, not_after: NullableString }),
  acme_state: NullableString,
});

export const ProxyStatus = t.Object(
  {
    state: t.String({ description: "starting, running, failed (see tls.error), stopped or disabled" }),
    mode: t.String({ description: "local-ca, local-ca+acme, or off" }),
    hostname: t.String(),
    scheme: t.String(),
    base_domain: t.String(),
    enabled: t.Boolean(),
    available: t.Boolean(),
    https_port: SafeInteger,
    tls: ProxyTls,
    ca: ProxyCa,
    apex: ProxyApex,
    respawn: ProxyRespawn,
    routes: ProxyRoutes,
    mdns: ProxyMdns,
    acme: ProxyAcme,
    domains: t.Array(ProxyDomain),
  },
  { $id: "ProxyStatus" },
);
export type ProxyStatus = Static<typeof ProxyStatus>;

export const ServiceKind = t.Union([t.Literal("batch"), t.Literal("service"), t.Literal("model"), t.Literal("database")]);
export type ServiceKind = Static<typeof ServiceKind>;
export const SERVICE_STATUSES = [
  "pending",
  "scheduled",
  "running",
  "paused",
  "completed",
  "failed",
  "cancelled",
  "retrying",
  "building",
  "degraded",
  "restarting",
  "stopped",
] as const;
export const ServiceStatus = t.Union([
  t.Literal("pending"),
  t.Literal("scheduled"),
  t.Literal("running"),
  t.Literal("paused"),
  t.Literal("completed"),
  t.Literal("failed"),
  t.Literal("cancelled"),
  t.Literal("retrying"),
  t.Literal("building"),
  t.Literal("degraded"),
  t.Literal("restarting"),
  t.Literal("stopped"),
]);

export const Diagnosis = t.Object(
  {
    service_name: t.String(),
    kind: ServiceKind,
    status: ServiceStatus,
    error: t.Union([
      t.Object({
        class: t.String(),
        message: t.String(),
        key_line: t.Union([t.String(), t.Null()], {
          description:
            "The line of the last crashed run's output that says what went wrong (an exception, an error: or FATAL line), stderr first, at most 300 characters, secrets redacted; null when none was found.",
        }),
      }),
      t.Null(),
    ]),
    forensics: t.Object({
      last_exit_code: NullableInteger,
      oom_killed: t.Boolean(),
      gpu_oom: t.Boolean(),
      priv_denied: t.Boolean(),
      last_crash_at: NullableDateTime,
    }),
    restarts: t.Object({
      max_restarts: SafeInteger,
      window_seconds: SafeInteger,
      policy: t.String(),
      count: SafeInteger,
      window_start: NullableDateTime,
      last_exit_at: NullableDateTime,
      backoff_s: SafeInteger,
      next_retry_in_s: NullableInteger,
    }),
    health: t.Object({
      spec: t.Union([Obj("Health probe definition"), t.Null()]),
      probe: t.Union([Obj("Last probe result"), t.Null()]),
      observations: t.Array(t.String()),
    }),
    bindings: t.Object({ waiting: t.Boolean(), messages: t.Array(t.String()) }),
    build: t.Object({ last_result: t.Union([t.String(), t.Null()]), version: SafeInteger, reason: t.Union([t.String(), t.Null()]) }),
    injected_env_keys_source: t.String(),
    remediation: t.Union([t.Object({ code: t.String(), detail: t.String() }), t.Null()]),
    desired_state: t.String(),
    last_deploy: t.Union([Obj("Last deployment"), t.Null()]),
    last_run: t.Union([Obj("Last run"), t.Null()]),
    last_dump: t.Union([Obj("Last database dump"), t.Null()]),
    injected_env_keys: t.Array(t.String()),
    pending_env_keys: t.Array(t.String()),
    logs: t.Array(t.Record(t.String(), t.Unknown())),
    user: t.Union([t.String(), t.Null()], {
      description:
        "The OS user the workload runs as (a root engine runs each service as its own user, eng-<name>, unless an admin chose one; a managed Redis or SQLite database too; PostgreSQL and MariaDB as postgres and mysql); null when the engine runs it as its own user (an unprivileged engine).",
    }),
  },
  { $id: "Diagnosis" },
);
export type Diagnosis = Static<typeof Diagnosis>;

/** Environment variable names: POSIX portable names. */
const EnvName = t.String({ pattern: "^[A-Za-z_][A-Za-z0-9_]*$", maxLength: 128 });
// additionalProperties: false makes a key outside EnvName an error; without it a Record checks
// only the keys its pattern matches, and `"env":["x"]` passed as {"0":"x"} (issue 13).
const EnvMap = t.Record(EnvName, t.String({ maxLength: 65536 }), { maxProperties: 256, additionalProperties: false });
/** SecretMap is EnvMap whose values are secrets: writeOnly, so a 422 never echoes one. */
const SecretMap = t.Record(EnvName, t.String({ maxLength: 65536, writeOnly: true }), { maxProperties: 256, additionalProperties: false });

export const RestartPolicyName = t.Union([t.Literal("always"), t.Literal("on-failure"), t.Literal("never")]);
export type RestartPolicyName = Static<typeof RestartPolicyName>;
export const RestartSpec = t.Object(
  {
    policy: t.Optional(RestartPolicyName),
    max_restarts: t.Optional(t.Integer({ minimum: 0, maximum: 1000 })),
    window_seconds: t.Optional(t.Integer({ minimum: 1, maximum: 604800 })),
    backoff_s: t.Optional(t.Integer({ minimum: 0, maximum: 3600 })),
  },
  { additionalProperties: false },
);
export const HealthSpec = t.Object(
  {
    type: t.Optional(
      t.Union([t.Literal("http"), t.Literal("tcp"), t.Literal("exec")], {
        description:
          "The probe. Left out, the other fields change the template's probe (e.g. only start_period_s); 422 when there is no template probe.",
      }),
    ),
    path: t.Optional(t.String({ pattern: "^/", maxLength: 2048 })),
    port: t.Optional(t.Integer({ minimum: 1, maximum: 65535 })),
    command: t.Optional(
      t.Union([t.String({ minLength: 1, maxLength: 4096 }), t.Array(t.String({ maxLength: 4096 }), { minItems: 1, maxItems: 256 })]),
    ),
    interval_s: t.Optional(t.Number({ exclusiveMinimum: 0, maximum: 3600 })),
    timeout_s: t.Optional(t.Number({ exclusiveMinimum: 0, maximum: 3600 })),
    failure_threshold: t.Optional(t.Integer({ minimum: 1, maximum: 100 })),
    start_period_s: t.Optional(
      t.Integer({
        minimum: 0,
        maximum: 86400,
        description:
          "Grace after the workload starts: failed probes do not count (no degraded, no restart) until it runs out or a probe passes. Default: the template's, else 600 for kind model and 10 for the others; 0 turns it off.",
      }),
    ),
  },
  { additionalProperties: false },
);
export const BuildSpec = t.Object(
  {
    repo_url: t.String({ minLength: 1, maxLength: 2048 }),
    ref: t.Optional(t.String({ minLength: 1, maxLength: 255 })),
    subdir: t.Optional(t.String({ maxLength: 1024 })),
    command: t.Optional(t.String({ maxLength: 65536 })),
  },
  { additionalProperties: false },
);

export const ServiceDeploy = t.Object(
  {
    name: ServiceName,
    kind: t.Optional(ServiceKind),
    command: t.Optional(
      t.Union([t.String({ minLength: 1, maxLength: 65536 }), t.Array(t.String({ maxLength: 65536 }), { minItems: 1, maxItems: 1024 })]),
    ),
    template_id: t.Optional(t.String({ pattern: NAME_PATTERN, maxLength: 63 })),
    cwd: t.Optional(t.String({ pattern: "^/", maxLength: 4096 })),
    env: t.Optional(EnvMap),
    secrets: t.Optional(SecretMap),
    gpus: t.Optional(t.Integer({ minimum: 0, maximum: 64 })),
    gpu_memory_mb: t.Optional(t.Integer({ minimum: 1, maximum: 4194304 })),
    memory_mb: t.Optional(t.Integer({ minimum: 4, maximum: 16777216 })),
    port: t.Optional(t.Integer({ minimum: 1, maximum: 65535 })),
    priority: t.Optional(t.Integer({ minimum: -1000, maximum: 1000 })),
    stop_timeout_s: t.Optional(t.Integer({ minimum: 0, maximum: 3600 })),
    restart: t.Optional(RestartSpec),
    health: t.Optional(t.Union([HealthSpec, t.Null()])),
    build: t.Optional(t.Union([BuildSpec, t.Null()])),
    bindings: t.Optional(t.Array(ServiceName, { maxItems: 64, uniqueItems: true })),
    engine: t.Optional(DatabaseEngineName),
    user: t.Optional(
      t.String({
        minLength: 1,
        maxLength: 32,
        pattern: "^[A-Za-z0-9_][A-Za-z0-9_.-]*[$]?$",
        description:
          "Admin only: the existing OS user (name or numeric uid) the workload runs as instead of the service's own user, root included. 403 forbidden for other roles; 422 when the host has no such user.",
      }),
    ),
  },
  { additionalProperties: false, $id: "ServiceDeploy" },
);
export type ServiceDeploy = Static<typeof ServiceDeploy>;

/**
 * ServicePatch changes some settings of a service: a new version is made from the latest one
 * with these fields changed (PATCH /api/services/{ident}, decision 180). A field left out keeps
 * its value; `null` resets an optional field (no memory limit, no port, no health check, no
 * build, the default priority, ...). `env` and `secrets` merge key by key, a key set to null
 * removing it; `restart` merges field by field; `health`, `build`, `command` and `bindings`
 * are replaced whole. What a service is (name, kind, database engine, template) is not patched.
 */
export const ServicePatch = t.Object(
  {
    command: t.Optional(
      t.Union([t.String({ minLength: 1, maxLength: 65536 }), t.Array(t.String({ maxLength: 65536 }), { minItems: 1, maxItems: 1024 })]),
    ),
    cwd: t.Optional(t.Union([t.String({ pattern: "^/", maxLength: 4096 }), t.Null()])),
    env: t.Optional(
      t.Union([
        t.Record(EnvName, t.Union([t.String({ maxLength: 65536 }), t.Null()]), { maxProperties: 256, additionalProperties: false }),
        t.Null(),
      ]),
    ),
    secrets: t.Optional(
      t.Union([
        t.Record(EnvName, t.Union([t.String({ maxLength: 65536, writeOnly: true }), t.Null()]), {
          maxProperties: 256,
          additionalProperties: false,
        }),
        t.Null(),
      ]),
    ),
    gpus: t.Optional(t.Union([t.Integer({ minimum: 0, maximum: 64 }), t.Null()])),
    gpu_memory_mb: t.Optional(t.Union([t.Integer({ minimum: 1, maximum: 4194304 }), t.Null()])),
    memory_mb: t.Optional(t.Union([t.Integer({ minimum: 4, maximum: 16777216 }), t.Null()])),
    port: t.Optional(t.Union([t.Integer({ minimum: 1, maximum: 65535 }), t.Null()])),
    priority: t.Optional(t.Union([t.Integer({ minimum: -1000, maximum: 1000 }), t.Null()])),
    stop_timeout_s: t.Optional(t.Union([t.Integer({ minimum: 0, maximum: 3600 }), t.Null()])),
    restart: t.Optional(t.Union([RestartSpec, t.Null()])),
    health: t.Optional(t.Union([HealthSpec, t.Null()])),
    build: t.Optional(t.Union([BuildSpec, t.Null()])),
    bindings: t.Optional(t.Union([t.Array(ServiceName, { maxItems: 64, uniqueItems: true }), t.Null()])),
    user: t.Optional(
      t.Union([
        t.String({
          minLength: 1,
          maxLength: 32,
          pattern: "^[A-Za-z0-9_][A-Za-z0-9_.-]*[$]?$",
          description: "Admin only, as in a deploy; null: the service's own user again.",
        }),
        t.Null(),
      ]),
    ),
  },
  { additionalProperties: false, $id: "ServicePatch" },
);
export type ServicePatch = Static<typeof ServicePatch>;

const DATABASE_CONNECTION_FIELDS = {
  engine: DatabaseEngineName,
  host: t.Union([t.String(), t.Null()], { description: "Where clients connect (loopback); null for SQLite, a file" }),
  port: NullableInteger,
  database: NullableString,
  user: NullableString,
  path: t.Union([t.String(), t.Null()], { description: "SQLite: the database file" }),
};

/** DatabaseConnection is how clients reach a managed database, its password masked (decision 181). */
export const DatabaseConnection = t.Object(
  {
    ...DATABASE_CONNECTION_FIELDS,
    url: t.String({
      description:
        "The URL bound services get (DATABASE_URL; REDIS_URL for Redis) with the password shown as ****; GET /api/services/{ident}/connection (admin) answers it in full",
    }),
  },
  { $id: "DatabaseConnection", description: "A managed database's connection details, the password masked" },
);
export type DatabaseConnection = Static<typeof DatabaseConnection>;

/** RevealedConnection is DatabaseConnection with the password: admin only, never logged. */
export const RevealedConnection = t.Object(
  {
    ...DATABASE_CONNECTION_FIELDS,
    url: t.String({ description: "The URL in full, password included" }),
    password: t.Union([t.String(), t.Null()], { description: "The password in the URL; null for SQLite" }),
  },
  { $id: "RevealedConnection", description: "A managed database's connection details in full (admin only)" },
);
export type RevealedConnection = Static<typeof RevealedConnection>;

export const ServiceRecord = t.Object(
  {
    id: t.String(),
    name: t.String(),
    kind: ServiceKind,
    status: ServiceStatus,
    status_message: t.Union([t.String(), t.Null()]),
    desired_state: t.String(),
    version: SafeInteger,
    pid: NullableInteger,
    port: NullableInteger,
    command: t.Array(t.String()),
    template_id: t.Union([t.String(), t.Null()]),
    cwd: t.Union([t.String(), t.Null()]),
    env: t.Record(t.String(), t.String()),
    secret_keys: t.Array(t.String(), { description: "Names of the secrets; their values are never returned." }),
    gpus: SafeInteger,
    gpu_memory_mb: SafeInteger,
    gpu_devices: t.Array(t.String(), { description: "Devices the running workload holds (CUDA_VISIBLE_DEVICES entries)." }),
    memory_mb: NullableInteger,
    priority: SafeInteger,
    restart: t.Object({ policy: RestartPolicyName, max_restarts: SafeInteger, window_seconds: SafeInteger, backoff_s: SafeInteger }),
    health: t.Union([Obj("Health probe definition"), t.Null()]),
    build: t.Union([Obj("Build definition"), t.Null()]),
    bindings: t.Array(t.String()),
    restarts: t.Integer({ description: "Restarts counted in the current window." }),
    user: t.Union([t.String(), t.Null()], {
      description: "The OS user the workload runs as; null when the engine runs it as its own user (see Diagnosis.user).",
    }),
    connection: t.Union([DatabaseConnection, t.Null()], {
      description: "A database the engine manages: how to connect, the password masked; null for other services",
    }),
    created_at: DateTime,
    updated_at: DateTime,
    started_at: NullableDateTime,
  },
  { $id: "Service" },
);
export type ServiceRecord = Static<typeof ServiceRecord>;

export const ServiceAction = t.Object({
  ident: t.String({ minLength: 1, maxLength: 128 }),
  action: t.Union([t.Literal("start"), t.Literal("stop"), t.Literal("restart"), t.Literal("pause"), t.Literal("resume")]),
});
export const LogsQuery = t.Object({
  tail: t.Optional(t.String({ pattern: "^[0-9]{1,6}$", description: "How many of the latest lines (default 100)" })),
  follow: t.Optional(t.Union([t.Literal("true"), t.Literal("false"), t.Literal("1"), t.Literal("0")])),
});
/**
 * ServiceReadQuery makes a read of one service a blocking query (decision 503), as Consul's and
 * Nomad's are: with `index` (the `X-Engine-Index` of the record the client has) and `wait`, the
 * answer waits until the record differs from that one, or `wait` seconds have passed.
 */
export const ServiceReadQuery = t.Object({
  index: t.Optional(
    t.String({
      pattern: "^[0-9a-z]{1,32}$",
      description: "The X-Engine-Index of the record the client has: answer once the record differs",
    }),
  ),
  wait: t.Optional(
    t.String({
      pattern: "^([1-9][0-9]?|[12][0-9]{2}|300)$",
      description: "With index: wait up to this many seconds (1-300) for the record to change; then answer it as it is",
    }),
  ),
});
export const LogLine = t.Object({ ts: t.String(), stream: t.String(), line: t.String() });
export type LogLine = Static<typeof LogLine>;

export const GpuInventoryRecord = t.Object(
  {
    source: t.String({ description: "nvidia-smi, declared (ENGINE_GPUS: not detected) or none" }),
    refreshed_at: t.Union([DateTime, t.Null()]),
    warnings: t.Array(t.String()),
    devices: t.Array(
      t.Object({
        index: SafeInteger,
        uuid: t.String(),
        name: t.String(),
        source: t.String(),
        memory_total_mb: SafeInteger,
        memory_used_mb: NullableInteger,
        utilization_pct: NullableInteger,
        mig_profile: t.Union([t.String(), t.Null()]),
        visible_id: t.String(),
        reserved_mb: SafeInteger,
        holders: t.Array(t.Object({ service: t.String(), whole: t.Boolean(), memory_mb: SafeInteger })),
      }),
    ),
  },
  { $id: "GpuInventory" },
);
export type GpuInventoryRecord = Static<typeof GpuInventoryRecord>;

/**
 * ServiceStatsRecord is what the live workloads use now, read from /proc: `engine top` turns
 * two samples' cpu_seconds into a CPU share. Only services with a live process are listed.
 */
export const ServiceStatsRecord = t.Object(
  {
    sampled_at: DateTime,
    services: t.Array(
      t.Object({
        name: t.String(),
        pid: SafeInteger,
        processes: t.Integer({ minimum: 0, description: "The workload's process group and its descendants" }),
        cpu_seconds: t.Number({ minimum: 0, description: "User + system CPU time of those processes so far (a counter)" }),
        rss_bytes: t.Integer({ minimum: 0, description: "Their resident memory, summed" }),
      }),
    ),
  },
  { $id: "ServiceStats" },
);
export type ServiceStatsRecord = Static<typeof ServiceStatsRecord>;

/** HISTORY_INTERVAL_S is the resolution of the in-process metrics history; HISTORY_WINDOW_S how far back it reaches. */
export const HISTORY_INTERVAL_S = 5;
export const HISTORY_WINDOW_S = 3600;

/** NullableIntegerSeries is one value per sample of `times`, null where nothing was measured then. */
const NullableIntegerSeries = t.Array(NullableInteger);

export const MetricsHistoryQuery = t.Object({
  since: t.Optional(
    t.String({
      pattern: "^[0-9]{1,12}(\\.[0-9]{1,3})?$",
      description: "Only samples taken after this time (Unix seconds, exclusive): pass the last `times` value to get what is new",
    }),
  ),
  service: t.Optional(t.String({ minLength: 1, maxLength: 128, description: "Only this service (name or id); GPUs are always given" })),
});

/**
 * MetricsHistory is the engine's in-process history (decision 331): the last hour at 5-s
 * resolution, kept in memory only. It is columnar, as charts draw it: `times` holds each
 * sample's time and every series has one value per time, null where nothing was measured.
 */
export const MetricsHistory = t.Object(
  {
    interval_s: t.Integer({ minimum: 1, maximum: 3600, description: "Seconds between samples" }),
    window_s: t.Integer({ minimum: 1, maximum: 86400, description: "How far back the history reaches" }),
    now: t.Number({ minimum: 0, description: "The engine's clock when it answered (Unix seconds)" }),
    times: t.Array(t.Number({ minimum: 0 }), { description: "Each sample's time (Unix seconds, with milliseconds), oldest first" }),
    gpus: t.Array(
      t.Object({
        index: SafeInteger,
        uuid: t.String(),
        name: t.String(),
        memory_total_mb: NullableInteger,
        utilization_pct: NullableIntegerSeries,
        memory_used_mb: NullableIntegerSeries,
      }),
    ),
    services: t.Array(
      t.Object({
        id: t.String(),
        name: t.String(),
        cpu_pct: t.Array(t.Union([t.Number({ minimum: 0 }), t.Null()]), {
          description: "CPU time over the interval before the sample, in percent of one core (200 = two cores busy)",
        }),
        rss_bytes: t.Array(t.Union([t.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER }), t.Null()]), {
          description: "Resident memory of all the service's processes",
        }),
        gpu_memory_mb: t.Array(t.Union([t.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER }), t.Null()]), {
          description: "GPU memory its processes hold (nvidia-smi --query-compute-apps); null without nvidia-smi",
        }),
      }),
    ),
  },
  { $id: "MetricsHistory" },
);
export type MetricsHistory = Static<typeof MetricsHistory>;

export const ServiceIdentParams = t.Object({ ident: t.String({ minLength: 1, maxLength: 128 }) });
export const DatabaseNameParams = t.Object({ name: ServiceName });
export const DomainParams = t.Object({
  name: ServiceName,
  domain: t.String({ minLength: 1, maxLength: 253, pattern: "^[A-Za-z0-9*]([A-Za-z0-9.-]*[A-Za-z0-9])?$" }),
});

export const RestoreRequest = t.Object({
  dump: t.String({
    minLength: 1,
    maxLength: 4096,
    description: "The dump: an absolute path on the engine's host (a file, or a pg_dump directory), a file:// URL or an https:// URL",
  }),
  timeout_s: t.Integer({ minimum: 1, maximum: MAX_RESTORE_TIMEOUT_S }),
});
export const RestoreResult = t.Object(
  { service_name: t.String(), dump: t.String(), engine: t.String(), duration_s: Duration },
  { $id: "RestoreResult" },
);

export const DomainAdd = t.Object(
  {
    domain: t.String({ minLength: 1, maxLength: 253 }),
    path_prefix: t.Optional(t.String({ minLength: 1, maxLength: 1024, description: "Route only this path prefix (default /)" })),
  },
  { additionalProperties: false },
);
export const DomainAdded = t.Object(
  {
    service_name: t.String(),
    domain: t.String(),
    path_prefix: t.String(),
    kind: t.String(),
    url: t.String(),
    certificate: t.Union([t.Object({ issuer: t.String(), not_after: DateTime }), t.Null()]),
  },
  { $id: "DomainAdded" },
);
export const ServiceNameParams = t.Object({ name: ServiceName });

export const DomainRemovalResult = t.Object(
  { service_name: t.String(), domain: t.String(), removed: t.Boolean() },
  { $id: "DomainRemovalResult" },
);

export const DaemonRestartRequest = t.Object({ drain_timeout_s: t.Integer({ minimum: 0, maximum: 3600 }) });
export const DaemonUpgradeRequest = t.Object({
  binary: t.String({
    minLength: 1,
    maxLength: 4096,
    description:
      "Absolute path, on the engine's machine, of the new engine binary: a regular file, executable, owned by root or the engine's user, not writable by others",
  }),
  drain_timeout_s: t.Optional(
    t.Integer({ minimum: 0, maximum: 3600, description: "How long requests in flight may take to finish (default 30)" }),
  ),
  health_timeout_s: t.Optional(
    t.Integer({
      minimum: 1,
      maximum: 600,
      description: "How long the new binary has to answer /api/health before the old one is put back (default 60)",
    }),
  ),
});
export type DaemonUpgradeRequest = Static<typeof DaemonUpgradeRequest>;
export const DaemonUpgradeAccepted = t.Object(
  {
    from_version: t.String(),
    to_version: t.String(),
    binary: t.String({ description: "The running binary's path, where the new binary now is" }),
    previous: t.String({ description: "Where the previous binary is kept, for a rollback" }),
    store_schema: t.String({ description: "The newest store migration the new binary knows" }),
  },
  { $id: "DaemonUpgradeAccepted" },
);
export type DaemonUpgradeAccepted = Static<typeof DaemonUpgradeAccepted>;
export const Empty = t.Object({}, { additionalProperties: false });

export const VcsTokenPush = t.Object({
  // A code host's installation id: positive and exact (a JSON number past 2^53 - 1 is rounded).
  installation_id: t.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER }),
  token: t.String({ minLength: 1, maxLength: 4096, writeOnly: true, description: "The code-host credential; never returned." }),
  expires_at: DateTime,
  issued_at: DateTime,
  repos: t.Array(t.String({ minLength: 1, maxLength: 200 }), { maxItems: 10000 }),
});
export type VcsTokenPush = Static<typeof VcsTokenPush>;

/**
 * LinkTunnel is the state of the linked engine's tunnel to its console (the relay): one
 * outbound WebSocket the console reaches the engine through (docs/state-machines.md).
 */
export const LinkTunnel = t.Object(
  {
    state: t.Union([
      t.Literal("not_linked"),
      t.Literal("connecting"),
      t.Literal("connected"),
      t.Literal("disconnected"),
      t.Literal("stopped"),
    ]),
    since: DateTime,
    url: t.Union([t.String(), t.Null()], { description: "The console's tunnel endpoint (ws:// or wss://)" }),
    connected_at: NullableDateTime,
    last_error: t.Union([t.String(), t.Null()], { description: "Why the last attempt failed or the last tunnel ended" }),
    last_error_at: NullableDateTime,
    next_attempt_at: t.Union([DateTime, t.Null()], { description: "When a disconnected tunnel tries again" }),
    failures: t.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER }),
  },
  { $id: "LinkTunnel" },
);
export type LinkTunnel = Static<typeof LinkTunnel>;

/** LinkStatus says whether the engine is linked to a cloud console, and as which node; never the credential. */
export const LinkStatus = t.Object(
  {
    linked: t.Boolean(),
    cloud_url: t.Union([t.String(), t.Null()]),
    node_id: t.Union([t.String(), t.Null()]),
    slug: t.Union([t.String(), t.Null()]),
    account_id: t.Union([t.String(), t.Null()]),
    hosted_base_domain: t.Union([t.String(), t.Null()]),
    linked_at: t.Union([t.String(), t.Null()]),
    metadata_refreshed_at: t.Union([t.String(), t.Null()]),
    tunnel: LinkTunnel,
  },
  { $id: "LinkStatus" },
);
export type LinkStatus = Static<typeof LinkStatus>;
export const VcsTokenPushResult = t.Object(
  { applied: t.Boolean(), installation_id: SafeInteger, expires_at: DateTime, repos_count: SafeInteger },
  { $id: "VcsTokenPushResult" },
);

export const Health = t.Object({ status: t.Literal("ok"), version: t.String(), pid: SafeInteger, uptime_s: Duration });

/**
 * Ready says whether the daemon can do its work now: its database answers and its data dir
 * takes writes (issue 13: a full disk shows here, while health touches nothing).
 */
export const Ready = t.Object({
  ready: t.Boolean({ description: "database and data_dir_writable" }),
  database: t.Boolean({ description: "The database answers a query" }),
  data_dir_writable: t.Boolean({ description: "A small file can be written in the data dir (false on a full disk)" }),
  data_dir_free_bytes: t.Integer({ minimum: 0, description: "Free bytes for the engine on the data dir's filesystem" }),
  log_writable: t.Boolean({ description: "Every log sink writes (a failing one drops and counts lines)" }),
});
export type Ready = Static<typeof Ready>;

export const ValidationErrorItem = t.Object({
  loc: t.Array(t.Union([t.String(), SafeInteger])),
  msg: t.String(),
  type: t.String(),
  input: t.Unknown(),
  ctx: t.Record(t.String(), t.Unknown()),
});
export const ValidationErrorBody = t.Object({ detail: t.Array(ValidationErrorItem) }, { $id: "ValidationError" });
export type ValidationErrorItem = Static<typeof ValidationErrorItem>;

export const ErrorBody = t.Object({ error: t.Object({ code: t.String(), message: t.String(), request_id: t.String() }) }, { $id: "Error" });
export type ErrorBody = Static<typeof ErrorBody>;

/**
 * errorResponses documents, for OpenAPI, the error statuses a route can answer: 422 with the
 * validation body, every other status with the error body.
 */
export function errorResponses(...statuses: number[]) {
  const out: Record<number, typeof ErrorBody | typeof ValidationErrorBody> = {};
  for (const status of statuses) out[status] = status === 422 ? ValidationErrorBody : ErrorBody;
  return out;
}

/** AUTHED are the statuses every authenticated route can answer. */
export const AUTHED = [401, 403] as const;
