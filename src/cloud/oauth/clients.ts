import { cleanText } from "../nodes";
import { redirectMatches, redirectUriProblem } from "./redirects";

/** ClientKind says how the console knows a client: pre-registered by the console, a metadata document URL, or self-registered (RFC 7591). */
export type ClientKind = "registered" | "metadata_document" | "dynamic";

/** Client is an assistant as the authorization server knows it. */
export interface Client {
  id: string;
  kind: ClientKind;
  /**
   * label is who the consent page says is asking: the assistant's name for one the console
   * pre-registered, the host of a metadata document's URL (which the client cannot choose
   * freely), and for a self-registered client the host its answers go to.
   */
  label: string;
  /** declaredName is the name the client gives itself: shown only as unverified. */
  declaredName: string;
  redirectUris: string[];
  /** redirectPatterns admit a family of redirect URIs (ChatGPT's per-connector callbacks). */
  redirectPatterns: RegExp[];
}

/** ClientRefused says why a client cannot be used; the authorization endpoint shows it on its error page, never as a redirect. */
export class ClientRefused extends Error {}

/** CLIENT_NAME_MAX bounds a client's self-declared name (characters, after cleaning). */
export const CLIENT_NAME_MAX = 100;

/** ASSISTANT_NAMES are the three assistants the console pre-registers, as `/api/oauth/connector?client_id=` names them. */
export const ASSISTANT_NAMES = ["claude", "chatgpt", "cursor"] as const;
export type AssistantName = (typeof ASSISTANT_NAMES)[number];

/** RegisteredAssistant is a client the console registers itself, with the redirect URIs its vendor uses. */
export interface RegisteredAssistant {
  assistant: AssistantName;
  client: Client;
}

/**
 * PREREGISTERED are the three assistants the contract's connector names, with their vendors'
 * redirect URIs (docs/decisions.md 224 cites where each comes from):
 *
 * - Claude (claude.ai, Claude Desktop's remote connectors): `https://claude.ai/api/mcp/auth_callback`,
 *   and `https://claude.com/api/mcp/auth_callback`, which Anthropic says it may move to.
 * - ChatGPT: a callback per connector, `https://chatgpt.com/connector/oauth/<callback id>`, and
 *   the older fixed `https://chatgpt.com/connector_platform_oauth_redirect`.
 * - Cursor: its app's own scheme `cursor://anysphere.cursor-mcp/oauth/callback`, the hosted
 *   `https://www.cursor.com/agents/mcp/oauth/callback`, and the loopback
 *   `http://localhost:8787/callback` (any port, RFC 8252 §7.3).
 */
export const PREREGISTERED: readonly RegisteredAssistant[] = Object.freeze([
  {
    assistant: "claude",
    client: {
      id: "engine-claude",
      kind: "registered",
      label: "Claude",
      declaredName: "Claude",
      redirectUris: ["https://claude.ai/api/mcp/auth_callback", "https://claude.com/api/mcp/auth_callback"],
      redirectPatterns: [],
    },
  },
  {
    assistant: "chatgpt",
    client: {
      id: "engine-chatgpt",
      kind: "registered",
      label: "ChatGPT",
      declaredName: "ChatGPT",
      redirectUris: ["https://chatgpt.com/connector_platform_oauth_redirect"],
      redirectPatterns: [/^https:\/\/chatgpt\.com\/connector\/oauth\/[A-Za-z0-9_-]{1,128}$/],
    },
  },
  {
    assistant: "cursor",
    client: {
      id: "engine-cursor",
      kind: "registered",
      label: "Cursor",
      declaredName: "Cursor",
      redirectUris: [
        "cursor://anysphere.cursor-mcp/oauth/callback",
        "https://www.cursor.com/agents/mcp/oauth/callback",
        "http://localhost:8787/callback",
      ],
      redirectPatterns: [],
    },
  },
] satisfies RegisteredAssistant[]);

/** acceptsRedirect says whether a client registered `uri` (exactly, on any loopback port, or by one of its patterns). */
export function acceptsRedirect(client: Client, uri: string): boolean {
  return client.redirectUris.some((registered) => redirectMatches(registered, uri)) || client.redirectPatterns.some((p) => p.test(uri));
}

// ---- dynamic registration (RFC 7591)

/** RegistrationRefused is an RFC 7591 §3.2.2 error: `invalid_redirect_uri` or `invalid_client_metadata`. */
export class RegistrationRefused extends Error {
  constructor(
    readonly error: "invalid_redirect_uri" | "invalid_client_metadata",
    message: string,
  ) {
    super(message);
  }
}

/** REGISTRATION_AUTH_METHODS are the methods a registration may ask for; every one is answered `none` (public client + PKCE). */
const REGISTRATION_AUTH_METHODS = new Set(["none", "client_secret_post", "client_secret_basic"]);
const SUPPORTED_GRANT_TYPES = ["authorization_code", "refresh_token"];

/** RegistrationMetadata is what the console keeps of a registration: what it uses, bounded. */
export interface RegistrationMetadata {
  redirect_uris: string[];
  client_name?: string;
  client_uri?: string;
  scope?: string;
  software_id?: string;
  software_version?: string;
  grant_types: string[];
}

function optionalText(body: Record<string, unknown>, field: string, max: number): string | undefined {
  const value = body[field];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "string") throw new RegistrationRefused("invalid_client_metadata", `${field} must be a string`);
  if (value.length > max) throw new RegistrationRefused("invalid_client_metadata", `${field} is longer than ${max} characters`);
  return value;
}

/**
 * registrationMetadata checks an RFC 7591 registration request and returns what is kept. The
 * console has public clients only: `none` is answered whatever was asked among `none`,
 * `client_secret_post` and `client_secret_basic` (a client that asks for a secret gets none,
 * RFC 7591 §3.2.1 lets the server replace a value); any other method is refused.
 */
export function registrationMetadata(body: unknown): RegistrationMetadata {
  if (body === null || typeof body !== "object" || Array.isArray(body)) {
    throw new RegistrationRefused("invalid_client_metadata", "the registration must be a JSON object");
  }
  const fields = body as Record<string, unknown>;
  const redirects = fields.redirect_uris;
  if (!Array.isArray(redirects) || redirects.length === 0 || redirects.length > 10) {
    throw new RegistrationRefused("invalid_redirect_uri", "redirect_uris must list 1 to 10 redirect URIs");
  }
  for (const uri of redirects) {
    const problem = redirectUriProblem(uri);
    if (problem) throw new RegistrationRefused("invalid_redirect_uri", problem);
  }
  const method = fields.token_endpoint_auth_method ?? "none";
  if (typeof method !== "string" || !REGISTRATION_AUTH_METHODS.has(method)) {
    throw new RegistrationRefused(
      "invalid_client_metadata",
      "token_endpoint_auth_method must be none (client_secret_post and client_secret_basic are answered none)",
    );
  }
  let grantTypes = SUPPORTED_GRANT_TYPES;
  if (fields.grant_types !== undefined) {
    if (!Array.isArray(fields.grant_types) || !fields.grant_types.includes("authorization_code")) {
      throw new RegistrationRefused("invalid_client_metadata", "grant_types must include authorization_code");
    }
    grantTypes = SUPPORTED_GRANT_TYPES.filter((grant) => (fields.grant_types as unknown[]).includes(grant));
  }
  if (fields.response_types !== undefined && !(Array.isArray(fields.response_types) && fields.response_types.includes("code"))) {
    throw new RegistrationRefused("invalid_client_metadata", "response_types must include code");
  }
  const name = optionalText(fields, "client_name", 1000);
  const clientUri = optionalText(fields, "client_uri", 2048);
  const metadata: RegistrationMetadata = { redirect_uris: redirects as string[], grant_types: grantTypes };
  if (name !== undefined) metadata.client_name = cleanText(name, CLIENT_NAME_MAX);
  if (clientUri !== undefined) metadata.client_uri = clientUri;
  const scope = optionalText(fields, "scope", 1000);
  if (scope !== undefined) metadata.scope = scope;
  const softwareId = optionalText(fields, "software_id", 200);
  if (softwareId !== undefined) metadata.software_id = softwareId;
  const softwareVersion = optionalText(fields, "software_version", 100);
  if (softwareVersion !== undefined) metadata.software_version = softwareVersion;
  return metadata;
}
