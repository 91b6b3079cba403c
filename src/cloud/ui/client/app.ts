/**
 * The console's pages in the browser: one script for every page, chosen by the body's
 * `data-page`. It talks only to the console's own /api with the session cookie, sends
 * `X-Engine-CSRF: 1` on every state change (the server refuses a cookie-authenticated change
 * without it), and builds the DOM with text nodes only, so nothing a machine reported can
 * become markup.
 */

import { hostMismatchText, notConfiguredHelp, readSignInOffer, SOCIAL_LABELS, type Text, wrongHostText } from "./signin";

type Json = Record<string, unknown>;
type Child = Node | string | null | undefined | false;

/** ApiError is an answer outside 2xx: its status, the envelope's code and message. */
class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** h builds an element; attributes starting with "on" are listeners, children are text or nodes. */
function h(tag: string, attributes: Record<string, unknown> = {}, ...children: Child[]): HTMLElement {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") element.addEventListener(name.slice(2), value as EventListener);
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) if (child !== null && child !== undefined && child !== false) element.append(child);
  return element;
}

/** api calls the console's API with the session cookie; a non-2xx answer throws ApiError. */
async function api<T = Json>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { accept: "application/json" };
  if (method !== "GET") headers["x-engine-csrf"] = "1";
  if (body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  const parsed = text ? (JSON.parse(text) as Json) : {};
  if (!response.ok) {
    const error = (parsed.error ?? {}) as { code?: string; message?: string };
    const detail = Array.isArray(parsed.detail) ? "the request is not valid" : undefined;
    throw new ApiError(response.status, error.code ?? `http_${response.status}`, error.message ?? detail ?? `HTTP ${response.status}`);
  }
  return parsed as T;
}

const main = () => document.getElementById("app") as HTMLElement;
const here = () => `${location.pathname}${location.search}`;

/** toSignIn sends the browser to the sign-in page, coming back here afterwards. */
function toSignIn(): never {
  location.assign(`/signin?return_to=${encodeURIComponent(here())}`);
  throw new Error("signing in");
}

/** alert renders an error or notice region that screen readers announce. */
function notice(kind: "error" | "ok" | "info", ...children: Child[]): HTMLElement {
  return h("div", { class: `notice notice-${kind}`, role: kind === "error" ? "alert" : "status" }, ...children);
}

function describeError(error: unknown): string {
  if (error instanceof ApiError) return `${error.message} (${error.code})`;
  return (error as Error).message ?? String(error);
}

const when = (iso: unknown) => (typeof iso === "string" ? new Date(iso).toLocaleString() : "—");

/** secretBox shows a just-created secret once, with a copy button. */
function secretBox(label: string, value: string, testId: string): HTMLElement {
  const input = h("input", { readonly: true, value, "aria-label": label, "data-testid": testId, class: "secret" }) as HTMLInputElement;
  const copy = h(
    "button",
    {
      type: "button",
      onclick: async () => {
        input.select();
        await navigator.clipboard?.writeText(value).catch(() => {});
      },
    },
    "Copy",
  );
  return h("div", { class: "secret-row" }, input, copy);
}

/** shell draws the header and navigation around a signed-in page. */
function shell(page: string, account: Json, ...content: Child[]): void {
  const links: [string, string, string][] = [
    ["nodes", "/nodes", "Nodes"],
    ["link", "/link", "Approve a device"],
    ["link-codes", "/link-codes", "Link codes"],
    ["keys", "/keys", "Pre-authorized keys"],
    ["assistants", "/assistants", "Assistants"],
    ["hosted", "/hosted", "Hosted machine"],
  ];
  const signOut = h(
    "button",
    {
      type: "button",
      class: "link-button",
      onclick: async () => {
        await api("POST", "/api/auth/logout").catch(() => {});
        location.assign("/signin");
      },
    },
    "Sign out",
  );
  const nav = h(
    "nav",
    { "aria-label": "Console" },
    h(
      "ul",
      {},
      ...links.map(([id, href, label]) => h("li", {}, h("a", { href, "aria-current": id === page ? "page" : undefined }, label))),
    ),
  );
  const header = h(
    "header",
    { class: "top" },
    h("a", { href: "/nodes", class: "brand" }, "engine cloud"),
    nav,
    h("div", { class: "who" }, h("span", { "data-testid": "account-email" }, String(account.email ?? "")), signOut),
  );
  document.body.replaceChildren(header, h("main", { id: "app" }, ...content));
}

/** signedIn returns the session's account, or sends the browser to sign in. */
async function signedIn(): Promise<Json> {
  try {
    const session = await api<{ account: Json }>("GET", "/api/auth/session");
    return session.account;
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) toSignIn();
    throw error;
  }
}

// ---- pages

/** paragraph renders a Text as a paragraph, its `code` pieces in <code>. */
function paragraph(text: Text): HTMLElement {
  return h("p", {}, ...text.map((piece) => (typeof piece === "string" ? piece : h("code", {}, piece.code))));
}

function signInPage(): void {
  const offer = readSignInOffer(document.body.dataset);
  const params = new URLSearchParams(location.search);
  const returnTo = params.get("return_to") ?? "/nodes";
  const failed = params.get("error");
  const mismatch = failed ? hostMismatchText(params.get("started_at"), location.origin, offer.publicUrl) : null;
  const failure = failed
    ? notice(
        "error",
        mismatch ? `Sign-in did not complete (${failed}). ${mismatch}` : `Sign-in did not complete (${failed}). Please start again.`,
      )
    : null;
  if (!offer.configured) {
    main().replaceChildren(
      h(
        "section",
        { class: "card narrow" },
        h("h1", {}, "Sign in to engine cloud"),
        failure,
        h(
          "div",
          { class: "notice notice-info", role: "status", "data-testid": "signin-not-configured" },
          ...notConfiguredHelp(offer.publicUrl).map(paragraph),
        ),
      ),
    );
    return;
  }
  const wrongHost = wrongHostText(location.origin, offer.publicUrl);
  const status = h("div", { "aria-live": "polite" });
  const start = async (path: string) => {
    status.replaceChildren(notice("info", "Taking you to the sign-in provider…"));
    try {
      const started = await api<{ url: string }>("GET", path);
      location.assign(started.url);
    } catch (error) {
      status.replaceChildren(notice("error", describeError(error)));
    }
  };
  const query = (extra: Record<string, string>) => new URLSearchParams({ ...extra, return_to: returnTo }).toString();
  const email = h("input", { id: "identity", name: "identity", type: "email", autocomplete: "email" }) as HTMLInputElement;
  // Only the providers the operator listed (ENGINE_CLOUD_OIDC_SOCIAL_PROVIDERS); none, and the provider's own sign-in stands alone.
  const social = offer.social.map((provider) =>
    h(
      "button",
      { type: "button", class: "primary", onclick: () => start(`/api/auth/social?${query({ provider })}`) },
      `Continue with ${SOCIAL_LABELS[provider]}`,
    ),
  );
  main().replaceChildren(
    h(
      "section",
      { class: "card narrow" },
      h("h1", {}, "Sign in to engine cloud"),
      failure,
      wrongHost ? notice("info", wrongHost) : null,
      social.length > 0 ? h("div", { class: "stack", "data-testid": "signin-social" }, ...social) : null,
      social.length > 0 ? h("p", { class: "or" }, "or") : null,
      h(
        "form",
        {
          class: "stack",
          onsubmit: (event: Event) => {
            event.preventDefault();
            const extra: Record<string, string> = email.value ? { identity: email.value } : {};
            void start(`/api/auth/login?${query(extra)}`);
          },
        },
        h("label", { for: "identity" }, "Email (optional)"),
        email,
        h("button", { type: "submit" }, "Sign in"),
      ),
      status,
    ),
  );
}

/** gpuSummary says what GPUs a node reported over its tunnel: "2 × NVIDIA H100 (80 GiB)", or a dash. */
function gpuSummary(gpus: unknown): string {
  if (!Array.isArray(gpus) || gpus.length === 0) return "—";
  const counts = new Map<string, number>();
  for (const gpu of gpus as { name?: unknown; memory_total_mb?: unknown }[]) {
    const label = `${String(gpu.name ?? "GPU")} (${Math.round(Number(gpu.memory_total_mb ?? 0) / 1024)} GiB)`;
    counts.set(label, (counts.get(label) ?? 0) + 1);
  }
  return [...counts].map(([label, count]) => (count > 1 ? `${count} × ${label}` : label)).join(", ");
}

async function nodesPage(account: Json): Promise<void> {
  const { nodes } = await api<{ nodes: Json[] }>("GET", "/api/nodes");
  const table = nodes.length
    ? h(
        "table",
        { "data-testid": "nodes" },
        h(
          "caption",
          {},
          "Linked machines. Online means the machine's engine has its tunnel to this console open. Hostname, OS, version and GPUs are what each machine reported; they are not verified.",
        ),
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            ...["Name", "Status", "Hostname (unverified)", "OS", "Version", "GPUs", "Linked by", "Linked", "Last seen"].map((c) =>
              h("th", { scope: "col" }, c),
            ),
          ),
        ),
        h(
          "tbody",
          {},
          ...nodes.map((node) =>
            h(
              "tr",
              {},
              h("td", {}, String(node.slug)),
              h(
                "td",
                { "data-testid": "node-status" },
                node.online
                  ? h("span", { class: "state state-online" }, "online")
                  : h(
                      "span",
                      { class: "state state-offline" },
                      node.last_seen_at ? `offline since ${when(node.last_seen_at)}` : "never connected",
                    ),
              ),
              h("td", {}, String(node.hostname)),
              h("td", {}, String(node.os || "—")),
              h("td", {}, String(node.version || "—")),
              h("td", {}, gpuSummary(node.gpus)),
              h("td", {}, String(node.enrolled_via).replace("_", " ")),
              h("td", {}, when(node.created_at)),
              h("td", {}, node.last_seen_at ? when(node.last_seen_at) : "—"),
            ),
          ),
        ),
      )
    : h(
        "p",
        { class: "empty" },
        "No machines yet. Run ",
        h("code", {}, `engine link --cloud ${location.origin}`),
        " on a machine, then approve its code on ",
        h("a", { href: "/link" }, "Approve a device"),
        ".",
      );
  shell("nodes", account, h("h1", {}, "Nodes"), h("p", {}, `${nodes.length} of ${account.node_limit ?? "?"} machines.`), table);
}

async function linkPage(account: Json): Promise<void> {
  const params = new URLSearchParams(location.search);
  const code = h("input", {
    id: "user_code",
    name: "user_code",
    autocomplete: "off",
    autocapitalize: "characters",
    spellcheck: "false",
    required: true,
    maxlength: 32,
    value: params.get("user_code") ?? "",
  }) as HTMLInputElement;
  const result = h("div", { "aria-live": "polite" });
  const decide = async (action: "approve" | "deny", userCode: string) => {
    try {
      if (action === "approve") {
        const grant = await api<Json>("POST", "/api/nodes/device-approvals/approve", { user_code: userCode });
        result.replaceChildren(
          notice(
            "ok",
            `Approved. The machine is linked as ${grant.slug}${grant.adopted ? " (an existing node was adopted)" : ""}. `,
            h("a", { href: "/nodes" }, "See your nodes"),
          ),
        );
      } else {
        await api("POST", "/api/nodes/device-approvals/deny", { user_code: userCode });
        result.replaceChildren(notice("ok", "Denied. The machine will be told the request was refused."));
      }
    } catch (error) {
      result.replaceChildren(notice("error", describeError(error)));
    }
  };
  const lookup = async () => {
    result.replaceChildren(notice("info", "Looking the code up…"));
    try {
      const view = await api<Json>("POST", "/api/nodes/device-approvals/lookup", { user_code: code.value.trim() });
      const reported = view.reported as Json;
      const unverified = () => h("span", { class: "badge" }, "unverified");
      const row = (label: string, value: unknown, badge: boolean) =>
        h("div", { class: "fact" }, h("dt", {}, label), h("dd", {}, String(value || "—"), badge ? unverified() : null));
      result.replaceChildren(
        h(
          "section",
          { class: "card", "data-testid": "device-request", "aria-label": "Device request" },
          h("h2", {}, "A machine asks to join your account"),
          h(
            "p",
            { class: "warn" },
            "Approve only if you started ",
            h("code", {}, "engine link"),
            " on this machine yourself just now. The name, OS and version below are what the machine says about itself; the console cannot verify them.",
          ),
          h(
            "dl",
            {},
            row("Hostname", reported.hostname, true),
            row("OS", reported.os, true),
            row("Version", reported.version, true),
            row("Requested from address", view.source_address, false),
            row("Requested", when(view.requested_at), false),
            row("Expires", when(view.expires_at), false),
            row("Attempts left", view.attempts_left, false),
          ),
          h(
            "div",
            { class: "actions" },
            h("button", { type: "button", class: "primary", onclick: () => decide("approve", String(view.user_code)) }, "Approve"),
            h("button", { type: "button", class: "danger", onclick: () => decide("deny", String(view.user_code)) }, "Deny"),
          ),
        ),
      );
    } catch (error) {
      result.replaceChildren(notice("error", describeError(error)));
    }
  };
  shell(
    "link",
    account,
    h("h1", {}, "Approve a device"),
    h("p", {}, "Enter the code that ", h("code", {}, "engine link"), " shows on the machine you are linking."),
    h(
      "form",
      {
        class: "inline",
        onsubmit: (event: Event) => {
          event.preventDefault();
          void lookup();
        },
      },
      h("label", { for: "user_code" }, "Code"),
      code,
      h("button", { type: "submit" }, "Look up"),
    ),
    result,
  );
  // A code from verification_uri_complete is looked up at once; looking up spends no attempt.
  if (code.value) await lookup();
}

async function linkCodesPage(account: Json): Promise<void> {
  const shown = h("div", { "aria-live": "polite" });
  const mint = async () => {
    try {
      const minted = await api<Json>("POST", "/api/link/codes", {});
      shown.replaceChildren(
        h(
          "section",
          { class: "card" },
          h("h2", {}, "Your link code"),
          notice("info", "This code is shown once and works once. It expires ", when(minted.expires_at), "."),
          secretBox("Link code", String(minted.code), "link-code"),
          h("p", {}, "On the machine, run:"),
          h("pre", {}, `engine link --cloud ${location.origin} --code ${minted.code}`),
        ),
      );
    } catch (error) {
      shown.replaceChildren(notice("error", describeError(error)));
    }
  };
  shell(
    "link-codes",
    account,
    h("h1", {}, "Link codes"),
    h("p", {}, "A link code links one machine without a browser on it. It is single-use and short-lived."),
    h("button", { type: "button", class: "primary", onclick: mint }, "Mint a link code"),
    shown,
  );
}

async function keysPage(account: Json): Promise<void> {
  const minted = h("div", { "aria-live": "polite" });
  const listing = h("div", {});
  const description = h("input", { id: "key-description", maxlength: 200 }) as HTMLInputElement;
  const uses = h("input", { id: "key-uses", type: "number", min: 1, max: 1000, value: 1 }) as HTMLInputElement;
  const lifetime = h(
    "select",
    { id: "key-lifetime" },
    h("option", { value: 3600 }, "1 hour"),
    h("option", { value: 86_400, selected: true }, "1 day"),
    h("option", { value: 7 * 86_400 }, "7 days"),
    h("option", { value: 90 * 86_400 }, "90 days"),
  ) as HTMLSelectElement;

  const refresh = async () => {
    try {
      const { keys } = await api<{ keys: Json[] }>("GET", "/api/preauth-keys");
      const state = (key: Json) => (key.revoked ? "revoked" : key.expired ? "expired" : "active");
      listing.replaceChildren(
        keys.length
          ? h(
              "table",
              { "data-testid": "keys" },
              h("caption", {}, "Keys, newest first. Revoking a key does not unlink the machines it linked."),
              h(
                "thead",
                {},
                h("tr", {}, ...["Description", "Created", "Expires", "Uses", "State", ""].map((c) => h("th", { scope: "col" }, c))),
              ),
              h(
                "tbody",
                {},
                ...keys.map((key) => {
                  const cell = h("td", {});
                  if (state(key) === "active") {
                    const confirm = h(
                      "button",
                      {
                        type: "button",
                        class: "danger",
                        onclick: async () => {
                          await api("DELETE", `/api/preauth-keys/${key.id}`).catch((error) => alertIn(minted, error));
                          await refresh();
                        },
                      },
                      "Confirm revoke",
                    );
                    const revoke = h("button", { type: "button", onclick: () => cell.replaceChildren(confirm) }, `Revoke`);
                    cell.append(revoke);
                  }
                  return h(
                    "tr",
                    { "data-key-id": String(key.id) },
                    h("td", {}, String(key.description || "—")),
                    h("td", {}, when(key.created_at)),
                    h("td", {}, when(key.expires_at)),
                    h("td", {}, `${key.uses} / ${key.max_uses}`),
                    h("td", { "data-testid": "key-state" }, state(key)),
                    cell,
                  );
                }),
              ),
            )
          : h("p", { class: "empty" }, "No keys yet."),
      );
    } catch (error) {
      alertIn(listing, error);
    }
  };

  const mint = async (event: Event) => {
    event.preventDefault();
    try {
      const key = await api<Json>("POST", "/api/preauth-keys", {
        description: description.value,
        max_uses: Number(uses.value) || 1,
        expires_in_s: Number(lifetime.value),
      });
      minted.replaceChildren(
        h(
          "section",
          { class: "card" },
          h("h2", {}, "New key"),
          notice("info", "Copy it now: the key is shown only this once."),
          secretBox("Pre-authorized key", String(key.key), "new-key"),
          h("p", {}, "On a machine, run:"),
          h("pre", {}, `engine link --cloud ${location.origin} --key ${key.key}`),
        ),
      );
      await refresh();
    } catch (error) {
      alertIn(minted, error);
    }
  };

  shell(
    "keys",
    account,
    h("h1", {}, "Pre-authorized keys"),
    h("p", {}, "A key links machines without a person approving each one, for scripts and fleets."),
    h(
      "form",
      { class: "grid", onsubmit: mint },
      h("label", { for: "key-description" }, "Description"),
      description,
      h("label", { for: "key-uses" }, "Uses"),
      uses,
      h("label", { for: "key-lifetime" }, "Lifetime"),
      lifetime,
      h("button", { type: "submit", class: "primary" }, "Mint key"),
    ),
    minted,
    h("h2", {}, "Keys"),
    listing,
  );
  await refresh();
}

function alertIn(region: HTMLElement, error: unknown): void {
  region.replaceChildren(notice("error", describeError(error)));
}

/** consentFailure explains why a pending authorization cannot be shown or decided. */
function consentFailure(error: unknown): string {
  if (error instanceof ApiError) {
    if (error.code === "entitlement_required") {
      return "Your account does not have remote link, which assistant access needs. Ask the console's operator to enable it; nothing was granted.";
    }
    if (error.status === 404)
      return "This authorization request has expired or does not exist. Start again from the assistant; nothing was granted.";
    if (error.status === 409) return "This authorization request has already been decided. Start again from the assistant if you need to.";
  }
  return describeError(error);
}

async function consentPage(account: Json): Promise<void> {
  const rid = new URLSearchParams(location.search).get("rid");
  const heading = h("h1", {}, "Authorize an assistant");
  if (!rid) {
    shell(
      "consent",
      account,
      heading,
      notice("info", "Open this page from an assistant's connector: it asks here to reach your machines."),
    );
    return;
  }
  let context: Json;
  try {
    context = await api<Json>("GET", `/api/oauth/authorize/context?rid=${encodeURIComponent(rid)}`);
  } catch (error) {
    shell("consent", account, heading, notice("error", consentFailure(error)));
    return;
  }
  const client = context.client as Json;
  const nodes = (context.nodes as Json[]) ?? [];
  const offered = (context.access_offered as string[]) ?? ["read"];
  const result = h("div", { "aria-live": "polite" });

  const who =
    client.kind === "registered"
      ? h(
          "p",
          {},
          h("strong", { "data-testid": "consent-client" }, String(client.label)),
          " (registered with this console) asks to reach your machines.",
        )
      : h(
          "p",
          {},
          h("strong", { "data-testid": "consent-client" }, String(client.label)),
          client.kind === "metadata_document" ? " (the address that identifies it)" : " (where a self-registered assistant's answers go)",
          " asks to reach your machines.",
        );
  const declared =
    client.declared_name && client.declared_name !== client.label
      ? h("p", {}, "It calls itself “", String(client.declared_name), "” ", h("span", { class: "badge" }, "unverified"), ".")
      : null;
  const target = h("p", {}, "The answer goes to ", h("code", { "data-testid": "consent-redirect" }, String(context.redirect_host)), ".");
  const local = context.redirect_local_only
    ? h(
        "p",
        { class: "warn", "data-testid": "consent-local" },
        "That is an app on this computer, not a website. Approve only if you started this from an assistant on this computer just now.",
      )
    : null;

  const accessChoice = (value: string, label: string, detail: string) =>
    h(
      "label",
      { class: "choice" },
      h("input", { type: "radio", name: "access", value, checked: value === "read" }),
      h("span", {}, h("strong", {}, label), ` — ${detail}`),
    );
  const access = h(
    "fieldset",
    {},
    h("legend", {}, "What it may do"),
    accessChoice("read", "Read only", "list services and templates, read logs, see GPUs, diagnose"),
    offered.includes("operate")
      ? accessChoice("operate", "Operate", "also deploy, start, stop, restart, remove services and restore databases")
      : h("p", { class: "empty" }, "The assistant asked to read only."),
  );
  const nodeBoxes = nodes.map((node) =>
    h(
      "label",
      { class: "choice" },
      h("input", {
        type: "checkbox",
        name: "node",
        value: String(node.id),
        // Choosing a machine means choosing some machines, not all.
        onchange: () => {
          const some = document.querySelector<HTMLInputElement>('input[name="machines"][value="some"]');
          if (some) some.checked = true;
        },
      }),
      h("span", {}, String(node.slug), " — ", String(node.hostname), " ", h("span", { class: "badge" }, "unverified")),
    ),
  );
  const machines = h(
    "fieldset",
    {},
    h("legend", {}, "Which machines"),
    h(
      "label",
      { class: "choice" },
      h("input", { type: "radio", name: "machines", value: "all", checked: true }),
      h("span", {}, "All my machines, including ones I link later"),
    ),
    nodes.length > 0
      ? h(
          "label",
          { class: "choice" },
          h("input", { type: "radio", name: "machines", value: "some" }),
          h("span", {}, "Only the ones I choose:"),
        )
      : h("p", { class: "empty" }, "No machines are linked yet."),
    ...nodeBoxes,
  );

  const decide = async (approve: boolean) => {
    const form = document.getElementById("consent") as HTMLFormElement;
    const chosen = (name: string) => (form.querySelector(`input[name="${name}"]:checked`) as HTMLInputElement | null)?.value;
    const body: Json = { rid, approve };
    if (approve) {
      body.access = chosen("access") ?? "read";
      if (chosen("machines") === "some") {
        body.node_ids = Array.from(form.querySelectorAll<HTMLInputElement>('input[name="node"]:checked'), (box) => box.value);
      }
    }
    try {
      const decision = await api<{ redirect_to: string; approved: boolean }>("POST", "/api/oauth/authorize/decision", body);
      result.replaceChildren(
        notice("ok", decision.approved ? "Approved. Returning you to the assistant…" : "Denied. Returning you to the assistant…"),
      );
      location.assign(decision.redirect_to);
    } catch (error) {
      result.replaceChildren(notice("error", consentFailure(error)));
    }
  };

  shell(
    "consent",
    account,
    heading,
    h(
      "form",
      { id: "consent", class: "card", "data-testid": "consent", onsubmit: (event: Event) => event.preventDefault() },
      who,
      declared,
      target,
      local,
      access,
      machines,
      h(
        "div",
        { class: "actions" },
        h("button", { type: "button", class: "primary", onclick: () => decide(true) }, "Approve"),
        h("button", { type: "button", class: "danger", onclick: () => decide(false) }, "Deny"),
      ),
    ),
    result,
  );
}

async function assistantsPage(account: Json): Promise<void> {
  const listing = h("div", {});
  const connect = h("div", {});
  const refresh = async () => {
    try {
      const { grants } = await api<{ grants: Json[] }>("GET", "/api/oauth/grants");
      listing.replaceChildren(
        grants.length
          ? h(
              "table",
              { "data-testid": "grants" },
              h("caption", {}, "Assistants you authorized, newest first. Revoking one stops every token it holds at once."),
              h(
                "thead",
                {},
                h(
                  "tr",
                  {},
                  ...["Assistant", "Answers to", "Access", "Machines", "Authorized", "Last used", "State", ""].map((c) =>
                    h("th", { scope: "col" }, c),
                  ),
                ),
              ),
              h(
                "tbody",
                {},
                ...grants.map((grant) => {
                  const cell = h("td", {});
                  if (!grant.revoked) {
                    cell.append(
                      h(
                        "button",
                        {
                          type: "button",
                          class: "danger",
                          onclick: async () => {
                            await api("DELETE", `/api/oauth/grants/${encodeURIComponent(String(grant.id))}`).catch((error) =>
                              alertIn(listing, error),
                            );
                            await refresh();
                          },
                        },
                        "Revoke",
                      ),
                    );
                  }
                  const nodeIds = grant.node_ids as string[] | null;
                  return h(
                    "tr",
                    { "data-grant-id": String(grant.id) },
                    h("td", {}, String(grant.client_label)),
                    h("td", {}, String(grant.redirect_host)),
                    h("td", {}, grant.access === "operate" ? "operate" : "read only"),
                    h("td", {}, nodeIds === null ? "all" : `${nodeIds.length}`),
                    h("td", {}, when(grant.created_at)),
                    h("td", {}, grant.last_used_at ? when(grant.last_used_at) : "—"),
                    h("td", { "data-testid": "grant-state" }, grant.revoked ? `revoked (${grant.revoked_reason ?? ""})` : "active"),
                    cell,
                  );
                }),
              ),
            )
          : h("p", { class: "empty" }, "No assistant has been authorized yet."),
      );
    } catch (error) {
      alertIn(listing, error);
    }
  };
  try {
    const view = await api<Json>("GET", "/api/oauth/connector");
    const refusal = view.refusal as Json | null;
    connect.replaceChildren(
      refusal
        ? notice("info", "Your account does not have remote link, which assistant access needs. Ask the console's operator to enable it.")
        : h(
            "div",
            {},
            h("p", {}, "Give an assistant (Claude, ChatGPT, Cursor, …) this MCP server URL; it asks you here to approve it:"),
            secretBox("MCP server URL", String(view.mcp_url), "mcp-url"),
          ),
    );
  } catch (error) {
    alertIn(connect, error);
  }
  shell("assistants", account, h("h1", {}, "Assistants"), h("h2", {}, "Connect an assistant"), connect, h("h2", {}, "Authorized"), listing);
  await refresh();
}

/** definitionList renders label/value pairs, each value a text or a node. */
function definitionList(testId: string, rows: [string, Child][]): HTMLElement {
  return h("dl", { class: "facts", "data-testid": testId }, ...rows.flatMap(([label, value]) => [h("dt", {}, label), h("dd", {}, value)]));
}

/** BUSY are the statuses and powers of a box the hosted page polls through until they settle. */
const BUSY = new Set(["provisioning", "deleting", "starting", "stopping", "updating"]);

/**
 * hostedPage is the account's hosted machine: its status and address, wake, update to the
 * version offered, backup health, and delete behind a confirmation. With none it offers a
 * trial (or a full box to an account that pays) and the purchase request. While anything is
 * in progress it redraws every 1.5 s.
 */
async function hostedPage(account: Json): Promise<void> {
  const said = h("div", { "aria-live": "polite", "data-testid": "hosted-said" });
  const body = h("div", {});
  let timer: ReturnType<typeof setTimeout> | undefined;
  /**
   * confirmingDelete keeps the delete confirmation open across redraws: the page redraws after
   * each action and every 1.5 s while the machine is busy, and a confirmation that a redraw
   * closed left its user's next click on nothing.
   */
  let confirmingDelete = false;
  const act = async (what: () => Promise<string>) => {
    try {
      said.replaceChildren(notice("ok", await what()));
    } catch (error) {
      said.replaceChildren(notice("error", describeError(error)));
    }
    await draw();
  };
  const draw = async (): Promise<void> => {
    clearTimeout(timer);
    let allocation: Json | null = null;
    try {
      allocation = await api<Json>("GET", "/api/managed/allocation");
    } catch (error) {
      if (error instanceof ApiError && error.code === "managed_not_offered") {
        body.replaceChildren(notice("info", "This console offers no hosted machines."));
        return;
      }
      if (!(error instanceof ApiError && error.code === "allocation_not_found")) throw error;
    }
    const purchase = await api<Json>("GET", "/api/managed/purchase");
    const paid = purchase.state === "paid";
    const buy = h(
      "section",
      { class: "card" },
      h("h2", {}, "Buying one"),
      h("p", {}, "Purchase: ", h("strong", { "data-testid": "purchase-state" }, String(purchase.state)), "."),
      purchase.state === "none"
        ? h(
            "button",
            {
              type: "button",
              onclick: () =>
                act(async () => {
                  await api("POST", "/api/managed/purchase");
                  return "Asked. You will be invoiced.";
                }),
            },
            "Ask to buy a hosted machine",
          )
        : null,
    );
    if (!allocation || allocation.status === "deleted") {
      confirmingDelete = false; // a machine made later does not open asking
      body.replaceChildren(
        h(
          "section",
          { class: "card" },
          h("h2", {}, "No hosted machine"),
          allocation ? h("p", {}, "Your last one was deleted ", when(allocation.deleted_at), ".") : null,
          h("p", {}, paid ? "Start your hosted machine: a full engine run for you." : "Try a hosted machine for one hour."),
          h(
            "button",
            {
              type: "button",
              class: "primary",
              onclick: () =>
                act(async () => {
                  await api("POST", "/api/managed/allocation");
                  return "Starting your machine…";
                }),
            },
            paid ? "Start my hosted machine" : "Start a one-hour trial",
          ),
        ),
        ...(paid ? [] : [buy]),
      );
      return;
    }
    const box = allocation;
    const update = (box.update ?? {}) as Json;
    const facts: [string, Child][] = [
      ["Status", h("span", { "data-testid": "hosted-status" }, String(box.status))],
      ["Power", h("span", { "data-testid": "hosted-power" }, String(box.power))],
      ["Kind", box.kind === "trial" ? `trial, until ${when(box.expires_at)}` : "paid"],
      ["Version", String(box.box_version)],
      ["Address", box.url ? h("code", { "data-testid": "hosted-url" }, String(box.url)) : "—"],
      ["Billing", box.billing_active ? "running" : "stopped"],
    ];
    if (box.error) facts.push(["Last error", String(box.error)]);
    const cards: Child[] = [h("section", { class: "card" }, h("h2", {}, "Your hosted machine"), definitionList("hosted-facts", facts))];
    if (box.url) {
      cards.push(
        h(
          "section",
          { class: "card" },
          h("h2", {}, "Using it"),
          h("p", {}, "Call its engine with your console session, for example:"),
          h("pre", {}, `engine --url ${box.url} --token <your session token> services list`),
        ),
      );
    }
    if (box.status === "ready") {
      cards.push(
        h(
          "section",
          { class: "card" },
          h("h2", {}, "Wake"),
          h(
            "p",
            {},
            box.power === "asleep"
              ? "It is asleep: it sleeps after a while without requests."
              : "It sleeps after a while without requests.",
          ),
          h(
            "button",
            {
              type: "button",
              onclick: () =>
                act(async () => {
                  const woken = await api<Json>("POST", "/api/managed/allocation/wake");
                  return woken.power === "starting" ? "Waking it…" : `It is ${woken.power}: nothing to wake.`;
                }),
            },
            "Wake",
          ),
        ),
      );
      const versions = await api<Json>("GET", "/api/managed/allocation/update");
      const behind = versions.offered_version !== versions.current_version;
      cards.push(
        h(
          "section",
          { class: "card" },
          h("h2", {}, "Update"),
          h(
            "p",
            { "data-testid": "hosted-versions" },
            `It runs ${versions.current_version}; the version offered is ${versions.offered_version}.`,
            versions.state === "failed" ? ` The last update failed: ${versions.error}` : "",
          ),
          behind
            ? h(
                "button",
                {
                  type: "button",
                  onclick: () =>
                    act(async () => {
                      await api("POST", "/api/managed/allocation/update", { version: versions.offered_version });
                      return `Updating to ${versions.offered_version}…`;
                    }),
                },
                `Update to ${versions.offered_version}`,
              )
            : h("p", {}, "It is up to date."),
        ),
      );
    }
    const backups = await api<Json>("GET", "/api/managed/allocation/backups");
    const list = (backups.backups ?? []) as Json[];
    cards.push(
      h(
        "section",
        { class: "card" },
        h("h2", {}, "Backups"),
        h(
          "p",
          {},
          h("span", { class: "badge", "data-testid": "backups-health" }, backups.healthy ? "healthy" : "not healthy"),
          ` Nightly, kept ${backups.retention_days} days.`,
        ),
        list.length === 0
          ? h("p", {}, "No backup yet.")
          : h(
              "table",
              { "data-testid": "backups" },
              h("thead", {}, h("tr", {}, h("th", {}, "Taken"), h("th", {}, "Kind"), h("th", {}, "State"), h("th", {}, "Size"))),
              h(
                "tbody",
                {},
                ...list.map((backup) =>
                  h(
                    "tr",
                    {},
                    h("td", {}, when(backup.taken_at ?? backup.started_at)),
                    h("td", {}, `${backup.kind}${backup.tombstone ? " (tombstone)" : ""}`),
                    h("td", {}, String(backup.state)),
                    h("td", {}, `${Math.round(Number(backup.size_bytes) / 1024)} KiB`),
                  ),
                ),
              ),
            ),
      ),
    );
    if (box.status === "deleting") confirmingDelete = false;
    else {
      const confirm = h("div", { hidden: !confirmingDelete, "data-testid": "delete-confirm" });
      const showConfirm = (open: boolean) => {
        confirmingDelete = open;
        if (open) confirm.removeAttribute("hidden");
        else confirm.setAttribute("hidden", "");
      };
      confirm.append(
        notice("error", "This stops the machine and deletes it. There is no undo."),
        h(
          "button",
          {
            type: "button",
            class: "danger",
            onclick: () =>
              act(async () => {
                confirmingDelete = false;
                const gone = await api<Json>("DELETE", "/api/managed/allocation");
                return gone.status === "deleted" ? "Deleted." : "Deleting…";
              }),
          },
          "Yes, delete it",
        ),
        h("button", { type: "button", onclick: () => showConfirm(false) }, "Keep it"),
      );
      cards.push(
        h(
          "section",
          { class: "card" },
          h("h2", {}, "Delete"),
          h("button", { type: "button", onclick: () => showConfirm(true) }, "Delete this machine…"),
          confirm,
        ),
      );
    }
    body.replaceChildren(...cards.filter((card): card is Node | string => card !== null && card !== undefined && card !== false));
    const busy = BUSY.has(String(box.status)) || BUSY.has(String(box.power)) || update.state === "pending" || update.state === "running";
    if (busy) timer = setTimeout(() => void draw().catch(() => {}), 1500);
  };
  shell("hosted", account, h("h1", {}, "Hosted machine"), said, body);
  await draw();
}

// ---- boot

const PAGES: Record<string, (account: Json) => Promise<void>> = {
  nodes: nodesPage,
  link: linkPage,
  "link-codes": linkCodesPage,
  keys: keysPage,
  consent: consentPage,
  assistants: assistantsPage,
  hosted: hostedPage,
};

async function boot(): Promise<void> {
  const page = document.body.dataset.page ?? "";
  if (page === "signin") return signInPage();
  const render = PAGES[page];
  if (!render) return;
  try {
    await render(await signedIn());
  } catch (error) {
    if ((error as Error).message === "signing in") return;
    main().replaceChildren(notice("error", describeError(error)));
  }
}

void boot();
