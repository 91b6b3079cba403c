import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { invalid, LOG_LEVELS, type LogLevel, positiveInteger, userDataDir } from "../lib/config";
import { ProxyList } from "../lib/forwarded";
import { VERSION } from "../lib/version";

/**
 * CloudRole decides which modules a process starts: the API, the background worker, the
 * provisioner of hosted machines, or all three.
 */
export type CloudRole = "api" | "worker" | "provisioner" | "all";
export const CLOUD_ROLES: readonly CloudRole[] = ["api", "worker", "provisioner", "all"];

/** BOX_PROVIDERS are the hosted-machine providers a console can run: `off` offers no hosted machines. */
export const BOX_PROVIDERS = ["local", "scripted", "off"] as const;
export type BoxProviderName = (typeof BOX_PROVIDERS)[number];

/** ManagedConfig configures hosted machines (src/cloud/managed). */
export interface ManagedConfig {
  /** provider runs the boxes: `local` (engine processes on this host, the default), `scripted` (local with faults, tests), `off`. */
  provider: BoxProviderName;
  /** releases maps each engine version a box may run to the command that runs it; the newest is the one offered. */
  releases: Record<string, string[]>;
  /** templateVersion is the version of what a new box is made with, shown in the allocation view. */
  templateVersion: string;
  /** sleepAfterMs puts a box to sleep after this long without a user's request; 0 never. */
  sleepAfterMs: number;
  /** backupRetentionMs is how long a backup (and a deleted box's tombstone) is kept. */
  backupRetentionMs: number;
  /** faults is the scripted provider's fault script (JSON), for tests that run the console as a process. */
  faults: string | undefined;
}

/** SOCIAL_PROVIDERS are the two social sign-in providers the console offers (the contract allows exactly two). */
export const SOCIAL_PROVIDERS = ["github", "google"] as const;
export type SocialProvider = (typeof SOCIAL_PROVIDERS)[number];

/**
 * OIDC_AUTH_METHODS are how the console may authenticate at the token endpoint (RFC 6749
 * §2.3.1): the secret in a Basic header, its id and secret form-encoded first (so a hyphen is
 * sent as `%2D`), or both in the request body, which some providers need because they use the
 * Basic user name undecoded.
 */
export const OIDC_AUTH_METHODS = ["client_secret_basic", "client_secret_post"] as const;
export type OidcAuthMethod = (typeof OIDC_AUTH_METHODS)[number];

/** OidcConfig points the console at its OpenID provider; absent, sign-in answers 404/503 and the rest works. */
export interface OidcConfig {
  issuer: string;
  clientId: string;
  /** clientSecret authenticates the console at the token endpoint (see authMethod); never returned or logged. */
  clientSecret: string;
  /** authMethod is how the secret is sent to the token endpoint: a Basic header (the default) or the body. */
  authMethod: OidcAuthMethod;
  /** socialProviders are the social providers the OpenID provider brokers: the buttons /signin shows, the values /api/auth/social accepts. */
  socialProviders: SocialProvider[];
  /** providerHintParam is the authorization parameter that names the social provider to the IdP. */
  providerHintParam: string;
  /** publishableKey is the IdP's browser-safe key, shown by provider-config (empty when the IdP has none). */
  publishableKey: string;
  /** extraCaFile is a PEM bundle trusted for the IdP's TLS (a private test CA). */
  extraCaFile: string | undefined;
}

/** CloudConfig is the console's whole configuration, validated once at start-up. */
export interface CloudConfig {
  dataDir: string;
  host: string;
  port: number;
  role: CloudRole;
  /** databaseUrl is `sqlite://<file>` (the embedded default) or `postgres://...` (several replicas). */
  databaseUrl: string;
  /** publicUrl is where browsers and machines reach the console; it builds verification and callback URLs. */
  publicUrl: string;
  /** hostedBaseDomain is the domain hosted machines live under; link metadata publishes it. */
  hostedBaseDomain: string;
  logLevel: LogLevel;
  logToStdout: boolean;
  /**
   * trustedProxies are the reverse proxies whose X-Forwarded-For is believed (addresses and
   * CIDR ranges); empty by default, so the socket's peer is the client (docs/decisions.md 161).
   */
  trustedProxies: ProxyList;
  /** secretKey (base64, 32 bytes) seals secrets that must be read again; by default a 0600 file in the data dir. */
  secretKey: string | undefined;
  /** sessionIdleMs and sessionAbsoluteMs bound a session: renewed by use up to the absolute limit (ASVS 7.3). */
  sessionIdleMs: number;
  sessionAbsoluteMs: number;
  /** rateLimits keeps token buckets in this process (one replica) or in the database (several). */
  rateLimits: "memory" | "database";
  oidc: OidcConfig | null;
  /**
   * cimdAllowLoopback lets an assistant's client id be a metadata document on a loopback
   * address, over plain http too (ENGINE_CLOUD_CIMD_ALLOW_LOOPBACK=1). For tests and
   * development only: a console on the internet must never fetch from its own machine.
   */
  cimdAllowLoopback: boolean;
  /**
   * metricsToken is the bearer token GET /metrics wants (ENGINE_CLOUD_METRICS_TOKEN, 16+
   * characters); unset, /metrics answers only a direct loopback peer (docs/decisions.md 330).
   */
  metricsToken: string | undefined;

  managed: ManagedConfig;
}

/** CloudConfigInput is what flags and the environment may set; every field is optional. */
export interface CloudConfigInput {
  dataDir?: string;
  host?: string;
  port?: string | number;
  role?: string;
  databaseUrl?: string;
  publicUrl?: string;
  hostedBaseDomain?: string;
  logLevel?: string;
  logToStdout?: boolean;
  /** trustedProxies is a comma-separated list of addresses and CIDR ranges (or the list itself). */
  trustedProxies?: string | readonly string[];
  /** trustForwardedFor is the retired ENGINE_CLOUD_TRUST_FORWARDED_FOR: set, start-up fails and names its replacement. */
  trustForwardedFor?: string;
  secretKey?: string;
  sessionIdleHours?: string | number;
  sessionAbsoluteDays?: string | number;
  rateLimits?: string;
  oidcIssuer?: string;
  oidcClientId?: string;
  oidcClientSecret?: string;
  oidcProviderHintParam?: string;
  oidcPublishableKey?: string;
  oidcCaFile?: string;
  oidcAuthMethod?: string;
  /** oidcSocialProviders is a comma-separated list of SOCIAL_PROVIDERS (or the list itself). */
  oidcSocialProviders?: string | readonly string[];
  /** cimdAllowLoopback is ENGINE_CLOUD_CIMD_ALLOW_LOOPBACK: `1`/`true` or `0`/`false` (tests and development only). */
  cimdAllowLoopback?: string | boolean;
  /** metricsToken is ENGINE_CLOUD_METRICS_TOKEN, the bearer token of GET /metrics. */
  metricsToken?: string;

  boxProvider?: string;
  /** boxEngine is the engine a box runs: a path to the binary or to cli/engine.ts (run with this Bun). */
  boxEngine?: string;
  /** boxReleases is `version=path,version=path`: each release a box may run. */
  boxReleases?: string;
  boxTemplateVersion?: string;
  boxSleepAfterMin?: string | number;
  boxBackupRetentionDays?: string | number;
  boxFaults?: string;
}

export const DEFAULT_CLOUD_PORT = 8787;

/** cloudConfigFromEnv reads DATABASE_URL and the ENGINE_CLOUD_* variables: the only place the console reads process.env. */
export function cloudConfigFromEnv(env: Record<string, string | undefined> = process.env): CloudConfigInput {
  return {
    dataDir: env.ENGINE_CLOUD_DATA_DIR || undefined,
    host: env.ENGINE_CLOUD_HOST || undefined,
    port: env.ENGINE_CLOUD_PORT || undefined,
    role: env.ENGINE_CLOUD_ROLE || undefined,
    databaseUrl: env.DATABASE_URL || undefined,
    publicUrl: env.ENGINE_CLOUD_PUBLIC_URL || undefined,
    hostedBaseDomain: env.ENGINE_CLOUD_HOSTED_BASE_DOMAIN || undefined,
    logLevel: env.ENGINE_CLOUD_LOG_LEVEL || undefined,
    trustedProxies: env.ENGINE_CLOUD_TRUSTED_PROXIES || undefined,
    trustForwardedFor: env.ENGINE_CLOUD_TRUST_FORWARDED_FOR || undefined,
    secretKey: env.ENGINE_CLOUD_SECRET_KEY || undefined,
    sessionIdleHours: env.ENGINE_CLOUD_SESSION_IDLE_HOURS || undefined,
    sessionAbsoluteDays: env.ENGINE_CLOUD_SESSION_ABSOLUTE_DAYS || undefined,
    rateLimits: env.ENGINE_CLOUD_RATE_LIMITS || undefined,
    oidcIssuer: env.ENGINE_CLOUD_OIDC_ISSUER || undefined,
    oidcClientId: env.ENGINE_CLOUD_OIDC_CLIENT_ID || undefined,
    oidcClientSecret: env.ENGINE_CLOUD_OIDC_CLIENT_SECRET || undefined,
    oidcProviderHintParam: env.ENGINE_CLOUD_OIDC_PROVIDER_PARAM || undefined,
    oidcPublishableKey: env.ENGINE_CLOUD_OIDC_PUBLISHABLE_KEY || undefined,
    oidcCaFile: env.ENGINE_CLOUD_OIDC_CA_FILE || undefined,
    oidcAuthMethod: env.ENGINE_CLOUD_OIDC_AUTH_METHOD || undefined,
    oidcSocialProviders: env.ENGINE_CLOUD_OIDC_SOCIAL_PROVIDERS || undefined,
    cimdAllowLoopback: env.ENGINE_CLOUD_CIMD_ALLOW_LOOPBACK || undefined,
    metricsToken: env.ENGINE_CLOUD_METRICS_TOKEN || undefined,

    boxProvider: env.ENGINE_CLOUD_BOX_PROVIDER || undefined,
    boxEngine: env.ENGINE_CLOUD_BOX_ENGINE || undefined,
    boxReleases: env.ENGINE_CLOUD_BOX_RELEASES || undefined,
    boxTemplateVersion: env.ENGINE_CLOUD_BOX_TEMPLATE_VERSION || undefined,
    boxSleepAfterMin: env.ENGINE_CLOUD_BOX_SLEEP_AFTER_MIN || undefined,
    boxBackupRetentionDays: env.ENGINE_CLOUD_BOX_BACKUP_RETENTION_DAYS || undefined,
    boxFaults: env.ENGINE_CLOUD_BOX_FAULTS || undefined,
  };
}

/**
 * engineCommand turns the path of an engine into the command that runs it: a source file
 * (cli/engine.ts) runs with this Bun, a binary runs as it is.
 */
function engineCommand(path: string): string[] {
  const absolute = resolve(path);
  return /\.(ts|js)$/.test(absolute) ? [process.execPath, absolute] : [absolute];
}

/**
 * defaultBoxEngine is the engine a box runs when none is configured: the `engine` binary beside
 * a compiled engine-cloud (dist/engine beside dist/engine-cloud), or this checkout's
 * cli/engine.ts when the console runs from source.
 */
function defaultBoxEngine(): string {
  const source = join(import.meta.dir, "..", "..", "cli", "engine.ts");
  if (existsSync(source)) return source;
  return join(dirname(process.execPath), "engine");
}

/** resolveManaged reads the hosted-machine settings. */
function resolveManaged(merged: CloudConfigInput): ManagedConfig {
  const provider = (merged.boxProvider ?? "local") as BoxProviderName;
  if (!BOX_PROVIDERS.includes(provider)) throw invalid("box_provider", `must be one of ${BOX_PROVIDERS.join(", ")}`, merged.boxProvider);
  const releases: Record<string, string[]> = {};
  if (merged.boxReleases) {
    for (const entry of merged.boxReleases
      .split(",")
      .map((part) => part.trim())
      .filter(Boolean)) {
      const at = entry.indexOf("=");
      const version = entry.slice(0, at).trim();
      const path = entry.slice(at + 1).trim();
      if (at <= 0 || !/^[0-9A-Za-z][0-9A-Za-z.+-]{0,63}$/.test(version) || !path) {
        throw invalid("box_releases", "must be version=path pairs, comma-separated (e.g. 0.7.0=/opt/engine-0.7.0)", entry);
      }
      releases[version] = engineCommand(path);
    }
  } else {
    releases[VERSION] = engineCommand(merged.boxEngine ?? defaultBoxEngine());
  }
  const templateVersion = merged.boxTemplateVersion ?? "1";
  if (!/^[0-9A-Za-z][0-9A-Za-z.+-]{0,63}$/.test(templateVersion))
    throw invalid("box_template_version", "must be a version", templateVersion);
  return {
    provider,
    releases,
    templateVersion,
    sleepAfterMs: positiveInteger("box_sleep_after_min", merged.boxSleepAfterMin ?? 30, 0, 60 * 24 * 30) * 60_000,
    backupRetentionMs: positiveInteger("box_backup_retention_days", merged.boxBackupRetentionDays ?? 7, 1, 365) * 86_400_000,
    faults: merged.boxFaults,
  };
}

function httpUrl(field: string, raw: string): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw invalid(field, "must be an absolute http(s) URL", raw);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw invalid(field, "must be an absolute http(s) URL", raw);
  return url.href.replace(/\/$/, "");
}

/** resolveSocialProviders parses ENGINE_CLOUD_OIDC_SOCIAL_PROVIDERS: none by default, each of the two at most once. */
function resolveSocialProviders(raw: string | readonly string[] | undefined): SocialProvider[] {
  const entries = (typeof raw === "string" ? raw.split(",") : (raw ?? [])).map((entry) => entry.trim().toLowerCase()).filter(Boolean);
  const chosen = new Set<SocialProvider>();
  for (const entry of entries) {
    if (!(SOCIAL_PROVIDERS as readonly string[]).includes(entry)) {
      throw invalid("oidc_social_providers", `each entry must be one of ${SOCIAL_PROVIDERS.join(", ")} (comma-separated)`, raw);
    }
    chosen.add(entry as SocialProvider);
  }
  // The page shows them in one fixed order, whatever order the operator listed them in.
  return SOCIAL_PROVIDERS.filter((provider) => chosen.has(provider));
}

function resolveOidc(merged: CloudConfigInput): OidcConfig | null {
  const { oidcIssuer, oidcClientId, oidcClientSecret } = merged;
  // Checked whether or not sign-in is on, so a typo is found at the first start, not at the first sign-in.
  const authMethod = (merged.oidcAuthMethod ?? "client_secret_basic") as OidcAuthMethod;
  if (!OIDC_AUTH_METHODS.includes(authMethod)) {
    throw invalid("oidc_auth_method", `ENGINE_CLOUD_OIDC_AUTH_METHOD must be ${OIDC_AUTH_METHODS.join(" or ")}`, merged.oidcAuthMethod);
  }
  const socialProviders = resolveSocialProviders(merged.oidcSocialProviders);
  if (!oidcIssuer && !oidcClientId && !oidcClientSecret) return null;
  if (!oidcIssuer || !oidcClientId || !oidcClientSecret) {
    throw invalid("oidc", "set ENGINE_CLOUD_OIDC_ISSUER, _CLIENT_ID and _CLIENT_SECRET together, or none of them", {
      issuer: Boolean(oidcIssuer),
      client_id: Boolean(oidcClientId),
      client_secret: Boolean(oidcClientSecret),
    });
  }
  const hint = merged.oidcProviderHintParam ?? "identity_provider";
  if (!/^[A-Za-z0-9_.-]{1,64}$/.test(hint)) throw invalid("oidc_provider_param", "must be a parameter name", hint);
  return {
    issuer: httpUrl("oidc_issuer", oidcIssuer),
    clientId: oidcClientId,
    clientSecret: oidcClientSecret,
    authMethod,
    socialProviders,
    providerHintParam: hint,
    publishableKey: merged.oidcPublishableKey ?? "",
    extraCaFile: merged.oidcCaFile ? resolve(merged.oidcCaFile) : undefined,
  };
}

/**
 * resolveTrustedProxies parses ENGINE_CLOUD_TRUSTED_PROXIES. The boolean it replaces trusted
 * the header from every peer, so a deployment that still sets it must choose its proxies
 * rather than silently lose (or keep) that trust.
 */
function resolveTrustedProxies(merged: CloudConfigInput): ProxyList {
  if (merged.trustForwardedFor !== undefined) {
    throw invalid(
      "trust_forwarded_for",
      "ENGINE_CLOUD_TRUST_FORWARDED_FOR is retired: list your reverse proxies in ENGINE_CLOUD_TRUSTED_PROXIES (e.g. 127.0.0.1,::1)",
      merged.trustForwardedFor,
    );
  }
  const raw = merged.trustedProxies ?? [];
  const entries = (typeof raw === "string" ? raw.split(",") : raw).map((entry) => entry.trim()).filter((entry) => entry !== "");
  try {
    return ProxyList.parse(entries);
  } catch (error) {
    throw invalid("trusted_proxies", `${(error as Error).message}; list addresses and CIDR ranges, comma-separated`, raw);
  }
}

/** resolveFlag reads an on/off setting: a boolean, or `1`/`true`/`0`/`false`; unset is off. */
function resolveFlag(field: string, raw: string | boolean | undefined): boolean {
  if (raw === undefined || typeof raw === "boolean") return raw ?? false;
  const value = raw.trim().toLowerCase();
  if (value === "1" || value === "true") return true;
  if (value === "0" || value === "false") return false;
  throw invalid(field, "must be 1, true, 0 or false", raw);
}

/**
 * resolveCloudConfig merges flags over the environment over defaults and validates the result,
 * failing with the name of the first bad field.
 */
export function resolveCloudConfig(flags: CloudConfigInput, env: CloudConfigInput = cloudConfigFromEnv()): CloudConfig {
  const merged: CloudConfigInput = { ...env };
  for (const [key, value] of Object.entries(flags)) if (value !== undefined) (merged as Record<string, unknown>)[key] = value;

  const dataDir = resolve(merged.dataDir ?? userDataDir(process.env, "engine-cloud"));
  const port = positiveInteger("port", merged.port ?? DEFAULT_CLOUD_PORT, 0, 65535);
  const host = merged.host ?? "127.0.0.1";
  if (!/^[A-Za-z0-9.:[\]-]+$/.test(host)) throw invalid("host", "must be a host name or an IP address", host);
  const role = (merged.role ?? "all") as CloudRole;
  if (!CLOUD_ROLES.includes(role)) throw invalid("role", `must be one of ${CLOUD_ROLES.join(", ")}`, merged.role);
  const logLevel = (merged.logLevel ?? "info") as LogLevel;
  if (!LOG_LEVELS.includes(logLevel)) throw invalid("log_level", `must be one of ${LOG_LEVELS.join(", ")}`, merged.logLevel);

  const databaseUrl = merged.databaseUrl ?? `sqlite://${join(dataDir, "cloud.db")}`;
  if (!/^(sqlite|file):/.test(databaseUrl) && !/^postgres(ql)?:\/\//.test(databaseUrl)) {
    // The URL may hold a password: name only its scheme.
    throw invalid("database_url", "must be sqlite://<file> or postgres://...", databaseUrl.split(":")[0]);
  }
  const hostedBaseDomain = (merged.hostedBaseDomain ?? "hosted.localhost").toLowerCase();
  if (!/^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/.test(hostedBaseDomain)) {
    throw invalid("hosted_base_domain", "must be a DNS name", merged.hostedBaseDomain);
  }
  // One SQLite file means one process: memory buckets. PostgreSQL means replicas may share the load.
  const rateLimits = merged.rateLimits ?? (databaseUrl.startsWith("postgres") ? "database" : "memory");
  if (rateLimits !== "memory" && rateLimits !== "database") throw invalid("rate_limits", "must be memory or database", rateLimits);
  const publicHost = host === "0.0.0.0" || host === "::" ? "127.0.0.1" : host;
  // The token is a secret: a bad one is named by its length, never its value.
  if (merged.metricsToken !== undefined && (merged.metricsToken.length < 16 || /\s/.test(merged.metricsToken))) {
    throw invalid("metrics_token", "must be at least 16 characters without spaces", `${merged.metricsToken.length} characters`);
  }
  return {
    dataDir,
    host,
    port,
    role,
    databaseUrl,
    publicUrl: merged.publicUrl ? httpUrl("public_url", merged.publicUrl) : `http://${publicHost}:${port}`,
    hostedBaseDomain,
    logLevel,
    logToStdout: merged.logToStdout ?? true,
    trustedProxies: resolveTrustedProxies(merged),
    secretKey: merged.secretKey,
    sessionIdleMs: positiveInteger("session_idle_hours", merged.sessionIdleHours ?? 24 * 7, 1, 24 * 90) * 3600_000,
    sessionAbsoluteMs: positiveInteger("session_absolute_days", merged.sessionAbsoluteDays ?? 30, 1, 365) * 86_400_000,
    rateLimits,
    oidc: resolveOidc(merged),
    cimdAllowLoopback: resolveFlag("cimd_allow_loopback", merged.cimdAllowLoopback),
    metricsToken: merged.metricsToken,

    managed: resolveManaged(merged),
  };
}
