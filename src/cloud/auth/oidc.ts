import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { rootCertificates } from "node:tls";
import * as client from "openid-client";
import { constantTimeEqual, digestSecret, randomId, type SecretBox } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import type { Logger } from "../../lib/logger";
import type { OidcConfig, SocialProvider } from "../config";
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

/** LoginFailure is why a callback was refused, for the log only: the client always reads `login_failed`. */
class LoginFailure extends Error {}

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
 * RelyingParty is the console's OpenID Connect client (openid-client v6, OpenID-certified):
 * authorization code flow with PKCE S256, `state`, `nonce`, RFC 9207 `iss` (checked when the
 * IdP advertises it), and client_secret_basic at the token endpoint.
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
        client.ClientSecretBasic(this.oidc.clientSecret),
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
   * in the configured hint parameter. Nothing is written when the IdP cannot be reached.
   */
  async begin(kind: LoginKind, options: { redirectUri: string; returnTo: string; loginHint?: string }): Promise<LoginStarted> {
    const configuration = await this.configuration();
    const state = client.randomState();
    const nonce = client.randomNonce();
    const verifier = client.randomPKCECodeVerifier();
    const binding = randomBytes(32).toString("base64url");
    const id = randomId("login");
    const now = Date.now();
    const expiresAt = now + LOGIN_ATTEMPT_TTL_MS;
    await this.db.sql`INSERT INTO login_attempts
        (id, state_digest, binding_digest, nonce, verifier_sealed, provider, return_to, created_at, expires_at)
      VALUES (${id}, ${digestSecret(state)}, ${digestSecret(binding)}, ${nonce}, ${this.secrets.seal(verifier, `login:${id}`)},
        ${kind.provider}, ${options.returnTo}, ${now}, ${expiresAt})`;
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
   * public callback URL with the query the browser brought (`code`, `state`, `iss`), and
   * `readBinding` reads the binding cookie the browser presented for a state. Any failure of
   * the state, the binding, the expiry, the single use, or the code's redemption is
   * `login_failed` (401); the reason goes to the log, never the code or a token.
   */
  async finish(callback: CallbackKind, callbackUrl: URL, readBinding: (state: string) => string | null): Promise<VerifiedIdentity> {
    try {
      return await this.#finish(callback, callbackUrl, readBinding);
    } catch (error) {
      if (error instanceof LoginFailure) {
        this.log.warn({ reason: error.message, callback }, "sign-in refused");
        throw new AppError("login_failed", "sign-in failed; start again from the sign-in page");
      }
      throw error;
    }
  }

  async #finish(callback: CallbackKind, callbackUrl: URL, readBinding: (state: string) => string | null): Promise<VerifiedIdentity> {
    // A missing state never skips the check: there is then no attempt to match.
    const state = callbackUrl.searchParams.get("state");
    if (!state) throw new LoginFailure("no state");
    const [row] = await this.db.sql`SELECT * FROM login_attempts WHERE state_digest = ${digestSecret(state)}`;
    if (!row) throw new LoginFailure("unknown state");
    const provider = (row.provider ?? null) as SocialProvider | null;
    if ((provider === null) !== (callback === "login")) throw new LoginFailure("the state belongs to the other callback");
    const binding = readBinding(state);
    if (!binding || !constantTimeEqual(digestSecret(binding), row.binding_digest as string)) {
      throw new LoginFailure(binding ? "the binding cookie does not match" : "no binding cookie");
    }
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
      this.log.warn({ err: describe(error) }, "the identity provider's answer was refused");
      throw new LoginFailure("code redemption failed");
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
