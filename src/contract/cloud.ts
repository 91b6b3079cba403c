/**
 * Schemas of the cloud console API (../shared/spec/cloud-console-api.md), interface 0.1.0.
 *
 * The console's routes validate with these and the engine's link client reads answers with
 * the same ones, so the two cannot drift. Names follow RFC 8628 where the device flow has one.
 */
import { type Static, Type as t } from "@sinclair/typebox";

export const CLOUD_INTERFACE_VERSION = "0.1.0";

const DateTime = t.String({ format: "date-time" });
/**
 * SafeInteger is every integer these schemas leave otherwise unbounded: within the range a JSON
 * number holds exactly (2^53 - 1), so no value is silently rounded or overflows a column.
 */
const SafeInteger = t.Integer({ minimum: Number.MIN_SAFE_INTEGER, maximum: Number.MAX_SAFE_INTEGER });

/** ErrorEnvelope is the body of every non-422 error (the same envelope as the engine's). */
export const ErrorEnvelope = t.Object(
  {
    error: t.Object({
      code: t.String(),
      message: t.String(),
      request_id: t.String(),
      /** interval is set on `slow_down`: the new polling interval in seconds (RFC 8628 §3.5). */
      interval: t.Optional(SafeInteger),
    }),
  },
  { $id: "ErrorEnvelope" },
);
export const HTTPValidationError = t.Object(
  {
    detail: t.Array(
      t.Object({
        loc: t.Array(t.Union([t.String(), SafeInteger])),
        msg: t.String(),
        type: t.String(),
        input: t.Unknown(),
        ctx: t.Record(t.String(), t.Unknown()),
      }),
    ),
  },
  { $id: "HTTPValidationError" },
);

export const HealthView = t.Record(t.String(), t.Union([t.String(), t.Record(t.String(), t.String())]), { $id: "HealthView" });
export const ReadyView = t.Record(t.String(), t.Union([t.Boolean(), SafeInteger, t.String()]), { $id: "ReadyView" });

// ---- sign-in and sessions

export const SocialProviderName = t.Union([t.Literal("github"), t.Literal("google")]);
export const ReturnTo = t.String({ default: "/", maxLength: 2048 });
export const LoginQuery = t.Object({ return_to: t.Optional(ReturnTo), identity: t.Optional(t.String({ maxLength: 320 })) });
export const SocialQuery = t.Object({ provider: SocialProviderName, return_to: t.Optional(ReturnTo) });
export const CallbackQuery = t.Object({ code: t.String({ maxLength: 4096, writeOnly: true }), state: t.String({ maxLength: 512 }) });
/** LoginStart is the answer of both sign-in starts: where the browser goes next. */
export const LoginStart = t.Object({ url: t.String(), expires_in: SafeInteger }, { $id: "LoginStart" });
/** SignedIn is the answer of both callbacks: the session is in the Set-Cookie header; `return_to` is where to go. */
export const SignedIn = t.Object({ return_to: t.String(), account_id: t.String(), expires_at: DateTime }, { $id: "SignedIn" });

export const ProviderConfigView = t.Object(
  { publishable_key: t.String(), project_url: t.String(), client_id: t.String() },
  { $id: "ProviderConfigView" },
);
export const AccountView = t.Object({
  id: t.String(),
  email: t.String(),
  name: t.String(),
  standing: t.String(),
  remote_link: t.Boolean(),
  paid: t.Boolean(),
  node_limit: SafeInteger,
});
export const SessionView = t.Object(
  {
    session_id: t.String(),
    kind: t.String(),
    created_at: DateTime,
    expires_at: DateTime,
    absolute_expires_at: DateTime,
    account: AccountView,
  },
  { $id: "SessionView" },
);
export const LogoutAllView = t.Object({ ended: SafeInteger }, { $id: "LogoutAllView" });

// ---- linking

export const LinkMetadataView = t.Object({ hosted_base_domain: t.String() }, { $id: "LinkMetadataView" });

/** LinkClaimResponse is the one node-identity answer of claim, poll (approved) and preauth. */
export const LinkClaimResponse = t.Object(
  {
    node_id: t.String(),
    slug: t.String(),
    account_id: t.String(),
    /** node_credential is the node's own secret for later calls; shown once. */
    node_credential: t.String(),
    cloud_url: t.String(),
    hosted_base_domain: t.String(),
  },
  { $id: "LinkClaimResponse" },
);
export type LinkClaimResponse = Static<typeof LinkClaimResponse>;

const Hostname = t.String({ minLength: 1, maxLength: 1024 });
const ReportedOs = t.String({ maxLength: 1024, default: "" });
const ReportedVersion = t.String({ maxLength: 1024, default: "" });

export const LinkClaimRequest = t.Object(
  {
    code: t.String({ minLength: 1, maxLength: 128, writeOnly: true }),
    hostname: Hostname,
    os: t.Optional(ReportedOs),
    version: t.Optional(ReportedVersion),
  },
  { $id: "LinkClaimRequest" },
);
export const LinkCodeMintRequest = t.Object({ expires_in_s: t.Optional(t.Integer({ minimum: 60, maximum: 3600 })) });
export const LinkCodeMintResponse = t.Object({ code: t.String(), expires_at: DateTime }, { $id: "LinkCodeMintResponse" });

export const DeviceLinkRequest = t.Object({ hostname: Hostname, os: ReportedOs, version: ReportedVersion }, { $id: "DeviceLinkRequest" });
export const DeviceLinkResponse = t.Object(
  {
    device_code: t.String(),
    user_code: t.String(),
    verification_uri: t.String(),
    verification_uri_complete: t.String(),
    expires_in: SafeInteger,
    interval: SafeInteger,
  },
  { $id: "DeviceLinkResponse" },
);
export type DeviceLinkResponse = Static<typeof DeviceLinkResponse>;
export const DevicePollRequest = t.Object(
  { device_code: t.String({ minLength: 1, maxLength: 256, writeOnly: true }) },
  { $id: "DevicePollRequest" },
);
export const DevicePollPending = t.Object(
  { status: t.Literal("authorization_pending"), interval: SafeInteger, expires_in: SafeInteger },
  { $id: "DevicePollPending" },
);

export const PreauthLinkRequest = t.Object(
  { key: t.String({ minLength: 1, maxLength: 256, writeOnly: true }), hostname: Hostname, os: ReportedOs, version: ReportedVersion },
  { $id: "PreauthLinkRequest" },
);
export const PreauthKeyMintRequest = t.Object(
  {
    expires_in_s: t.Optional(t.Integer({ minimum: 60, maximum: 90 * 86_400 })),
    max_uses: t.Optional(t.Integer({ minimum: 1, maximum: 1000 })),
    description: t.Optional(t.String({ maxLength: 200 })),
  },
  { $id: "PreauthKeyMintRequest" },
);
export const PreauthKeyMintResponse = t.Object(
  { id: t.String({ format: "uuid" }), key: t.String(), expires_at: DateTime, max_uses: SafeInteger },
  { $id: "PreauthKeyMintResponse" },
);
export const PreauthKeyView = t.Object({
  id: t.String({ format: "uuid" }),
  description: t.String(),
  created_at: DateTime,
  expires_at: DateTime,
  max_uses: SafeInteger,
  uses: SafeInteger,
  revoked: t.Boolean(),
  expired: t.Boolean(),
});
export const PreauthKeysView = t.Object({ keys: t.Array(PreauthKeyView) }, { $id: "PreauthKeysView" });
export const PreauthKeyIdParams = t.Object({ key_id: t.String({ format: "uuid" }) });

// ---- device approvals

export const DeviceApprovalRequest = t.Object(
  { user_code: t.String({ minLength: 1, maxLength: 32, writeOnly: true }) },
  { $id: "DeviceApprovalRequest" },
);
/** DeviceApprovalView shows a pending request: what the machine reported (unverified) and where it asked from. */
export const DeviceApprovalView = t.Object(
  {
    user_code: t.String(),
    state: t.String(),
    reported: t.Object({ hostname: t.String(), os: t.String(), version: t.String(), verified: t.Literal(false) }),
    source_address: t.String(),
    requested_at: DateTime,
    expires_at: DateTime,
    attempts_left: SafeInteger,
  },
  { $id: "DeviceApprovalView" },
);
export const DeviceApprovalGrant = t.Object(
  { approved: t.Literal(true), node_id: t.String(), slug: t.String(), adopted: t.Boolean() },
  { $id: "DeviceApprovalGrant" },
);
export const DeviceDenial = t.Object({ denied: t.Literal(true) }, { $id: "DeviceDenial" });

// ---- nodes (issue 7: the console's nodes page; not in the spec)

/** NodeView is a linked machine as the console lists it: what it reported (unverified) and how it enrolled; never its credential. */
export const NodeView = t.Object({
  id: t.String(),
  slug: t.String(),
  hostname: t.String(),
  os: t.String(),
  version: t.String(),
  enrolled_via: t.String(),
  created_at: DateTime,
  last_seen_at: t.Union([DateTime, t.Null()], {
    description: "When the console last heard from the machine over its tunnel; for an offline machine, since when",
  }),
  online: t.Boolean({ description: "Whether the machine's engine has its tunnel to the console open now" }),
  online_since: t.Union([DateTime, t.Null()]),
  gpus: t.Union(
    [
      t.Array(
        t.Object({
          index: SafeInteger,
          name: t.String(),
          memory_total_mb: SafeInteger,
          mig_profile: t.Union([t.String(), t.Null()]),
        }),
      ),
      t.Null(),
    ],
    { description: "The GPUs the engine last reported (unverified); null until it first connected" },
  ),
});
export const NodesView = t.Object({ nodes: t.Array(NodeView) }, { $id: "NodesView" });

// ---- assistants (issue 14): the consent's context and decision, the connector, the account's grants

/** AssistantScopeName is a scope an assistant may be granted; `engine:operate` includes `engine:read`. */
export const AssistantScopeName = t.Union([t.Literal("engine:read"), t.Literal("engine:operate")]);
/** AssistantAccess is what the person grants at consent: reading only, or operating. */
export const AssistantAccess = t.Union([t.Literal("read"), t.Literal("operate")]);
/** AssistantName is one of the three assistants the console pre-registers. */
export const AssistantName = t.Union([t.Literal("claude"), t.Literal("chatgpt"), t.Literal("cursor")]);

export const AuthorizeContextQuery = t.Object({ rid: t.String({ minLength: 1, maxLength: 512 }) });
/** AssistantNodeView is a machine a grant can reach, as the consent and connector show it (hostname unverified). */
export const AssistantNodeView = t.Object({ id: t.String(), slug: t.String(), hostname: t.String() });
export const AuthorizeContextView = t.Object(
  {
    rid: t.String(),
    client: t.Object({
      client_id: t.String(),
      kind: t.Union([t.Literal("registered"), t.Literal("metadata_document"), t.Literal("dynamic")]),
      /** label names the client by what the console can vouch for: its pre-registered name, its client id's host, or where its answers go. */
      label: t.String(),
      /** declared_name is what the client calls itself: unverified. */
      declared_name: t.String(),
      verified: t.Boolean(),
    }),
    redirect_uri: t.String(),
    redirect_host: t.String(),
    /** redirect_local_only is true when the answer stays on the person's machine (loopback or an app's own scheme). */
    redirect_local_only: t.Boolean(),
    scopes: t.Array(AssistantScopeName),
    access_offered: t.Array(AssistantAccess),
    resource: t.String(),
    nodes: t.Array(AssistantNodeView),
    expires_at: DateTime,
  },
  { $id: "AuthorizeContextView" },
);
export const AuthorizeDecisionRequest = t.Object(
  {
    rid: t.String({ minLength: 1, maxLength: 512 }),
    approve: t.Boolean(),
    /** access is what an approval grants (default read). */
    access: t.Optional(AssistantAccess),
    /** node_ids are the machines an approval reaches; absent or null: every machine of the account, later ones included. */
    node_ids: t.Optional(t.Union([t.Array(t.String({ minLength: 1, maxLength: 64 }), { maxItems: 100 }), t.Null()])),
  },
  { $id: "AuthorizeDecisionRequest" },
);
export const AuthorizeDecisionView = t.Object(
  {
    /** redirect_to is where the browser goes: the assistant's redirect URI with `code`, `state` and `iss`, or `error=access_denied`. */
    redirect_to: t.String(),
    approved: t.Boolean(),
  },
  { $id: "AuthorizeDecisionView" },
);
export const ConnectorQuery = t.Object({ client_id: t.Optional(AssistantName) });
export const ConnectorView = t.Object(
  {
    assistant: t.Union([AssistantName, t.Null()]),
    /** mcp_url is the console's MCP endpoint to give the assistant; null with the refusal. */
    mcp_url: t.Union([t.String(), t.Null()]),
    /** client_id is the console's registered client id for the named assistant; null without one or with the refusal. */
    client_id: t.Union([t.String(), t.Null()]),
    nodes: t.Array(AssistantNodeView),
    /** refusal is set (`entitlement_required`) when the account may not authorize assistants; then nothing else is. */
    refusal: t.Union([t.Object({ code: t.String(), message: t.String() }), t.Null()]),
  },
  { $id: "ConnectorView" },
);
export const AssistantGrantView = t.Object({
  id: t.String(),
  client_id: t.String(),
  client_label: t.String(),
  redirect_host: t.String(),
  scopes: t.Array(AssistantScopeName),
  access: AssistantAccess,
  /** node_ids are the machines the grant reaches; null: every machine of the account. */
  node_ids: t.Union([t.Array(t.String()), t.Null()]),
  created_at: DateTime,
  last_used_at: t.Union([DateTime, t.Null()]),
  revoked: t.Boolean(),
  revoked_at: t.Union([DateTime, t.Null()]),
  revoked_reason: t.Union([t.String(), t.Null()]),
});
export const AssistantGrantsView = t.Object({ grants: t.Array(AssistantGrantView) }, { $id: "AssistantGrantsView" });
export const AssistantGrantIdParams = t.Object({ grant_id: t.String({ minLength: 1, maxLength: 64 }) });

// ---- hosted machines (issue 15): purchase, allocation, wake, update, backups

const NullableDateTime = t.Union([DateTime, t.Null()]);

/**
 * ManagedPurchaseView is the account's purchase, derived from what the operator keeps (the
 * request, invoices, a seat): `none` until the account asks, `requested`, `invoiced` while an
 * invoice is open, `paid` once the account holds a seat.
 */
export const ManagedPurchaseView = t.Object(
  {
    state: t.Union([t.Literal("none"), t.Literal("requested"), t.Literal("invoiced"), t.Literal("paid")]),
    requested_at: NullableDateTime,
    invoice: t.Union([
      t.Object({
        id: t.String(),
        state: t.Union([t.Literal("open"), t.Literal("paid"), t.Literal("void")]),
        amount: t.String(),
        created_at: DateTime,
      }),
      t.Null(),
    ]),
    seat_since: NullableDateTime,
    /** launch_place_free says whether a purchase asked now would find a launch place (seats held plus open invoices below the places). */
    launch_place_free: t.Boolean(),
  },
  { $id: "ManagedPurchaseView" },
);

export const ManagedAllocationStatus = t.Union([
  t.Literal("provisioning"),
  t.Literal("ready"),
  t.Literal("failed"),
  t.Literal("deleting"),
  t.Literal("deleted"),
]);
export const ManagedBoxPower = t.Union([
  t.Literal("none"),
  t.Literal("starting"),
  t.Literal("running"),
  t.Literal("stopping"),
  t.Literal("asleep"),
  t.Literal("updating"),
]);
export const ManagedUpdateState = t.Union([
  t.Literal("idle"),
  t.Literal("pending"),
  t.Literal("running"),
  t.Literal("failed"),
  t.Literal("done"),
]);

/** ManagedAllocationView is the account's hosted machine: its kind and status, its box at the provider, and where to reach it. */
export const ManagedAllocationView = t.Object(
  {
    id: t.String(),
    kind: t.Union([t.Literal("trial"), t.Literal("paid")]),
    status: ManagedAllocationStatus,
    power: ManagedBoxPower,
    /** sandbox_id is the box at the provider; null before it is made and after it is lost. */
    sandbox_id: t.Union([t.String(), t.Null()]),
    node_id: t.Union([t.String(), t.Null()]),
    /** url reaches the box's engine API through the console (the session authenticates; the console forwards as the box's admin). */
    url: t.Union([t.String(), t.Null()]),
    box_version: t.String(),
    template_version: t.String(),
    /** sleep_after_s puts the box to sleep after this long without a request through `url`; 0 never. */
    sleep_after_s: SafeInteger,
    expires_at: NullableDateTime,
    created_at: DateTime,
    ready_at: NullableDateTime,
    last_activity_at: NullableDateTime,
    delete_requested_at: NullableDateTime,
    deleted_at: NullableDateTime,
    /** billing_active is derived: a paid box bills while it starts or runs, and stops at stopping, sleep and deletion. */
    billing_active: t.Boolean(),
    update: t.Object({
      state: ManagedUpdateState,
      target_version: t.Union([t.String(), t.Null()]),
      error: t.Union([t.String(), t.Null()]),
    }),
    error: t.Union([t.String(), t.Null()]),
  },
  { $id: "ManagedAllocationView" },
);

/** ManagedWakeView answers a wake: the box's power after it (`starting` when accepted). */
export const ManagedWakeView = t.Object(
  {
    allocation_id: t.String(),
    power: ManagedBoxPower,
    start_started_at: NullableDateTime,
    url: t.Union([t.String(), t.Null()]),
  },
  { $id: "ManagedWakeView" },
);

export const ManagedUpdateRequest = t.Object(
  { version: t.String({ minLength: 1, maxLength: 64, pattern: "^[0-9A-Za-z][0-9A-Za-z.+-]*$" }) },
  { $id: "ManagedUpdateRequest" },
);

/** ManagedUpdateView is the box's version, the version offered, and the update in progress or last done. */
export const ManagedUpdateView = t.Object(
  {
    allocation_id: t.String(),
    current_version: t.String(),
    offered_version: t.String(),
    state: ManagedUpdateState,
    target_version: t.Union([t.String(), t.Null()]),
    requested_at: NullableDateTime,
    /** next_allowed_at is the earliest another update is accepted (3 minutes after the last accepted one). */
    next_allowed_at: NullableDateTime,
    error: t.Union([t.String(), t.Null()]),
  },
  { $id: "ManagedUpdateView" },
);

export const ManagedBackupView = t.Object({
  id: t.String(),
  kind: t.Union([t.Literal("nightly"), t.Literal("final")]),
  state: t.Union([t.Literal("running"), t.Literal("done"), t.Literal("failed")]),
  size_bytes: SafeInteger,
  started_at: DateTime,
  taken_at: NullableDateTime,
  expires_at: NullableDateTime,
  /** tombstone marks a backup kept after its box was deleted, until it expires. */
  tombstone: t.Boolean(),
  error: t.Union([t.String(), t.Null()]),
});

/** ManagedBackupsView is the backup health of the account's newest hosted machine, tombstones included. */
export const ManagedBackupsView = t.Object(
  {
    allocation_id: t.String(),
    allocation_status: ManagedAllocationStatus,
    /** healthy: the box's newest backup succeeded and is less than a day and a bit old (or the box is younger than that). */
    healthy: t.Boolean(),
    last_backup_at: NullableDateTime,
    retention_days: SafeInteger,
    backups: t.Array(ManagedBackupView),
  },
  { $id: "ManagedBackupsView" },
);
