import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { rootCertificates } from "node:tls";
import * as client from "openid-client";
import { constantTimeEqual, digestSecret, randomId, type SecretBox } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import type { Logger } from "../../lib/logger";
import type { OidcAuthMethod, OidcConfig, SocialProvider } from "../config";
import { type Database, num } from "../db";

/** LOGIN_ATTEMPT_TTL_MS is how long a sign-in may take from start to callback: ten minutes. */
export const LOGIN_ATTEMPT_TTL_MS = 10 * 60_000;
/** LOGIN_SCOPE asks for the claims an account is made from: the subject, the email and the name. */
const LOGIN_SCOPE = "openid email profile";
/** IDP_TIMEOUT_S bounds every request to the IdP (openid-client counts in seconds). */
const IDP_TIMEOUT_S = 10;
/** REACHABLE_FOR_MS: a successful reachability check is trusted this long, so /api/ready does not poll the IdP on every call. */
const REACHABLE_FOR_MS = 10_000;
/** BINDING_COOKIE_PREFIX starts the name of each sign-in's browser-binding cookie. */
export const BINDING_COOKIE_PREFIX = "engine_login_";

/** LoginKind says which start a sign-in came from: plain login, or one of the two social providers. */
export type LoginKind = { provider: null } | { provider: SocialProvider };
/** CallbackKind says which callback the browser came back to; a state started by the other is refused. */
export type CallbackKind = "login" | "social";

/** LoginStarted is where to send the browser, and the binding cookie that must come back with it. */
export interface LoginStarted {
  url: string;
  expiresInS: number;
  /** bindingCookie is the Set-Cookie value that ties the attempt to this browser. */
  bindingCookie: string;
}

/** VerifiedIdentity is what a completed sign-in proved, ready for `AccountStore.fromIdentity`. */
export interface VerifiedIdentity {
  issuer: string;
  subject: string;
  email: string;
  emailVerified: boolean;
  name?: string;
  provider: SocialProvider | null;
  /** returnTo is the normalised path stored when the sign-in started. */
  returnTo: string;
}

/** HostMismatch is where a sign-in started and where the browser came back, when their hosts differ. */
interface HostMismatch {
  startedAt: string;
  cameBackAt: string;
}

/**
 * LoginFailure is why a callback was refused, for the log only: the client always reads
 * `login_failed`. `fields` add what the log line may name (a claim, never a token); a host
 * mismatch is the one reason the client is told, because only the person can fix it.
 */
class LoginFailure extends Error {
  constructor(
    message: string,
    readonly fields: Record<string, unknown> = {},
    readonly hostMismatch?: HostMismatch,
  ) {
    super(message);
  }
}

/** FinishOptions are what the callback route knows about the browser that came back. */
export interface FinishOptions {
  /** readBinding reads the binding cookie the browser presented for a state. */
  readBinding: (state: string) => string | null;
  /** cameBackAt is the origin the callback request reached (its Host), to compare with where the sign-in started. */
  cameBackAt: string;
  /** publicUrl is the console's public URL, named in the answer when the browser came back on another host. */
  publicUrl: string;
}

/** isLoopback says whether an issuer is on this machine, the one place plain http is accepted (RFC 8252 §8.3's spirit). */
function isLoopback(url: URL): boolean {
  return url.hostname === "localhost" || url.hostname === "[::1]" || /^127(\.\d{1,3}){3}$/.test(url.hostname);
}

/**
 * bindingCookieName names a sign-in's binding cookie after its state's digest, so two sign-ins
 * started in two tabs of one browser each keep their own cookie.
 */
export function bindingCookieName(state: string): string {
  return `${BINDING_COOKIE_PREFIX}${digestSecret(state).slice(0, 16)}`;
}

/**
 * bindingCookie is the Set-Cookie value of a sign-in's binding: HttpOnly, Secure, SameSite=Lax
 * (sent on the top-level redirect back from the IdP), scoped to /api/auth, living as long as
 * the attempt.
 */
function bindingCookie(name: string, value: string, maxAgeS: number): string {
  return `${name}=${value}; Path=/api/auth; HttpOnly; Secure; SameSite=Lax; Max-Age=${maxAgeS}`;
}

/** clearedBindingCookie removes a sign-in's binding cookie once the sign-in is done. */
export function clearedBindingCookie(state: string): string {
  return bindingCookie(bindingCookieName(state), "", 0);
}

/** describe names an openid-client failure for the log without its cause, which may echo the code or a token. */
function describe(error: unknown): Record<string, unknown> {
  const e = error as { name?: string; code?: string; error?: string; status?: number; message?: string };
  return { name: e?.name, code: e?.code, oauth_error: e?.error, status: e?.status, message: e?.message };
}

/**
 * CLAIMS_WITH_LOGGABLE_VALUES are the ID token claims whose expected and received values may
 * be logged: client ids, issuer URLs and times. A nonce or a hash (`c_hash`, `at_hash`) is
 * named without its values: they are derived from the sign-in's secrets.
 */
const CLAIMS_WITH_LOGGABLE_VALUES = new Set(["aud", "azp", "iss"]);
const TIMESTAMP_CLAIMS = new Set(["exp", "nbf", "iat", "auth_time"]);

/** shown renders a value from the IdP for a log line's text, bounded (a hostile IdP could send a huge audience list). */
const shown = (value: unknown) => (value === undefined ? "nothing" : JSON.stringify(value).slice(0, 200));
/** bounded is a value from the IdP for a log line's field: strings cut to 200 characters, lists to 5 entries. */
function bounded(value: unknown): unknown {
  if (typeof value === "string") return value.slice(0, 200);
  if (Array.isArray(value)) return value.slice(0, 5).map((entry) => (typeof entry === "string" ? entry.slice(0, 200) : shown(entry)));
  return typeof value === "number" || value === undefined ? value : shown(value);
}

/** formEncodedOnly says whether `got` is `expected` form-encoded (`engine%2Dconsole` for `engine-console`). */
function formEncodedOnly(got: unknown, expected: unknown): boolean {
  if (typeof got !== "string" || typeof expected !== "string" || got === expected) return false;
  try {
    return decodeURIComponent(got.replace(/\+/g, " ")) === expected;
  } catch {
    return false;
  }
}

/**
 * explainRefusal turns an openid-client failure of the code redemption into a reason that
 * names what failed: the ID token claim that did not check out (openid-client keeps it two
 * causes deep: ClientError → OperationProcessingError → `{claim, expected, claims}`), or the
 * token endpoint's OAuth error with a hint at the likely setting. The claims object itself
 * (email, name) and every token stay out of it.
 */
function explainRefusal(error: unknown, authMethod: OidcAuthMethod): { reason: string; fields: Record<string, unknown> } {
  const chain: Record<string, unknown>[] = [];
  for (let current = error, depth = 0; current && typeof current === "object" && depth < 5; depth++) {
    chain.push(current as Record<string, unknown>);
    current = (current as { cause?: unknown }).cause;
  }
  const check = chain.find((link) => typeof link.claim === "string") as
    | { claim: string; expected?: unknown; claims?: Record<string, unknown>; now?: number; tolerance?: number }
    | undefined;
  if (check) {
    const { claim } = check;
    const got = check.claims?.[claim];
    if (CLAIMS_WITH_LOGGABLE_VALUES.has(claim)) {
      const expected = check.expected === undefined ? "" : `expected ${shown(check.expected)}, `;
      // The known case: a provider that used the form-encoded Basic user name as the audience.
      const hint =
        claim === "aud" && authMethod === "client_secret_basic" && formEncodedOnly(got, check.expected)
          ? " (the client id as form-encoded in the Basic header, RFC 6749 §2.3.1, used undecoded: set ENGINE_CLOUD_OIDC_AUTH_METHOD=client_secret_post)"
          : "";
      return {
        reason: `the ID token's "${claim}" claim does not match: ${expected}got ${shown(got)}${hint}`,
        fields: { claim, expected: bounded(check.expected), got: bounded(got) },
      };
    }
    if (TIMESTAMP_CLAIMS.has(claim)) {
      return {
        reason: `the ID token's "${claim}" claim fails the time check: ${claim} ${shown(got)}, now ${check.now} (is this machine's clock right?)`,
        fields: { claim, got: bounded(got), now: check.now },
      };
    }
    return { reason: `the ID token's "${claim}" claim does not match (values not logged)`, fields: { claim } };
  }
  for (const link of chain) {
    const missing = /JWT "([A-Za-z_]+)" \([^)]*\) claim missing/.exec(String(link.message ?? ""));
    if (missing) return { reason: `the ID token has no "${missing[1]}" claim`, fields: { claim: missing[1] } };
  }
  // The OAuth error of the token endpoint: in the body (ResponseBodyError), or in a WWW-Authenticate
  // challenge (RFC 6749 §5.2 wants one on a 401 to a client that used the Authorization header).
  const status = chain.find((link) => typeof link.status === "number")?.status as number | undefined;
  const challenged = chain
    .flatMap((link) => (Array.isArray(link.cause) ? (link.cause as { parameters?: { error?: unknown } }[]) : []))
    .find((challenge) => typeof challenge?.parameters?.error === "string")?.parameters?.error as string | undefined;
  const answered = (chain.find((link) => typeof link.error === "string")?.error as string | undefined) ?? challenged;
  // A bare 401 from the token endpoint is a failed client authentication too.
  const oauth = answered ? { error: answered.slice(0, 100), status } : status === 401 ? { error: "invalid_client", status } : undefined;
  if (oauth?.error === "invalid_client") {
    const other = authMethod === "client_secret_basic" ? "client_secret_post" : "client_secret_basic";
    return {
      reason:
        `the token endpoint refused the console's client authentication (invalid_client, HTTP ${oauth.status}), sent as ${authMethod}: ` +
        `check ENGINE_CLOUD_OIDC_CLIENT_ID and ENGINE_CLOUD_OIDC_CLIENT_SECRET, or set ENGINE_CLOUD_OIDC_AUTH_METHOD=${other} ` +
        "if that is what the provider expects for this client",
      fields: { oauth_error: oauth.error, auth_method: authMethod },
    };
  }
  if (oauth) {
    return { reason: `the token endpoint answered ${oauth.error} (HTTP ${oauth.status})`, fields: { oauth_error: oauth.error } };
  }
  return { reason: `the identity provider's answer was refused: ${shown((error as Error)?.message)}`, fields: { err: describe(error) } };
}

/** hostOf is the host name of an origin, or the origin itself when it does not parse. */
function hostOf(origin: string): string {
  try {
    return new URL(origin).hostname;
  } catch {
    return origin;
  }
}

/** sweepLoginAttempts deletes the sign-ins that expired before `now` and answers how many. */
export async function sweepLoginAttempts(db: Database, now: number): Promise<number> {
  return (await db.sql`DELETE FROM login_attempts WHERE expires_at < ${now} RETURNING id`).length;
}

/**
 * RelyingParty is the console's OpenID Connect client (openid-client v6, OpenID-certified):
 * authorization code flow with PKCE S256, `state`, `nonce`, RFC 9207 `iss` (checked when the
 * IdP advertises it), and client_secret_basic (or, configured, client_secret_post) at the
 * token endpoint.
 *
 * The IdP's configuration is discovered once and cached. If the IdP is down when the console
 * starts, nothing fails: the next sign-in (or readiness check) discovers again.
 *
 * Every sign-in is a row in `login_attempts`: the digest of its `state`, the digest of a
 * random browser-binding cookie, the `nonce`, and the PKCE verifier sealed with the
 * console's secret box. A callback must present a stored, unexpired, unconsumed state and
 * the matching binding cookie; it consumes the row with a compare-and-set, so a replayed
 * callback fails.
 */
export class RelyingParty {
  readonly #fetch: client.CustomFetch;
  readonly #insecure: boolean;
  #configuration: Promise<client.Configuration> | null = null;
  #reachableAt = 0;

  constructor(
    readonly oidc: OidcConfig,
    private readonly db: Database,
    private readonly secrets: SecretBox,
    private readonly log: Logger,
  ) {
    const issuer = new URL(oidc.issuer);
    this.#insecure = issuer.protocol === "http:";
    if (this.#insecure && !isLoopback(issuer)) {
      throw new AppError("config_invalid", "config: oidc_issuer: must be https:// (plain http only on loopback)", { issuer: oidc.issuer });
    }
    let extraCa: string | undefined;
    if (oidc.extraCaFile) {
      try {
        extraCa = readFileSync(oidc.extraCaFile, "utf8");
      } catch (error) {
        throw new AppError("config_invalid", `config: oidc_ca_file: cannot read ${oidc.extraCaFile}: ${(error as Error).message}`);
      }
    }
    // The extra CA is trusted beside the usual roots, for the IdP's requests only.
    const ca = extraCa ? [...rootCertificates, extraCa] : undefined;
    this.#fetch = (url, options) => fetch(url, (ca ? { ...options, tls: { ca } } : options) as RequestInit);
  }

  /**
   * configuration returns the IdP's discovered configuration, discovering it on first use
   * and again after a failed attempt. An IdP that cannot be reached is
   * `identity_provider_unavailable` (503).
   */
  async configuration(): Promise<client.Configuration> {
    if (!this.#configuration) {
      const attempt = client.discovery(
        new URL(this.oidc.issuer),
        this.oidc.clientId,
        undefined,
        this.oidc.authMethod === "client_secret_post"
          ? client.ClientSecretPost(this.oidc.clientSecret)
          : client.ClientSecretBasic(this.oidc.clientSecret),
        {
          [client.customFetch]: this.#fetch,
          execute: this.#insecure ? [client.allowInsecureRequests] : [],
          timeout: IDP_TIMEOUT_S,
        },
      );
      this.#configuration = attempt;
      attempt.then(
        () => this.log.info({ issuer: this.oidc.issuer }, "identity provider discovered"),
        (error) => {
          // Forget the failure so the next call tries again.
          if (this.#configuration === attempt) this.#configuration = null;
          this.log.warn({ issuer: this.oidc.issuer, err: describe(error) }, "identity provider discovery failed; retrying on next use");
        },
      );
    }
    try {
      return await this.#configuration;
    } catch {
      throw new AppError("identity_provider_unavailable", "the identity provider cannot be reached; try again shortly");
    }
  }

  /**
   * reachable answers whether the IdP's discovery document can be fetched now (for
   * /api/ready). A success is trusted for ten seconds; a failure is never cached, so a
   * recovered IdP shows at once.
   */
  async reachable(): Promise<boolean> {
    if (Date.now() - this.#reachableAt < REACHABLE_FOR_MS) return true;
    try {
      const response = await this.#fetch(`${this.oidc.issuer}/.well-known/openid-configuration`, {
        method: "GET",
        headers: { accept: "application/json" },
        redirect: "manual",
        signal: AbortSignal.timeout(3000),
        body: undefined,
      });
      await response.body?.cancel();
      if (!response.ok) return false;
      await this.configuration();
      this.#reachableAt = Date.now();
      return true;
    } catch {
      return false;
    }
  }

  /**
   * begin starts a sign-in: it writes the attempt and returns the IdP's authorization URL and
   * the binding cookie. `loginHint` becomes `login_hint`; a social provider is named to the IdP
   * in the configured hint parameter. `startedAt` is the origin the start request reached,
   * kept to explain a callback that comes back elsewhere. Nothing is written when the IdP
   * cannot be reached.
   */
  async begin(
    kind: LoginKind,
    options: { redirectUri: string; returnTo: string; loginHint?: string; startedAt?: string },
  ): Promise<LoginStarted> {
    const configuration = await this.configuration();
    const state = client.randomState();
    const nonce = client.randomNonce();
    const verifier = client.randomPKCECodeVerifier();
    const binding = randomBytes(32).toString("base64url");
    const id = randomId("login");
    const now = Date.now();
    const expiresAt = now + LOGIN_ATTEMPT_TTL_MS;
    await this.db.sql`INSERT INTO login_attempts
        (id, state_digest, binding_digest, nonce, verifier_sealed, provider, return_to, created_at, expires_at, started_origin)
      VALUES (${id}, ${digestSecret(state)}, ${digestSecret(binding)}, ${nonce}, ${this.secrets.seal(verifier, `login:${id}`)},
        ${kind.provider}, ${options.returnTo}, ${now}, ${expiresAt}, ${options.startedAt?.slice(0, 300) ?? null})`;
    const parameters: Record<string, string> = {
      redirect_uri: options.redirectUri,
      scope: LOGIN_SCOPE,
      code_challenge: await client.calculatePKCECodeChallenge(verifier),
      code_challenge_method: "S256",
      state,
      nonce,
    };
    if (options.loginHint) parameters.login_hint = options.loginHint;
    if (kind.provider) parameters[this.oidc.providerHintParam] = kind.provider;
    const expiresInS = LOGIN_ATTEMPT_TTL_MS / 1000;
    return {
      url: client.buildAuthorizationUrl(configuration, parameters).href,
      expiresInS,
      bindingCookie: bindingCookie(bindingCookieName(state), binding, expiresInS),
    };
  }

  /**
   * finish completes a sign-in from the IdP's redirect back: `callbackUrl` is the console's
   * public callback URL with the query the browser brought (`code`, `state`, `iss`). Any
   * failure of the state, the binding, the expiry, the single use, or the code's redemption
   * is `login_failed` (401); the reason goes to the log (naming the ID token claim that
   * failed), never the code or a token. When the binding cookie is missing because the
   * browser came back on another host than the one it started on, the answer's message says
   * so and names the public URL (`details.started_at` holds the start's origin); the refusal
   * is the same.
   */
  async finish(callback: CallbackKind, callbackUrl: URL, options: FinishOptions): Promise<VerifiedIdentity> {
    try {
      return await this.#finish(callback, callbackUrl, options);
    } catch (error) {
      if (error instanceof LoginFailure) {
        this.log.warn({ reason: error.message, callback, ...error.fields }, "sign-in refused");
        const mismatch = error.hostMismatch;
        if (mismatch) {
          throw new AppError(
            "login_failed",
            `sign-in failed: you started sign-in at ${mismatch.startedAt} but came back at ${mismatch.cameBackAt}, where the browser ` +
              `does not send the cookie it was given at ${mismatch.startedAt}; open the console at ${options.publicUrl} and sign in again`,
            { started_at: mismatch.startedAt },
          );
        }
        throw new AppError("login_failed", "sign-in failed; start again from the sign-in page");
      }
      throw error;
    }
  }

  async #finish(callback: CallbackKind, callbackUrl: URL, { readBinding, cameBackAt }: FinishOptions): Promise<VerifiedIdentity> {
    // A missing state never skips the check: there is then no attempt to match.
    const state = callbackUrl.searchParams.get("state");
    if (!state) throw new LoginFailure("no state");
    const [row] = await this.db.sql`SELECT * FROM login_attempts WHERE state_digest = ${digestSecret(state)}`;
    if (!row) throw new LoginFailure("unknown state");
    const provider = (row.provider ?? null) as SocialProvider | null;
    if ((provider === null) !== (callback === "login")) throw new LoginFailure("the state belongs to the other callback");
    const binding = readBinding(state);
    if (!binding) {
      // Cookies are kept per host name: one set at localhost is not sent to 127.0.0.1.
      const startedAt = typeof row.started_origin === "string" ? row.started_origin : null;
      if (startedAt && hostOf(startedAt) !== hostOf(cameBackAt)) {
        throw new LoginFailure(
          `no binding cookie: the sign-in started at ${startedAt} and came back at ${cameBackAt}`,
          { started_at: startedAt, came_back_at: cameBackAt },
          { startedAt, cameBackAt },
        );
      }
      throw new LoginFailure("no binding cookie");
    }
    if (!constantTimeEqual(digestSecret(binding), row.binding_digest as string))
      throw new LoginFailure("the binding cookie does not match");
    const now = Date.now();
    if (row.consumed_at !== null && row.consumed_at !== undefined) throw new LoginFailure("the attempt was already used");
    if (num(row.expires_at) <= now) throw new LoginFailure("the attempt expired");
    // Discover before consuming, so an unreachable IdP (503) leaves the attempt usable.
    const configuration = await this.configuration();
    const consumed = await this.db.sql`UPDATE login_attempts SET consumed_at = ${now}
      WHERE id = ${row.id} AND consumed_at IS NULL AND expires_at > ${now} RETURNING id`;
    if (consumed.length === 0) throw new LoginFailure("the attempt was already used");

    let verifier: string;
    try {
      verifier = this.secrets.open(row.verifier_sealed as string, `login:${row.id}`);
    } catch {
      throw new LoginFailure("the sealed PKCE verifier does not open (was the secret key changed?)");
    }
    let tokens: Awaited<ReturnType<typeof client.authorizationCodeGrant>>;
    try {
      tokens = await client.authorizationCodeGrant(configuration, callbackUrl, {
        pkceCodeVerifier: verifier,
        expectedState: state,
        expectedNonce: row.nonce as string,
        idTokenExpected: true,
      });
    } catch (error) {
      const { reason, fields } = explainRefusal(error, this.oidc.authMethod);
      throw new LoginFailure(`code redemption failed: ${reason}`, fields);
    }
    const claims = tokens.claims();
    if (!claims) throw new LoginFailure("no ID token");
    let profile: Record<string, unknown> = claims;
    if (typeof claims.email !== "string") {
      // Some IdPs keep email and name to userinfo; its `sub` must be the ID token's (OIDC Core §5.3.2).
      try {
        profile = { ...(await client.fetchUserInfo(configuration, tokens.access_token, claims.sub)), iss: claims.iss };
      } catch (error) {
        this.log.warn({ err: describe(error) }, "userinfo failed");
        throw new LoginFailure("userinfo failed");
      }
    }
    if (typeof profile.email !== "string" || profile.email.length === 0) throw new LoginFailure("the identity provider sent no email");
    return {
      issuer: claims.iss,
      subject: claims.sub,
      email: profile.email,
      // Some IdPs send the flag as a string.
      emailVerified: profile.email_verified === true || profile.email_verified === "true",
      name: typeof profile.name === "string" ? profile.name.slice(0, 200) : undefined,
      provider,
      returnTo: row.return_to as string,
    };
  }
}
