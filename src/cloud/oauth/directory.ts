import { digestSecret, randomId } from "../../lib/crypto";
import { type Database, num } from "../db";
import { isMetadataDocumentId, MetadataDocuments } from "./cimd";
import { type AssistantName, type Client, ClientRefused, PREREGISTERED, type RegistrationMetadata } from "./clients";
import { redirectTarget } from "./redirects";

/** DYNAMIC_CLIENT_IDLE_MS: a self-registered client neither used nor holding a live grant for 30 days is deleted. */
export const DYNAMIC_CLIENT_IDLE_MS = 30 * 86_400_000;

/** Registered is a registration's answer: the client and when it was first registered (a repeat answers the same). */
export interface Registered {
  clientId: string;
  issuedAt: number;
  metadata: RegistrationMetadata;
}

/**
 * ClientDirectory answers who a client id is: one of the three assistants the console
 * pre-registers (held in a frozen snapshot built once, so the connector route reads no row),
 * a metadata document URL (fetched and cached by MetadataDocuments), or a client that
 * registered itself (a row of `oauth_clients`).
 */
export class ClientDirectory {
  /** registered is the snapshot of the pre-registered assistants, by client id and by assistant name. */
  readonly registered: ReadonlyMap<string, Client>;
  readonly byAssistant: ReadonlyMap<AssistantName, Client>;
  readonly #documents: MetadataDocuments;

  constructor(
    private readonly db: Database,
    private readonly options: { allowLoopback: boolean; clock: () => number; resolve?: (hostname: string) => Promise<string[]> },
  ) {
    this.registered = new Map(PREREGISTERED.map(({ client }) => [client.id, client]));
    this.byAssistant = new Map(PREREGISTERED.map(({ assistant, client }) => [assistant, client]));
    this.#documents = new MetadataDocuments({ allowLoopback: options.allowLoopback, clock: options.clock, resolve: options.resolve });
  }

  /** isMetadataDocument says whether a client id is a metadata document URL. */
  isMetadataDocument(clientId: string): boolean {
    return isMetadataDocumentId(clientId, this.options.allowLoopback);
  }

  /**
   * resolve returns the client a client id names, or null when the console does not know it;
   * a metadata document the console will not use is `ClientRefused`.
   */
  async resolve(clientId: string): Promise<Client | null> {
    const registered = this.registered.get(clientId);
    if (registered) return registered;
    if (this.isMetadataDocument(clientId)) return this.#documents.resolve(clientId);
    if (!clientId.startsWith("dcr_") || clientId.length > 64) return null;
    const [row] = await this.db.sql`SELECT * FROM oauth_clients WHERE id = ${clientId}`;
    if (!row) return null;
    const metadata = JSON.parse(row.metadata as string) as RegistrationMetadata;
    return {
      id: clientId,
      kind: "dynamic",
      // A self-registered client's name and id prove nothing: it is named by where its answers go.
      label: metadata.redirect_uris.map((uri) => redirectTarget(uri).host).join(", "),
      declaredName: (row.name as string) ?? "",
      redirectUris: metadata.redirect_uris,
      redirectPatterns: [],
    };
  }

  /** require is resolve for a client that must exist: an unknown one is `ClientRefused`. */
  async require(clientId: string): Promise<Client> {
    const client = await this.resolve(clientId);
    if (!client) throw new ClientRefused("the console does not know this client_id: register the client, or use a metadata document URL");
    return client;
  }

  /**
   * register records a self-registered client. An identical registration (the same kept
   * metadata) answers the client registered first instead of a new one, so an assistant that
   * registers on every connection does not fill the table.
   */
  async register(metadata: RegistrationMetadata): Promise<Registered> {
    const canonical = JSON.stringify(metadata, Object.keys(metadata).sort());
    const digest = digestSecret(`dcr:${canonical}`);
    const now = this.options.clock();
    const id = randomId("dcr");
    await this.db.sql`INSERT INTO oauth_clients (id, metadata_digest, name, redirect_uris, metadata, created_at, last_used_at)
      VALUES (${id}, ${digest}, ${metadata.client_name ?? ""}, ${JSON.stringify(metadata.redirect_uris)}, ${JSON.stringify(metadata)},
        ${now}, ${now})
      ON CONFLICT (metadata_digest) DO UPDATE SET last_used_at = ${now}`;
    const [row] = await this.db.sql`SELECT id, created_at FROM oauth_clients WHERE metadata_digest = ${digest}`;
    return { clientId: row.id as string, issuedAt: num(row.created_at), metadata };
  }

  /** touch records that a self-registered client was used now (an authorization or a token), keeping it from the sweep. */
  async touch(client: Client): Promise<void> {
    if (client.kind !== "dynamic") return;
    await this.db.sql`UPDATE oauth_clients SET last_used_at = ${this.options.clock()} WHERE id = ${client.id}`;
  }

  /** sweep deletes self-registered clients idle for DYNAMIC_CLIENT_IDLE_MS that hold no unrevoked grant. */
  async sweep(): Promise<number> {
    const before = this.options.clock() - DYNAMIC_CLIENT_IDLE_MS;
    const rows = await this.db.sql`DELETE FROM oauth_clients WHERE last_used_at < ${before}
      AND NOT EXISTS (SELECT 1 FROM oauth_grants WHERE oauth_grants.client_id = oauth_clients.id AND oauth_grants.revoked_at IS NULL)
      RETURNING id`;
    return rows.length;
  }
}
