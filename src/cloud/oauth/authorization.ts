import { createHash } from "node:crypto";
import { constantTimeEqual } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import type { Logger } from "../../lib/logger";
import type { Account, AccountStore } from "../accounts";
import type { AuditLog } from "../audit";
import type { Database, Sql } from "../db";
import type { NodeStore } from "../nodes";
import { acceptsRedirect, type Client, ClientRefused, RegistrationRefused, registrationMetadata } from "./clients";
import type { ClientDirectory } from "./directory";
import { ASSISTANT_SCOPES, type AssistantScope } from "./grant";
import { redirectTarget, redirectUriProblem, withParameters } from "./redirects";
import { consoleMcpUrl } from "./resource";
import { AssistantStore, type Grant, newSecret, SECRET_PREFIXES, type TokenRecord } from "./store";

/** REQUEST_TTL_MS is how long a pending authorization waits for the person (sign-in included). */
export const REQUEST_TTL_MS = 10 * 60_000;
/** CODE_TTL_MS is how long an authorization code may wait to be exchanged. */
export const CODE_TTL_MS = 5 * 60_000;
/** ACCESS_TTL_S is an access token's lifetime. */
export const ACCESS_TTL_S = 3600;
/** REFRESH_TTL_MS is a refresh token's lifetime from its issue; each rotation issues a new one. */
export const REFRESH_TTL_MS = 30 * 86_400_000;
/** MAX_STATE_LENGTH bounds the client's `state` (characters). */
export const MAX_STATE_LENGTH = 2048;
/** CONSENT_PAGE is the console page the browser is sent to with the request's `rid`. */
export const CONSENT_PAGE = "/oauth/authorize";

/** OAuthError is an RFC 6749 §5.2 error of the token, revocation or registration endpoint: a code, a description, a status. */
export class OAuthError extends Error {
  constructor(
    readonly error: string,
    description: string,
    readonly status = 400,
  ) {
    super(description);
  }
}

/** BeginAnswer is what /oauth/authorize does: show an error page (never a redirect), or send the browser on. */
export type BeginAnswer =
  | { kind: "error_page"; status: number; error: string; description: string }
  | { kind: "redirect"; location: string };

/** Access is what the person grants at consent: reading only, or operating (which includes reading). */
export type Access = "read" | "operate";

/** DecisionInput is the body of the decision route. */
export interface DecisionInput {
  rid: string;
  approve: boolean;
  access?: Access;
  node_ids?: string[] | null;
}

/** TokenAnswer is a successful token endpoint answer (RFC 6749 §5.1). */
export interface TokenAnswer {
  access_token: string;
  token_type: "Bearer";
  expires_in: number;
  refresh_token: string;
  scope: string;
}

export interface AuthorizationDeps {
  db: Database;
  accounts: AccountStore;
  nodes: NodeStore;
  audit: AuditLog;
  log: Logger;
  clients: ClientDirectory;
  site: { publicUrl: string };
  clock: () => number;
}

const iso = (ms: number) => new Date(ms).toISOString();

/** Outcome is a token grant's result inside its transaction: a failure is answered only after the commit, so what it spent stays spent. */
type Outcome = { answer: TokenAnswer; failure?: undefined } | { failure: string; error?: string; revokedGrant?: boolean };

/** s256 is the PKCE S256 transform (RFC 7636 §4.2): BASE64URL(SHA256(verifier)). */
export function s256(verifier: string): string {
  return createHash("sha256").update(verifier, "ascii").digest("base64url");
}

/** VERIFIER_SHAPE is RFC 7636 §4.1's code_verifier: 43 to 128 unreserved characters. */
const VERIFIER_SHAPE = /^[A-Za-z0-9._~-]{43,128}$/;
/** CHALLENGE_SHAPE is an S256 challenge: exactly 43 base64url characters (32 bytes). */
const CHALLENGE_SHAPE = /^[A-Za-z0-9_-]{43}$/;

/**
 * offeredScopes turns the scopes a client asked for into the ones the person may grant: the
 * known ones (unknown words such as `openid` or `email` are ignored, never an error), with
 * `engine:operate` bringing `engine:read` (operating includes reading). A request that names
 * none of them (or no scope at all) is offered both, and the person chooses.
 */
export function offeredScopes(asked: string | null): AssistantScope[] {
  const words = new Set((asked ?? "").split(" ").filter(Boolean));
  if (words.has("engine:operate")) words.add("engine:read");
  const known = ASSISTANT_SCOPES.filter((scope) => words.has(scope));
  return known.length > 0 ? known : [...ASSISTANT_SCOPES];
}

/** scopesForAccess is what an access choice grants. */
export function scopesForAccess(access: Access): AssistantScope[] {
  return access === "operate" ? ["engine:read", "engine:operate"] : ["engine:read"];
}

/**
 * AuthorizationServer is the console's OAuth 2.1 authorization server for assistants (MCP
 * clients): the authorization endpoint, the consent's context and decision, the token,
 * revocation and registration endpoints, and the account's list of grants. Its rules:
 *
 * - A client and its redirect URI are checked before anything is sent to that URI: an
 *   unknown client or a redirect it did not register gets an error page, never a redirect
 *   (RFC 6749 §4.1.2.1). Every redirect carries `iss` (RFC 9207).
 * - PKCE with S256 only (OAuth 2.1); `resource` (RFC 8707) must be the console's MCP URL, the
 *   audience of every access token; a request without it is given that audience.
 * - A request is decided once; its code is used once. A code presented again revokes the
 *   grant and every token it issued (RFC 6749 §4.1.2).
 * - Refresh tokens rotate. A refresh token already rotated is accepted again only while its
 *   successor has never been used (the client lost the answer): that successor is revoked
 *   and a new one issued. Once the successor has been used, presenting an older one is reuse,
 *   and revokes the grant (OAuth 2.1 §4.3.1, the family of tokens).
 */
export class AuthorizationServer {
  readonly store: AssistantStore;

  constructor(private readonly deps: AuthorizationDeps) {
    this.store = new AssistantStore(deps.db);
  }

  /** issuer is the console's public URL, the `iss` of every answer (read per call: the port is known only once bound). */
  get issuer(): string {
    return this.deps.site.publicUrl;
  }

  /** mcpUrl is the console's MCP endpoint: the only resource, the audience of every token. */
  get mcpUrl(): string {
    return consoleMcpUrl(this.deps.site.publicUrl);
  }

  // ---- the authorization endpoint

  /**
   * begin handles `GET /oauth/authorize`. The client and the redirect URI are settled first;
   * only then may an error travel to the client, by redirect. An accepted request is stored
   * and the browser goes to the consent page with its `rid`.
   */
  async begin(query: URLSearchParams): Promise<BeginAnswer> {
    const page = (description: string, error = "invalid_request", status = 400): BeginAnswer => ({
      kind: "error_page",
      status,
      error,
      description,
    });
    for (const name of ["client_id", "redirect_uri"]) {
      if (query.getAll(name).length > 1) return page(`${name} appears more than once`);
    }
    const clientId = query.get("client_id");
    if (!clientId) return page("the request names no client_id");
    let client: Client | null;
    try {
      client = await this.deps.clients.resolve(clientId);
    } catch (error) {
      if (error instanceof ClientRefused) return page(error.message, "invalid_client");
      throw error;
    }
    if (!client) return page("the console does not know this client_id", "invalid_client");
    let redirectUri = query.get("redirect_uri");
    if (redirectUri === null) {
      if (client.redirectUris.length !== 1 || client.redirectPatterns.length > 0) {
        return page("the request names no redirect_uri, and the client registered more than one");
      }
      redirectUri = client.redirectUris[0] as string;
    }
    if (redirectUriProblem(redirectUri) !== null || !acceptsRedirect(client, redirectUri)) {
      return page("the redirect_uri is not one this client registered");
    }

    // From here on the client and its redirect are known: errors go back to it (RFC 6749 §4.1.2.1).
    const rawState = query.get("state");
    const state = rawState !== null && rawState.length <= MAX_STATE_LENGTH ? rawState : null;
    const fail = (error: string, description: string): BeginAnswer => ({
      kind: "redirect",
      location: withParameters(redirectUri, { error, error_description: description, state, iss: this.issuer }),
    });
    if (rawState !== null && state === null) return fail("invalid_request", `state is longer than ${MAX_STATE_LENGTH} characters`);
    for (const name of ["response_type", "code_challenge", "code_challenge_method", "scope", "state"]) {
      if (query.getAll(name).length > 1) return fail("invalid_request", `${name} appears more than once`);
    }
    const responseType = query.get("response_type");
    if (responseType !== "code") return fail("unsupported_response_type", "response_type must be code");
    const challenge = query.get("code_challenge");
    const method = query.get("code_challenge_method");
    if (!challenge) return fail("invalid_request", "PKCE is required: send code_challenge with code_challenge_method=S256");
    if (method !== "S256") {
      return fail(
        "invalid_request",
        `code_challenge_method must be S256 (${method === null ? "none given, which means plain" : "not supported"})`,
      );
    }
    if (!CHALLENGE_SHAPE.test(challenge))
      return fail("invalid_request", "code_challenge is not an S256 challenge (43 base64url characters)");
    const resources = query.getAll("resource");
    if (resources.some((resource) => resource !== this.mcpUrl)) {
      return fail("invalid_target", `the only resource this console issues tokens for is ${this.mcpUrl}`);
    }

    const rid = newSecret();
    const now = this.deps.clock();
    await this.store.createRequest({
      rid,
      clientId: client.id,
      clientKind: client.kind,
      clientLabel: client.label,
      clientName: client.declaredName,
      redirectUri,
      state,
      codeChallenge: challenge,
      scopes: offeredScopes(query.get("scope")),
      resource: this.mcpUrl,
      now,
      expiresAt: now + REQUEST_TTL_MS,
    });
    await this.deps.clients.touch(client);
    return { kind: "redirect", location: `${CONSENT_PAGE}?rid=${rid}` };
  }

  // ---- consent: context and decision

  /** assertEntitled refuses consent to an account without the remote-link entitlement, or not in good standing (403). */
  #assertEntitled(account: Account): void {
    if (!account.remoteLink) {
      throw new AppError("entitlement_required", "this account does not have the remote-link entitlement that assistant access needs");
    }
    if (account.standing !== "active") throw new AppError("account_suspended", `the account is ${account.standing}`);
  }

  /** #pending returns the request a rid names, or `not_found` (unknown or expired) / `already_consumed` (decided). */
  async #pending(rid: string) {
    const request = await this.store.requestByRid(rid);
    if (!request || request.expiresAt <= this.deps.clock()) {
      throw new AppError("not_found", "no pending authorization has this rid (it may have expired): start again from the assistant");
    }
    if (request.decidedAt !== null) throw new AppError("already_consumed", "this authorization has already been decided");
    return request;
  }

  /**
   * context answers what the consent page shows for a rid: which client asks (by the host of
   * its client id, its own name only as unverified), where the answer goes, the scopes it may
   * be granted, and the machines it could reach. It reads; it never consumes or issues.
   */
  async context(account: Account, rid: string) {
    this.#assertEntitled(account);
    const request = await this.#pending(rid);
    const nodes = await this.deps.nodes.list(account.id);
    const target = redirectTarget(request.redirectUri);
    return {
      rid,
      client: {
        client_id: request.clientId,
        kind: request.clientKind,
        label: request.clientLabel,
        declared_name: request.clientName,
        verified: request.clientKind === "registered",
      },
      redirect_uri: request.redirectUri,
      redirect_host: target.host,
      redirect_local_only: target.localOnly,
      scopes: request.scopes,
      access_offered: request.scopes.includes("engine:operate") ? (["read", "operate"] as Access[]) : (["read"] as Access[]),
      resource: request.resource,
      nodes: nodes.map((node) => ({ id: node.id, slug: node.slug, hostname: node.hostname })),
      expires_at: iso(request.expiresAt),
    };
  }

  /**
   * decide consumes the request once (a compare-and-set) and answers where the browser goes:
   * the client's redirect URI with a single-use `code`, `state` and `iss`, or with
   * `error=access_denied`. Approving with an access the client did not ask for, or naming
   * machines that are not the account's, is refused (400) and consumes nothing.
   */
  async decide(account: Account, input: DecisionInput, source: string): Promise<{ redirect_to: string; approved: boolean }> {
    this.#assertEntitled(account);
    const request = await this.#pending(input.rid);
    let nodeIds: string[] | null = null;
    let scopes: AssistantScope[] = [];
    if (input.approve) {
      const access = input.access ?? "read";
      if (access === "operate" && !request.scopes.includes("engine:operate")) {
        throw new AppError("invalid_request", "the assistant asked to read only: operate cannot be granted to this request");
      }
      scopes = scopesForAccess(access);
      if (input.node_ids !== undefined && input.node_ids !== null) {
        const chosen = [...new Set(input.node_ids)];
        if (chosen.length === 0) throw new AppError("invalid_request", "choose at least one machine, or all machines (node_ids null)");
        const owned = new Set((await this.deps.nodes.list(account.id)).map((node) => node.id));
        const foreign = chosen.filter((id) => !owned.has(id));
        if (foreign.length > 0) throw new AppError("invalid_request", `not a machine of this account: ${foreign[0]?.slice(0, 64)}`);
        nodeIds = chosen;
      }
    }
    const now = this.deps.clock();
    const code = input.approve ? newSecret(SECRET_PREFIXES.code) : null;
    const decided = await this.deps.db.transaction(async (tx) => {
      if (!(await this.store.decideRequest(tx, request.id, account.id, input.approve ? "approved" : "denied", now))) return null;
      if (!code) {
        await this.deps.audit.write(
          { accountId: account.id, action: "assistant.denied", subject: request.id, source, details: { client_id: request.clientId } },
          tx,
        );
        return "denied";
      }
      const grantId = await this.store.createGrant(tx, {
        accountId: account.id,
        clientId: request.clientId,
        clientLabel: request.clientLabel,
        redirectUri: request.redirectUri,
        scopes,
        nodeIds,
        resource: request.resource,
        code,
        codeChallenge: request.codeChallenge,
        codeExpiresAt: now + CODE_TTL_MS,
        now,
      });
      await this.deps.audit.write(
        {
          accountId: account.id,
          action: "assistant.authorized",
          subject: grantId,
          source,
          details: { client_id: request.clientId, scope: scopes.join(" "), nodes: nodeIds === null ? "all" : nodeIds.length },
        },
        tx,
      );
      return "approved";
    });
    if (decided === null) {
      // Decided (or expired) between the read and the compare-and-set: answer as a later read would.
      await this.#pending(input.rid);
      throw new AppError("already_consumed", "this authorization has already been decided");
    }
    const answer =
      decided === "approved"
        ? { code, state: request.state, iss: this.issuer }
        : { error: "access_denied", error_description: "the person declined", state: request.state, iss: this.issuer };
    return { redirect_to: withParameters(request.redirectUri, answer), approved: decided === "approved" };
  }

  // ---- the token endpoint

  /** #clientOf reads the client id of a token or revocation request: the form's, or a Basic header's user name (its secret is ignored). */
  #clientOf(form: URLSearchParams, authorization: string | null): string {
    let fromHeader: string | null = null;
    if (authorization) {
      const basic = /^Basic\s+([A-Za-z0-9+/=]+)$/i.exec(authorization.trim());
      if (!basic) throw new OAuthError("invalid_client", "only public clients: send client_id in the body (or HTTP Basic)", 401);
      const decoded = Buffer.from(basic[1] as string, "base64").toString("utf8");
      const colon = decoded.indexOf(":");
      try {
        fromHeader = decodeURIComponent((colon === -1 ? decoded : decoded.slice(0, colon)).replace(/\+/g, " "));
      } catch {
        throw new OAuthError("invalid_client", "the Basic header's client id is not valid form encoding", 401);
      }
    }
    const fromForm = form.getAll("client_id");
    if (fromForm.length > 1) throw new OAuthError("invalid_request", "client_id appears more than once");
    const id = fromForm[0] ?? fromHeader;
    if (fromForm[0] !== undefined && fromHeader !== null && fromForm[0] !== fromHeader) {
      throw new OAuthError("invalid_request", "the body's client_id and the Basic header's differ");
    }
    if (!id) throw new OAuthError("invalid_client", "the request names no client_id", 401);
    return id;
  }

  /**
   * #knownClient checks that a client id is still one the console knows: a pre-registered or
   * self-registered client must exist (a swept registration answers 401 `invalid_client`, the
   * signal for an assistant to register again); a metadata document URL is not fetched again,
   * the code or token it presents is bound to it.
   */
  async #knownClient(clientId: string): Promise<void> {
    if (this.deps.clients.isMetadataDocument(clientId)) return;
    const client = await this.deps.clients.resolve(clientId).catch(() => null);
    if (!client) throw new OAuthError("invalid_client", "the console does not know this client_id (register again)", 401);
    await this.deps.clients.touch(client);
  }

  #checkResource(form: URLSearchParams): void {
    if (form.getAll("resource").some((resource) => resource !== this.mcpUrl)) {
      throw new OAuthError("invalid_target", `the only resource this console issues tokens for is ${this.mcpUrl}`);
    }
  }

  /** token handles `POST /oauth/token` for the two grants this server has. */
  async token(form: URLSearchParams, authorization: string | null, source: string): Promise<TokenAnswer> {
    for (const name of ["grant_type", "code", "code_verifier", "redirect_uri", "refresh_token", "scope"]) {
      if (form.getAll(name).length > 1) throw new OAuthError("invalid_request", `${name} appears more than once`);
    }
    const grantType = form.get("grant_type");
    if (grantType !== "authorization_code" && grantType !== "refresh_token") {
      throw new OAuthError(
        grantType ? "unsupported_grant_type" : "invalid_request",
        "grant_type must be authorization_code or refresh_token",
      );
    }
    const clientId = this.#clientOf(form, authorization);
    await this.#knownClient(clientId);
    // RFC 8707: checked before the code is touched, so a wrong audience leaves the code usable.
    this.#checkResource(form);
    return grantType === "authorization_code" ? this.#exchangeCode(form, clientId, source) : this.#refresh(form, clientId, source);
  }

  async #issue(tx: Sql, grant: Grant, scopes: AssistantScope[], parentId: string | null, now: number): Promise<TokenAnswer> {
    const access = newSecret(SECRET_PREFIXES.access);
    const refresh = newSecret(SECRET_PREFIXES.refresh);
    const common = { grantId: grant.id, clientId: grant.clientId, resource: grant.resource, parentId, now };
    await this.store.insertToken(tx, { ...common, token: access, kind: "access", scopes, expiresAt: now + ACCESS_TTL_S * 1000 });
    // The refresh token keeps the grant's scopes: a narrowed access token does not narrow later refreshes (RFC 6749 §6).
    await this.store.insertToken(tx, { ...common, token: refresh, kind: "refresh", scopes: grant.scopes, expiresAt: now + REFRESH_TTL_MS });
    await this.store.touchGrant(tx, grant.id, now);
    return { access_token: access, token_type: "Bearer", expires_in: ACCESS_TTL_S, refresh_token: refresh, scope: scopes.join(" ") };
  }

  async #exchangeCode(form: URLSearchParams, clientId: string, source: string): Promise<TokenAnswer> {
    const code = form.get("code");
    const verifier = form.get("code_verifier");
    if (!code) throw new OAuthError("invalid_request", "code is required");
    if (!verifier) throw new OAuthError("invalid_request", "code_verifier is required (PKCE)");
    if (!VERIFIER_SHAPE.test(verifier)) throw new OAuthError("invalid_request", "code_verifier must be 43 to 128 unreserved characters");
    if (!code.startsWith(SECRET_PREFIXES.code) || code.length > 128) throw new OAuthError("invalid_grant", "the code is not valid");
    const redirectUri = form.get("redirect_uri");
    const now = this.deps.clock();
    // The code is spent by the first presentation whatever follows, so a stolen code cannot be
    // tried against many verifiers; a failure is answered after the commit.
    const outcome = await this.deps.db.transaction(async (tx): Promise<Outcome> => {
      const used = await this.store.useCode(tx, code, now);
      if (!used) return { failure: "the code is not valid" };
      const { grant, fresh } = used;
      if (!fresh) {
        const revoked = await this.store.revokeGrant(grant.id, "authorization code replayed", now, { tx });
        if (revoked) {
          await this.deps.audit.write(
            {
              accountId: grant.accountId,
              action: "assistant.revoked",
              subject: grant.id,
              source,
              details: { client_id: grant.clientId, reason: "authorization code replayed" },
            },
            tx,
          );
        }
        return { failure: "the code was already used: everything it issued is revoked", revokedGrant: true };
      }
      if (grant.revokedAt !== null) return { failure: "the authorization was revoked" };
      if (grant.codeExpiresAt <= now) return { failure: "the code has expired" };
      if (grant.clientId !== clientId) return { failure: "the code was issued to another client" };
      if (redirectUri !== null && redirectUri !== grant.redirectUri)
        return { failure: "redirect_uri differs from the authorization request's" };
      if (!constantTimeEqual(s256(verifier), grant.codeChallenge))
        return { failure: "the code_verifier does not match the code_challenge" };
      return { answer: await this.#issue(tx, grant, grant.scopes, null, now) };
    });
    if (outcome.failure !== undefined) {
      if (outcome.revokedGrant)
        this.deps.log.warn({ client_id: clientId }, "an authorization code was presented twice; its grant is revoked");
      throw new OAuthError("invalid_grant", outcome.failure);
    }
    return outcome.answer;
  }

  async #refresh(form: URLSearchParams, clientId: string, source: string): Promise<TokenAnswer> {
    const token = form.get("refresh_token");
    if (!token) throw new OAuthError("invalid_request", "refresh_token is required");
    const invalid = () => new OAuthError("invalid_grant", "the refresh token is not valid");
    if (!token.startsWith(SECRET_PREFIXES.refresh) || token.length > 128) throw invalid();
    const found = await this.store.tokenBySecret(token);
    if (found?.kind !== "refresh" || found.clientId !== clientId) throw invalid();
    const now = this.deps.clock();
    const outcome = await this.deps.db.transaction(async (tx): Promise<Outcome> => {
      const current = (await this.store.lockToken(tx, found.id)) as TokenRecord;
      const grant = await this.store.grant(current.grantId, tx);
      if (!grant || grant.revokedAt !== null || current.revokedAt !== null) return { failure: "the refresh token has been revoked" };
      if (current.expiresAt <= now) return { failure: "the refresh token has expired" };
      let scopes = grant.scopes;
      const asked = form.get("scope");
      if (asked !== null) {
        const words = new Set(asked.split(" ").filter(Boolean));
        scopes = grant.scopes.filter((scope) => words.has(scope));
        if (scopes.length === 0) return { failure: "none of the asked scopes was granted", error: "invalid_scope" };
      }
      if (current.usedAt !== null) {
        const children = await this.store.liveChildren(tx, current.id);
        const successor = children.find((child) => child.kind === "refresh");
        if (!successor || successor.usedAt !== null) {
          await this.store.revokeGrant(grant.id, "refresh token reused", now, { tx });
          await this.deps.audit.write(
            {
              accountId: grant.accountId,
              action: "assistant.revoked",
              subject: grant.id,
              source,
              details: { client_id: grant.clientId, reason: "refresh token reused" },
            },
            tx,
          );
          return { failure: "the refresh token was already used: the authorization is revoked", revokedGrant: true };
        }
        // The successor was never used: the client lost the answer. Replace it.
        await this.store.revokeTokens(
          tx,
          children.map((child) => child.id),
          now,
        );
      } else {
        await this.store.markUsed(tx, current.id, now);
      }
      return { answer: await this.#issue(tx, grant, scopes, current.id, now) };
    });
    if (outcome.failure !== undefined) {
      if (outcome.revokedGrant)
        this.deps.log.warn({ client_id: clientId }, "a rotated refresh token was presented again; its grant is revoked");
      throw new OAuthError(outcome.error ?? "invalid_grant", outcome.failure);
    }
    return outcome.answer;
  }

  // ---- revocation (RFC 7009)

  /**
   * revoke handles `POST /oauth/revoke`. An unknown token answers 200 (RFC 7009 §2.2); a token
   * issued to another client is refused and left alone. Revoking a refresh token revokes its
   * grant and every token under it; revoking an access token revokes that token.
   */
  async revoke(form: URLSearchParams, authorization: string | null, source: string): Promise<void> {
    if (form.getAll("token").length > 1) throw new OAuthError("invalid_request", "token appears more than once");
    const token = form.get("token");
    if (!token) throw new OAuthError("invalid_request", "token is required");
    const clientId = this.#clientOf(form, authorization);
    if (token.length > 128) return;
    const found = await this.store.tokenBySecret(token);
    if (!found) return;
    if (found.clientId !== clientId) throw new OAuthError("unauthorized_client", "the token was not issued to this client");
    const now = this.deps.clock();
    if (found.kind === "access") {
      await this.deps.db.transaction((tx) => this.store.revokeTokens(tx, [found.id], now));
      return;
    }
    await this.deps.db.transaction(async (tx) => {
      const grant = await this.store.grant(found.grantId, tx);
      if (!grant || !(await this.store.revokeGrant(grant.id, "revoked by the assistant", now, { tx }))) return;
      await this.deps.audit.write(
        {
          accountId: grant.accountId,
          action: "assistant.revoked",
          subject: grant.id,
          source,
          details: { client_id: grant.clientId, reason: "revoked by the assistant" },
        },
        tx,
      );
    });
  }

  // ---- dynamic registration (RFC 7591)

  /** register handles `POST /oauth/register`: a public client, `none` at the token endpoint whatever was asked. */
  async register(body: unknown) {
    let metadata: ReturnType<typeof registrationMetadata>;
    try {
      metadata = registrationMetadata(body);
    } catch (error) {
      if (error instanceof RegistrationRefused) throw new OAuthError(error.error, error.message);
      throw error;
    }
    const registered = await this.deps.clients.register(metadata);
    return {
      client_id: registered.clientId,
      client_id_issued_at: Math.floor(registered.issuedAt / 1000),
      token_endpoint_auth_method: "none",
      response_types: ["code"],
      ...metadata,
    };
  }

  // ---- the account's grants

  /** grants lists the account's authorized assistants, newest first, revoked ones included. */
  async grants(accountId: string) {
    return (await this.store.grants(accountId)).map((grant) => ({
      id: grant.id,
      client_id: grant.clientId,
      client_label: grant.clientLabel,
      redirect_host: redirectTarget(grant.redirectUri).host,
      scopes: grant.scopes,
      access: (grant.scopes.includes("engine:operate") ? "operate" : "read") as Access,
      node_ids: grant.nodeIds,
      created_at: iso(grant.createdAt),
      last_used_at: grant.lastUsedAt === null ? null : iso(grant.lastUsedAt),
      revoked: grant.revokedAt !== null,
      revoked_at: grant.revokedAt === null ? null : iso(grant.revokedAt),
      revoked_reason: grant.revokedReason,
    }));
  }

  /** revokeGrant revokes one of the account's grants and its tokens at once; only a change writes an audit row. */
  async revokeGrant(accountId: string, grantId: string, source: string): Promise<void> {
    const now = this.deps.clock();
    await this.deps.db.transaction(async (tx) => {
      const grant = await this.store.grant(grantId, tx);
      if (!grant || grant.accountId !== accountId) return;
      if (!(await this.store.revokeGrant(grantId, "revoked by the account", now, { accountId, tx }))) return;
      await this.deps.audit.write(
        {
          accountId,
          action: "assistant.revoked",
          subject: grantId,
          source,
          details: { client_id: grant.clientId, reason: "revoked by the account" },
        },
        tx,
      );
    });
  }
}
