/**
 * app.ts is the engine's web UI: a small single-page app in plain TypeScript and DOM, bundled
 * into the binary (see assets.ts). It calls the same /api routes as the CLI, authenticated by
 * the session cookie, and sends the session's CSRF token on every state change.
 */
import { DEFAULT_RESTORE_TIMEOUT_S, MAX_RESTORE_TIMEOUT_S } from "../../contract/defaults";
import type { TunnelStatus } from "../link/tunnel";
import { Chart, COLOURS, formatBytes, formatMib, formatPercent, type MetricsHistory, sparkline } from "./charts";
import {
  describeHealthSpec,
  describeLastDump,
  describeProbe,
  gpuDefault,
  hasColour,
  initials,
  type LastDumpView,
  serviceActions,
} from "./format";

type Child = Node | string | number | null | undefined | false;
type Attrs = Record<string, string | number | boolean | EventListener | null | undefined>;

/** h creates an element; `on…` attributes become listeners, booleans toggle attributes. */
function h(tag: string, attrs: Attrs = {}, ...children: (Child | Child[])[]): HTMLElement {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") element.addEventListener(name.slice(2), value);
    else if (value === true) element.setAttribute(name, "");
    else element.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

/** fill replaces an element's children, with the same child rules as h. */
function fill(element: HTMLElement, ...children: (Child | Child[])[]): HTMLElement {
  element.replaceChildren(...Array.from(h("div", {}, ...children).childNodes));
  return element;
}

/**
 * update replaces a region's content only when `key` (what it shows) changed, and keeps the
 * keyboard focus on the same control across the swap, so a periodic refresh neither moves a
 * keyboard user nor makes a screen reader start over.
 */
const shownKeys = new WeakMap<HTMLElement, string>();
function update(container: HTMLElement, key: string, render: () => (Child | Child[])[]): void {
  if (shownKeys.get(container) === key) return;
  shownKeys.set(container, key);
  const active = document.activeElement;
  const focusKey = active && container.contains(active) ? `${active.tagName}|${active.getAttribute("href")}|${active.textContent}` : null;
  fill(container, ...render());
  if (focusKey === null) return;
  for (const candidate of Array.from(container.querySelectorAll<HTMLElement>("a, button, input, select"))) {
    if (`${candidate.tagName}|${candidate.getAttribute("href")}|${candidate.textContent}` === focusKey) {
      candidate.focus();
      return;
    }
  }
}

/** safeHref lets only http(s) addresses become links, so no data can smuggle in a `javascript:` URL. */
function safeHref(url: string): string | null {
  return /^https?:\/\//i.test(url) ? url : null;
}

interface Session {
  role: string;
  name: string;
  csrf: string;
}

interface ApiFailure {
  status: number;
  message: string;
}

let session: Session | null = null;
/** cleanups run when the page changes: timers and log streams of the previous page. */
let cleanups: (() => void)[] = [];

const main = () => document.getElementById("main") as HTMLElement;

/** announce tells screen readers (and the status line) what just happened. */
function announce(message: string): void {
  const live = document.getElementById("live");
  if (live) live.textContent = message;
}

async function api<T>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { accept: "application/json" };
  if (body !== undefined) headers["content-type"] = "application/json";
  if (method !== "GET" && session) headers["x-engine-csrf"] = session.csrf;
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  const text = await response.text();
  const parsed = text ? (JSON.parse(text) as unknown) : undefined;
  if (response.status === 401 && path !== "/ui/session") {
    session = null;
    renderLogin("Your session has ended: sign in again.");
  }
  if (!response.ok) {
    const failure = parsed as { error?: { message?: string }; detail?: { msg?: string; loc?: unknown[] }[] } | undefined;
    const message =
      failure?.error?.message ??
      failure?.detail?.map((d) => `${(d.loc ?? []).join(".")}: ${d.msg}`).join("; ") ??
      `the engine answered ${response.status}`;
    throw { status: response.status, message } satisfies ApiFailure;
  }
  return parsed as T;
}

/** WATCH_WAIT_S is how long one blocking read of a service waits; WATCH_RETRY_MS the pause after one that failed. */
const WATCH_WAIT_S = 60;
const WATCH_RETRY_MS = 3000;

/**
 * watchRecord calls `changed` each time the service's record changes, learnt from blocking
 * reads (`?index&wait`, decision 503), until `signal` aborts. A read that fails (the engine
 * restarting, the service deleted, the session ended) is tried again a moment later; the
 * page's own refresh reports what went wrong.
 */
async function watchRecord(name: string, signal: AbortSignal, changed: () => void): Promise<void> {
  let index: string | null = null;
  while (!signal.aborted) {
    try {
      const query: string = index ? `?index=${encodeURIComponent(index)}&wait=${WATCH_WAIT_S}` : "";
      const response: Response = await fetch(`/api/services/${encodeURIComponent(name)}${query}`, {
        headers: { accept: "application/json" },
        credentials: "same-origin",
        signal,
      });
      await response.arrayBuffer();
      const next: string | null = response.ok ? response.headers.get("x-engine-index") : null;
      if (next === null) {
        await new Promise((resume) => setTimeout(resume, WATCH_RETRY_MS));
        continue;
      }
      if (index !== null && next !== index) changed();
      index = next;
    } catch {
      if (signal.aborted) return;
      await new Promise((resume) => setTimeout(resume, WATCH_RETRY_MS));
    }
  }
}

const messageOf = (error: unknown) => (error as ApiFailure).message ?? String(error);

function errorBox(message: string): HTMLElement {
  return h("p", { class: "error", role: "alert" }, message);
}

function since(iso: string | null | undefined): string {
  if (!iso) return "—";
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${seconds % 60}s`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h ${Math.floor((seconds % 3600) / 60)}m`;
  return `${Math.floor(seconds / 86400)}d ${Math.floor((seconds % 86400) / 3600)}h`;
}

function when(iso: string | null | undefined): string {
  return iso ? new Date(iso).toLocaleString() : "—";
}

function badge(status: string): HTMLElement {
  return h("span", { class: `badge status-${status}` }, status);
}

/** dl renders label/value pairs as a description list, skipping empty values. */
function dl(pairs: [string, Child][]): HTMLElement {
  return h(
    "dl",
    {},
    pairs
      .filter(([, value]) => value !== null && value !== undefined && value !== "")
      .flatMap(([label, value]) => [h("dt", {}, label), h("dd", {}, value)]),
  );
}

function table(caption: string, headers: string[], rows: Child[][]): HTMLElement {
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      {},
      h("caption", { class: "visually-hidden" }, caption),
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          headers.map((label) => h("th", { scope: "col" }, label)),
        ),
      ),
      h(
        "tbody",
        {},
        rows.length === 0
          ? h("tr", {}, h("td", { colspan: headers.length, class: "muted" }, "None yet."))
          : rows.map((cells) =>
              h(
                "tr",
                {},
                cells.map((c) => h("td", {}, c)),
              ),
            ),
      ),
    ),
  );
}

/** field makes a labelled input; the label's `for` ties it to the input for assistive tech. */
function field(label: string, input: HTMLElement, hint?: string): HTMLElement {
  const id = input.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  input.id = id;
  const hintId = hint ? `${id}-hint` : undefined;
  if (hintId) input.setAttribute("aria-describedby", hintId);
  return h(
    "div",
    { class: "field" },
    h("label", { for: id }, label),
    input,
    hint ? h("small", { id: hintId, class: "muted" }, hint) : null,
  );
}

/** confirmDialog asks before a destructive action, in a modal <dialog> (focus-trapped, Esc closes). */
function confirmDialog(title: string, text: string, confirmLabel: string): Promise<boolean> {
  return new Promise((resolve) => {
    const dialog = h(
      "dialog",
      { "aria-labelledby": "confirm-title" },
      h(
        "form",
        { method: "dialog" },
        h("h2", { id: "confirm-title" }, title),
        h("p", {}, text),
        h(
          "div",
          { class: "actions" },
          h("button", { value: "cancel", class: "secondary" }, "Cancel"),
          h("button", { value: "confirm", class: "danger" }, confirmLabel),
        ),
      ),
    ) as HTMLDialogElement;
    dialog.addEventListener("close", () => {
      resolve(dialog.returnValue === "confirm");
      dialog.remove();
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}

// ---------------------------------------------------------------- sign-in

function renderNav(route: string): void {
  const nav = document.getElementById("nav");
  if (!nav) return;
  nav.replaceChildren();
  if (!session) return;
  const links: [string, string][] = [
    ["#/", "Services"],
    ["#/templates", "Templates"],
    ["#/gpus", "GPUs"],
    ["#/tokens", "Tokens"],
    ["#/proxy", "Proxy"],
    ["#/databases", "Databases"],
    ["#/link", "Link"],
  ];
  const current = route.split("/")[1] ?? "";
  nav.append(
    h(
      "ul",
      {},
      links.map(([href, label]) => {
        const section = href.split("/")[1] ?? "";
        const active = section === current || (section === "" && current === "services");
        return h("li", {}, h("a", { href, "aria-current": active ? "page" : null }, label));
      }),
      h(
        "li",
        { class: "who" },
        h("span", { class: "muted" }, `${session?.name} (${session?.role})`),
        h("button", { class: "link-button", type: "button", onclick: () => void signOut() }, "Sign out"),
      ),
    ),
  );
}

async function signOut(): Promise<void> {
  try {
    await api("DELETE", "/ui/session");
  } catch {
    // signed out either way
  }
  session = null;
  renderLogin("Signed out.");
}

function renderLogin(notice?: string): void {
  for (const cleanup of cleanups) cleanup();
  cleanups = [];
  renderNav("");
  const token = h("input", { type: "password", name: "token", autocomplete: "current-password", required: true, spellcheck: "false" });
  const status = h("div", {});
  const form = h(
    "form",
    {
      class: "card narrow",
      onsubmit: async (event: Event) => {
        event.preventDefault();
        status.replaceChildren();
        try {
          session = await api<Session>("POST", "/ui/session", { token: (token as HTMLInputElement).value });
          (token as HTMLInputElement).value = "";
          route();
        } catch (error) {
          status.append(errorBox(messageOf(error)));
        }
      },
    },
    h("h1", {}, "Sign in"),
    notice ? h("p", { class: "muted" }, notice) : null,
    field(
      "Access token",
      token,
      "An engine token (admin.token in the data dir, or one from `engine tokens create`). Or run `engine ui` for a one-time login link.",
    ),
    h("button", { type: "submit" }, "Sign in"),
    status,
  );
  fill(main(), form);
  (token as HTMLInputElement).focus();
}

// ---------------------------------------------------------------- services

interface ServiceRecord {
  id: string;
  name: string;
  kind: string;
  status: string;
  status_message: string | null;
  gpus: number;
  gpu_devices: string[];
  port: number | null;
  restarts: number;
  started_at: string | null;
  template_id: string | null;
  command: string[];
  /** connection is a managed database's: how to connect, the password shown as ****. */
  connection: { engine: string; url: string } | null;
}

interface ProxyDomain {
  domain: string;
  path_prefix: string;
  service: string;
  url: string;
  kind: string;
  certificate: { issuer: string | null; source: string | null; not_after: string | null };
}

async function renderServices(): Promise<void> {
  const list = h("div", { "aria-busy": "true" }, h("p", { class: "muted" }, "Loading services…"));
  const deployStatus = h("div", {});
  const name = h("input", { name: "name", required: true, pattern: "[a-z0-9][a-z0-9-]*", autocomplete: "off" });
  const command = h("input", { name: "command", required: true, autocomplete: "off" });
  const kind = h(
    "select",
    { name: "kind" },
    h("option", { value: "service" }, "service (kept running)"),
    h("option", { value: "batch" }, "batch (runs once)"),
  );
  const canWrite = session?.role !== "readonly";
  fill(
    main(),
    h("h1", {}, "Services"),
    list,
    canWrite
      ? h(
          "section",
          { class: "card", "aria-labelledby": "deploy-command" },
          h("h2", { id: "deploy-command" }, "Deploy a command"),
          h(
            "form",
            {
              class: "inline-form",
              onsubmit: async (event: Event) => {
                event.preventDefault();
                deployStatus.replaceChildren();
                const serviceName = (name as HTMLInputElement).value;
                try {
                  await api("POST", "/api/services", {
                    name: serviceName,
                    kind: (kind as HTMLSelectElement).value,
                    command: (command as HTMLInputElement).value,
                  });
                  announce(`${serviceName} deployed`);
                  location.hash = `#/services/${encodeURIComponent(serviceName)}`;
                } catch (error) {
                  deployStatus.append(errorBox(messageOf(error)));
                }
              },
            },
            field("Name", name),
            field("Command", command, "Run by /bin/sh, e.g. python serve.py"),
            field("Kind", kind),
            h("button", { type: "submit" }, "Deploy"),
          ),
          deployStatus,
        )
      : null,
  );
  const refresh = async () => {
    try {
      const [services, proxy, history] = await Promise.all([
        api<ServiceRecord[]>("GET", "/api/services"),
        api<{ domains: ProxyDomain[] }>("GET", "/api/proxy/status").catch(() => ({ domains: [] as ProxyDomain[] })),
        // The sparklines are a bonus: the list shows without them.
        api<MetricsHistory>("GET", "/api/metrics/history").catch(() => null),
      ]);
      const domainsOf = (service: string) => proxy.domains.filter((d) => d.service === service);
      const key = JSON.stringify([
        services.map((x) => [x.name, x.status, x.status_message, x.gpus, x.gpu_devices, x.port, x.restarts, since(x.started_at)]),
        proxy.domains,
        history?.times.at(-1) ?? null,
      ]);
      const usageOf = (name: string) => {
        const usage = history?.services.find((entry) => entry.name === name);
        if (!usage) return "—";
        return h(
          "span",
          { class: "sparks" },
          sparkline("CPU", usage.cpu_pct, formatPercent, COLOURS.blue),
          sparkline("Memory", usage.rss_bytes, formatBytes, COLOURS.orange),
          usage.gpu_memory_mb.some((value) => value !== null)
            ? sparkline("GPU memory", usage.gpu_memory_mb, formatMib, COLOURS.purple)
            : null,
        );
      };
      update(list, key, () => [
        table(
          "Services",
          ["Name", "Kind", "Status", "Message", "GPUs", "Port", "Domains", "Uptime", "Restarts", "Usage (last hour)"],
          services.map((s) => [
            h("a", { href: `#/services/${encodeURIComponent(s.name)}` }, s.name),
            s.kind,
            badge(s.status),
            // Why it is in that status (the CLI's `services list` message): an exit, a wait, a failing probe.
            s.status_message ? h("span", { class: "status-message" }, s.status_message) : "—",
            s.gpu_devices.length > 0 ? `${s.gpus} (${s.gpu_devices.join(", ")})` : String(s.gpus),
            s.port ?? "—",
            domainsOf(s.name).length > 0
              ? h(
                  "span",
                  {},
                  domainsOf(s.name).map((d) =>
                    h("a", { href: safeHref(d.url), class: "domain" }, d.domain + (d.path_prefix === "/" ? "" : d.path_prefix)),
                  ),
                )
              : "—",
            s.status === "running" ? since(s.started_at) : "—",
            s.restarts,
            usageOf(s.name),
          ]),
        ),
      ]);
      list.setAttribute("aria-busy", "false");
      // bench/ui.ts reads this mark: navigation start to the services table in the page.
      if (performance.getEntriesByName("engine:services-rendered").length === 0) performance.mark("engine:services-rendered");
    } catch (error) {
      update(list, `error:${messageOf(error)}`, () => [errorBox(messageOf(error))]);
    }
  };
  await refresh();
  const timer = setInterval(() => void refresh(), 3000);
  cleanups.push(() => clearInterval(timer));
}

interface Diagnosis {
  service_name: string;
  kind: string;
  status: string;
  /** key_line is the line of the crashed run's output that says what went wrong; null when none was found. */
  error: { class: string; message: string; key_line?: string | null } | null;
  forensics: { last_exit_code: number | null; oom_killed: boolean; gpu_oom: boolean; priv_denied: boolean; last_crash_at: string | null };
  restarts: {
    max_restarts: number;
    window_seconds: number;
    policy: string;
    count: number;
    window_start: string | null;
    last_exit_at: string | null;
    backoff_s: number;
    next_retry_in_s: number | null;
  };
  health: { spec: Record<string, unknown> | null; probe: Record<string, unknown> | null; observations: string[] };
  bindings: { waiting: boolean; messages: string[] };
  build: { last_result: string | null; version: number; reason: string | null };
  remediation: { code: string; detail: string } | null;
  desired_state: string;
  last_dump: Record<string, unknown> | null;
  injected_env_keys: string[];
  pending_env_keys: string[];
  /** user is the OS user the workload runs as; null when it runs as the engine's own user. */
  user: string | null;
}

const yesNo = (value: boolean) => (value ? "yes" : "no");

/** startPeriodNote says where the probe's start period stands, when it has one worth a word. */
function startPeriodNote(health: Diagnosis["health"]): HTMLElement | null {
  const probe = health.probe;
  const failures = Number(probe?.start_period_failures ?? 0);
  const uncounted = `${failures} failed probe${failures === 1 ? "" : "s"}`;
  if (probe?.in_start_period) {
    return h(
      "p",
      { class: "start-period" },
      `In start period: ${probe.start_period_left_s} s of ${health.spec?.start_period_s} s left, ${uncounted} not counted.`,
    );
  }
  if (failures > 0) return h("p", { class: "start-period muted" }, `Start period over; ${uncounted} in it not counted.`);
  return null;
}

/** diagnosisReport renders a Diagnosis cause-and-remedy first, then the evidence. */
function diagnosisReport(d: Diagnosis, record: ServiceRecord): HTMLElement {
  const healthy = !d.error && !d.remediation;
  return h(
    "section",
    { class: "card", "aria-labelledby": "diagnosis-title" },
    h("h2", { id: "diagnosis-title" }, "Diagnosis"),
    h(
      "div",
      { class: healthy ? "verdict ok" : "verdict problem" },
      h("h3", {}, "Cause"),
      h(
        "p",
        { class: "cause" },
        d.error
          ? `${d.error.class}: ${d.error.message}`
          : (record.status_message ?? `The service is ${d.status}; nothing is wrong that the engine can see.`),
      ),
      d.error?.key_line ? [h("h3", {}, "Key log line"), h("pre", { class: "key-line" }, d.error.key_line)] : null,
      d.remediation
        ? [h("h3", {}, "Remediation"), h("p", { class: "remediation" }, h("code", {}, d.remediation.code), " ", d.remediation.detail)]
        : null,
    ),
    h("h3", {}, "Forensics"),
    dl([
      ["Runs as", d.user ?? "the engine's own user"],
      ["Last exit code", d.forensics.last_exit_code ?? "—"],
      ["Killed for memory (OOM)", yesNo(d.forensics.oom_killed)],
      ["GPU out of memory", yesNo(d.forensics.gpu_oom)],
      ["Privilege denied", yesNo(d.forensics.priv_denied)],
      ["Last crash", when(d.forensics.last_crash_at)],
    ]),
    h("h3", {}, "Restart window"),
    dl([
      ["Policy", d.restarts.policy],
      ["Restarts in window", `${d.restarts.count} of ${d.restarts.max_restarts} within ${d.restarts.window_seconds}s`],
      ["Window started", when(d.restarts.window_start)],
      ["Last exit", when(d.restarts.last_exit_at)],
      ["Backoff", `${d.restarts.backoff_s}s`],
      ["Next retry in", d.restarts.next_retry_in_s === null ? "—" : `${d.restarts.next_retry_in_s}s`],
    ]),
    h("h3", {}, "Health"),
    d.health.spec
      ? dl([
          ["Probe", describeHealthSpec(d.health.spec, record.port)],
          ["Last probe", d.health.probe ? describeProbe(d.health.probe, when) : "not probed yet"],
        ])
      : h("p", { class: "muted" }, "No health probe."),
    startPeriodNote(d.health),
    d.health.observations.length > 0
      ? h(
          "ul",
          {},
          d.health.observations.map((o) => h("li", {}, o)),
        )
      : null,
    h("h3", {}, "Bindings"),
    d.bindings.messages.length > 0
      ? h(
          "ul",
          {},
          d.bindings.messages.map((m) => h("li", {}, m)),
        )
      : h("p", { class: "muted" }, d.bindings.waiting ? "Waiting for bindings." : "No bindings pending."),
    h("h3", {}, "Build"),
    dl([
      ["Last result", d.build.last_result ?? "no build"],
      ["Version", d.build.version],
      ["Reason", d.build.reason ?? ""],
    ]),
    d.last_dump ? [h("h3", {}, "Last restore"), dl(describeLastDump(d.last_dump as LastDumpView, when))] : null,
    d.injected_env_keys.length + d.pending_env_keys.length > 0
      ? [
          h("h3", {}, "Environment"),
          dl([
            ["Injected", d.injected_env_keys.join(", ")],
            ["Pending", d.pending_env_keys.join(", ")],
          ]),
        ]
      : null,
  );
}

/**
 * connectionCard shows a managed database's connection URL with its password masked, and to
 * an admin a Reveal button that asks the engine for it in full (the engine logs the reveal).
 * The revealed URL lives in this card only: it is never stored, and Hide puts the mask back.
 */
function connectionCard(name: string, masked: { engine: string; url: string }): HTMLElement {
  const url = h("code", { class: "connection-url" }, masked.url);
  const status = h("span", { "aria-live": "polite" });
  const hide = () => {
    url.textContent = masked.url;
    fill(buttons, revealButton);
    status.textContent = "";
  };
  const reveal = async () => {
    try {
      const full = await api<{ url: string }>("GET", `/api/services/${encodeURIComponent(name)}/connection`);
      url.textContent = full.url;
      fill(buttons, h("button", { type: "button", onclick: hide }, "Hide"));
      announce(`${name}: connection URL revealed`);
    } catch (error) {
      status.replaceChildren(errorBox(messageOf(error)));
    }
  };
  const revealButton = h("button", { type: "button", onclick: () => void reveal() }, "Reveal");
  const buttons = h("span", {}, session?.role === "admin" ? revealButton : null);
  return h(
    "section",
    { class: "card", "aria-labelledby": "connection-title" },
    h("h2", { id: "connection-title" }, "Connection"),
    h("p", {}, url, " ", buttons),
    h(
      "p",
      { class: "muted" },
      session?.role === "admin"
        ? "The password is masked; Reveal shows it (the engine logs that you did)."
        : "The password is masked; an admin can reveal it.",
    ),
    status,
  );
}

async function renderService(name: string): Promise<void> {
  const header = h("div", { class: "service-head" }, h("h1", {}, name));
  const actions = h("div", { class: "actions", role: "group", "aria-label": "Service actions" });
  const notice = h("div", {});
  const connection = h("div", {});
  const report = h("div", {}, h("p", { class: "muted" }, "Diagnosing…"));
  const logs = h("pre", { class: "logs", role: "log", "aria-label": `Logs of ${name}`, tabindex: "0" });
  const logState = h("span", { class: "muted" }, "connecting…");
  const usage = h("div", { class: "charts" }, h("p", { class: "muted" }, "Measuring…"));
  fill(
    main(),
    h("p", {}, h("a", { href: "#/" }, "← Services")),
    header,
    actions,
    notice,
    connection,
    h("section", { class: "card", "aria-labelledby": "usage-title" }, h("h2", { id: "usage-title" }, "Usage, last hour"), usage),
    h("section", { class: "card", "aria-labelledby": "logs-title" }, h("h2", { id: "logs-title" }, "Logs ", logState), logs),
    report,
  );
  cleanups.push(await serviceCharts(name, usage));

  const act = async (action: string) => {
    notice.replaceChildren();
    try {
      await api("POST", `/api/services/${encodeURIComponent(name)}/${action}`);
      announce(`${name}: ${action} requested`);
      await refresh();
    } catch (error) {
      notice.append(errorBox(messageOf(error)));
    }
  };
  const remove = async () => {
    if (!(await confirmDialog(`Delete ${name}?`, "The service is stopped and removed. Its data directory is kept.", "Delete"))) return;
    try {
      await api("DELETE", `/api/services/${encodeURIComponent(name)}`);
      announce(`${name} deleted`);
      location.hash = "#/";
    } catch (error) {
      notice.append(errorBox(messageOf(error)));
    }
  };

  const refresh = async () => {
    try {
      const [record, diagnosis] = await Promise.all([
        api<ServiceRecord>("GET", `/api/services/${encodeURIComponent(name)}`),
        api<Diagnosis>("GET", `/api/services/${encodeURIComponent(name)}/diagnose`),
      ]);
      update(header, JSON.stringify([record.status, record.kind, record.command]), () => [
        h("h1", {}, name, " ", badge(record.status)),
        h("p", { class: "muted" }, `${record.kind} · ${record.command.join(" ")}`),
      ]);
      if (session?.role !== "readonly") {
        // Each button is disabled, with the reason as its title, where it cannot apply now.
        const buttons = serviceActions(record.status, record.kind);
        update(actions, JSON.stringify(buttons), () => [
          buttons.map((button) =>
            h(
              "button",
              {
                type: "button",
                disabled: button.disabledReason !== null,
                title: button.disabledReason,
                onclick: () => void act(button.action),
              },
              button.label,
            ),
          ),
          h("button", { type: "button", class: "danger", onclick: () => void remove() }, "Delete…"),
        ]);
      }
      // Keyed by the masked URL: a periodic refresh leaves a revealed URL alone until it changes.
      update(connection, JSON.stringify(record.connection), () => (record.connection ? [connectionCard(name, record.connection)] : []));
      // The report's own logs are left out of the comparison: the live log panel shows them.
      update(report, JSON.stringify([{ ...diagnosis, logs: [] }, record.status_message]), () => [diagnosisReport(diagnosis, record)]);
    } catch (error) {
      const message = (error as ApiFailure).status === 404 ? `No service named ${name}.` : messageOf(error);
      update(report, `error:${message}`, () => [errorBox(message)]);
    }
  };
  await refresh();
  const timer = setInterval(() => void refresh(), 3000);
  cleanups.push(() => clearInterval(timer));
  // The record is watched with blocking reads (decision 503): a crash, a restart or a stop
  // made elsewhere shows at once, not at the next refresh.
  const watching = new AbortController();
  cleanups.push(() => watching.abort());
  void watchRecord(name, watching.signal, () => void refresh());

  // Live logs: the API's SSE stream, sent with the session cookie (a GET needs no CSRF token).
  const source = new EventSource(`/api/services/${encodeURIComponent(name)}/logs?follow=true&tail=200`);
  const noOutput = h("span", { class: "muted" }, "No output yet.");
  // A reconnection (the engine restarted) sends Last-Event-ID, and the stream resumes after the
  // last line shown: the view keeps its lines and gets only the new ones (docs/decisions.md 366).
  source.addEventListener("open", () => {
    logState.textContent = "live";
  });
  source.addEventListener("ready", (event) => {
    // Sent at once, before any line: a service that printed nothing says so instead of waiting.
    const { lines } = JSON.parse((event as MessageEvent<string>).data) as { lines: number };
    logState.textContent = "live";
    if (lines === 0 && logs.childNodes.length === 0) logs.append(noOutput);
  });
  source.addEventListener("error", () => {
    logState.textContent = "reconnecting…";
  });
  source.addEventListener("line", (event) => {
    const line = JSON.parse((event as MessageEvent<string>).data) as { ts: string; stream: string; line: string };
    noOutput.remove();
    const stick = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 8;
    logs.append(h("span", { class: `line ${line.stream}` }, line.line, "\n"));
    while (logs.childNodes.length > 2000) logs.firstChild?.remove();
    if (stick) logs.scrollTop = logs.scrollHeight;
  });
  cleanups.push(() => source.close());
}

// ---------------------------------------------------------------- templates

interface AppTemplate {
  id: string;
  name: string;
  icon: string;
  category: string;
  repo_url: string;
  ai_hint: string;
  deploy_defaults: { port: number; gpus: number; start: string };
  env_schema: { name: string; required: boolean; secret: boolean }[];
}

/** emojiSupport remembers, per icon, whether this browser draws it in colour (emojiRenders). */
const emojiSupport = new Map<string, boolean>();

/**
 * emojiRenders says whether the browser draws `text` as a colour emoji: it paints the text black
 * on a small transparent canvas once and looks for colour (hasColour). Without an emoji font
 * the glyph is a black box or a monochrome shape, and the caller shows a text badge instead.
 */
function emojiRenders(text: string): boolean {
  const known = emojiSupport.get(text);
  if (known !== undefined) return known;
  let renders = false;
  try {
    const size = 32;
    const canvas = document.createElement("canvas");
    canvas.width = size;
    canvas.height = size;
    const context = canvas.getContext("2d", { willReadFrequently: true });
    if (context && text.trim() !== "") {
      context.textBaseline = "top";
      context.fillStyle = "#000";
      context.font = `24px ${getComputedStyle(document.body).fontFamily}`;
      context.fillText(text, 2, 2);
      renders = hasColour(context.getImageData(0, 0, size, size).data);
    }
  } catch {
    renders = false;
  }
  emojiSupport.set(text, renders);
  return renders;
}

/** templateIcon is a template's emoji where the browser can draw it, else a badge of its initials. */
function templateIcon(template: AppTemplate): HTMLElement {
  return emojiRenders(template.icon)
    ? h("span", { class: "icon", "aria-hidden": "true" }, template.icon)
    : h("span", { class: "icon-badge", "aria-hidden": "true" }, initials(template.name));
}

async function renderTemplates(): Promise<void> {
  const gallery = h("div", { class: "gallery" }, h("p", { class: "muted" }, "Loading templates…"));
  const panel = h("div", {});
  fill(main(), h("h1", {}, "Templates"), panel, gallery);
  let templates: AppTemplate[];
  // The host's GPU count sets the deploy form's default; unknown (null) when it cannot be read.
  let gpuCount: number | null;
  try {
    [templates, gpuCount] = await Promise.all([
      api<AppTemplate[]>("GET", "/api/app-templates"),
      api<GpuInventory>("GET", "/api/gpus").then(
        (inventory) => inventory.devices.length,
        () => null,
      ),
    ]);
  } catch (error) {
    gallery.replaceChildren(errorBox(messageOf(error)));
    return;
  }
  gallery.replaceChildren(
    ...templates.map((template) =>
      h(
        "article",
        { class: "card template", "aria-labelledby": `t-${template.id}` },
        h("h2", { id: `t-${template.id}` }, templateIcon(template), " ", template.name),
        h(
          "p",
          { class: "muted" },
          `${template.category} · ${template.deploy_defaults.gpus} GPU${template.deploy_defaults.gpus === 1 ? "" : "s"}`,
        ),
        h("p", { class: "hint" }, template.ai_hint.length > 180 ? `${template.ai_hint.slice(0, 180)}…` : template.ai_hint),
        session?.role !== "readonly"
          ? h(
              "button",
              { type: "button", "aria-label": `Deploy ${template.name}`, onclick: () => deployForm(template, panel, gpuCount) },
              "Deploy",
            )
          : null,
      ),
    ),
  );
}

/**
 * deployForm builds the one-click deploy form from a template's env_schema and defaults; the
 * GPU count starts at what this host can give (gpuDefault), with the host's count as its hint.
 */
function deployForm(template: AppTemplate, panel: HTMLElement, gpuCount: number | null): void {
  const name = h("input", { name: "name", required: true, value: template.id, pattern: "[a-z0-9][a-z0-9-]*" }) as HTMLInputElement;
  const gpuStart = gpuDefault(template.deploy_defaults.gpus, gpuCount);
  const gpus = h("input", { name: "gpus", type: "number", min: 0, max: 64, value: gpuStart.value }) as HTMLInputElement;
  const domain = h("input", { name: "domain", placeholder: `${template.id}.local`, autocomplete: "off" }) as HTMLInputElement;
  const envInputs = template.env_schema.map((entry) => ({
    entry,
    input: h("input", {
      name: entry.name,
      type: entry.secret ? "password" : "text",
      required: entry.required,
      autocomplete: entry.secret ? "new-password" : "off",
    }) as HTMLInputElement,
  }));
  const status = h("div", {});
  const form = h(
    "form",
    {
      class: "card",
      "aria-labelledby": "deploy-title",
      onsubmit: async (event: Event) => {
        event.preventDefault();
        status.replaceChildren(h("p", { class: "muted" }, "Deploying…"));
        const env: Record<string, string> = {};
        const secrets: Record<string, string> = {};
        for (const { entry, input } of envInputs) {
          if (input.value === "") continue;
          (entry.secret ? secrets : env)[entry.name] = input.value;
        }
        try {
          await api("POST", "/api/services", { name: name.value, template_id: template.id, gpus: Number(gpus.value), env, secrets });
        } catch (error) {
          status.replaceChildren(errorBox(messageOf(error)));
          return;
        }
        const page = `#/services/${encodeURIComponent(name.value)}`;
        if (domain.value.trim() !== "") {
          try {
            await api("POST", `/api/services/${encodeURIComponent(name.value)}/domains`, { domain: domain.value.trim() });
          } catch (error) {
            // The service runs; only the domain is missing: say so, and link to the service.
            status.replaceChildren(
              errorBox(`${name.value} is deployed, but the domain could not be added: ${messageOf(error)}`),
              h("p", {}, h("a", { href: page }, `Open ${name.value}`)),
            );
            return;
          }
        }
        announce(`${name.value} deployed from ${template.name}`);
        location.hash = page;
      },
    },
    h("h2", { id: "deploy-title" }, `Deploy ${template.name}`),
    field("Service name", name),
    field("GPUs", gpus, gpuStart.hint ?? undefined),
    field("Domain (optional)", domain, "e.g. app.local: served by the proxy with a local-CA certificate"),
    envInputs.length > 0
      ? h(
          "fieldset",
          {},
          h("legend", {}, "Environment"),
          envInputs.map(({ entry, input }) =>
            field(`${entry.name}${entry.required ? " (required)" : ""}${entry.secret ? " — secret" : ""}`, input),
          ),
        )
      : null,
    h(
      "div",
      { class: "actions" },
      h("button", { type: "submit" }, "Deploy"),
      h("button", { type: "button", class: "secondary", onclick: () => panel.replaceChildren() }, "Cancel"),
    ),
    status,
  );
  panel.replaceChildren(form);
  name.focus();
}

// ---------------------------------------------------------------- tokens

interface TokenRecord {
  id: string;
  name: string;
  role: string;
  created_at: string;
  last_used_at: string | null;
  revoked: boolean;
  expires_at: string | null;
  max_gpus: number | null;
  scope_services: string[];
}

async function renderTokens(): Promise<void> {
  const list = h("div", {});
  const created = h("div", {});
  const isAdmin = session?.role === "admin";
  const name = h("input", { name: "name", required: true, autocomplete: "off" }) as HTMLInputElement;
  const role = h(
    "select",
    { name: "role" },
    h("option", { value: "readonly" }, "readonly"),
    h("option", { value: "submitter" }, "submitter"),
    h("option", { value: "admin" }, "admin"),
  ) as HTMLSelectElement;
  const maxGpus = h("input", { name: "max_gpus", type: "number", min: 0 }) as HTMLInputElement;
  const expiresDays = h("input", { name: "expires_in_days", type: "number", min: 1 }) as HTMLInputElement;
  const scope = h("input", { name: "scope_services", autocomplete: "off", placeholder: "web, db" }) as HTMLInputElement;
  fill(
    main(),
    h("h1", {}, "Tokens"),
    created,
    isAdmin
      ? h(
          "section",
          { class: "card", "aria-labelledby": "create-token" },
          h("h2", { id: "create-token" }, "Create a token"),
          h(
            "form",
            {
              class: "inline-form",
              onsubmit: async (event: Event) => {
                event.preventDefault();
                created.replaceChildren();
                try {
                  const body: Record<string, unknown> = { name: name.value, role: role.value };
                  if (maxGpus.value !== "") body.max_gpus = Number(maxGpus.value);
                  if (expiresDays.value !== "")
                    body.expires_at = new Date(Date.now() + Number(expiresDays.value) * 86_400_000).toISOString();
                  const services = scope.value
                    .split(",")
                    .map((name) => name.trim())
                    .filter((name) => name !== "");
                  if (services.length > 0) body.scope_services = services;
                  const token = await api<TokenRecord & { token: string }>("POST", "/api/tokens", body);
                  name.value = "";
                  const secret = h("input", {
                    readonly: true,
                    value: token.token,
                    "aria-label": "New token",
                    class: "secret",
                    id: "new-token",
                  }) as HTMLInputElement;
                  created.replaceChildren(
                    h(
                      "div",
                      { class: "card notice", role: "status" },
                      h("h2", {}, `Token ${token.name} created`),
                      h("p", {}, "Copy it now: it is shown once and cannot be read again."),
                      secret,
                      h(
                        "button",
                        { type: "button", onclick: () => void navigator.clipboard?.writeText(token.token).then(() => announce("Copied")) },
                        "Copy",
                      ),
                    ),
                  );
                  secret.select();
                  await refresh();
                } catch (error) {
                  created.append(errorBox(messageOf(error)));
                }
              },
            },
            field("Name", name),
            field("Role", role),
            field("Max GPUs (optional)", maxGpus),
            field("Expires in days (optional)", expiresDays),
            field("Scope (optional)", scope, "Services this token may touch, comma-separated; empty: all"),
            h("button", { type: "submit" }, "Create"),
          ),
        )
      : null,
    list,
  );
  const revoke = async (token: TokenRecord) => {
    if (!(await confirmDialog(`Revoke ${token.name}?`, "Anything using this token loses access at once.", "Revoke"))) return;
    try {
      await api("DELETE", `/api/tokens/${encodeURIComponent(token.id)}`);
      announce(`${token.name} revoked`);
      await refresh();
    } catch (error) {
      list.prepend(errorBox(messageOf(error)));
    }
  };
  const refresh = async () => {
    try {
      const tokens = await api<TokenRecord[]>("GET", "/api/tokens");
      list.replaceChildren(
        table(
          "Tokens",
          ["Name", "Role", "Scope", "Created", "Last used", "Expires", "State", ""],
          tokens.map((t) => [
            t.name,
            t.role,
            t.scope_services.length > 0 ? t.scope_services.join(", ") : "all services",
            when(t.created_at),
            when(t.last_used_at),
            when(t.expires_at),
            t.revoked ? badge("revoked") : badge("active"),
            isAdmin && !t.revoked
              ? h(
                  "button",
                  { type: "button", class: "danger small", "aria-label": `Revoke ${t.name}`, onclick: () => void revoke(t) },
                  "Revoke",
                )
              : "",
          ]),
        ),
      );
    } catch (error) {
      list.replaceChildren(errorBox(messageOf(error)));
    }
  };
  await refresh();
}

// ---------------------------------------------------------------- GPUs, proxy, link, databases

interface GpuInventory {
  source: string;
  warnings: string[];
  devices: {
    index: number;
    name: string;
    uuid: string;
    memory_total_mb: number;
    memory_used_mb: number | null;
    utilization_pct: number | null;
    reserved_mb: number;
    holders: { service: string; whole: boolean; memory_mb: number }[];
  }[];
}

/**
 * serviceCharts draws a service's CPU, memory and GPU memory over the last hour and keeps them
 * current (every 5 s, asking only for the samples it lacks); it returns the cleanup.
 */
async function serviceCharts(name: string, container: HTMLElement): Promise<() => void> {
  const cpu = new Chart();
  const memory = new Chart();
  const gpu = new Chart();
  return keepCharts(
    container,
    (since) => `/api/metrics/history?service=${encodeURIComponent(name)}${since === undefined ? "" : `&since=${since}`}`,
    (history) => {
      const usage = history.services[0];
      if (!usage) return;
      if (container.querySelector("figure") === null) {
        fill(container, cpu.element, memory.element, usage.gpu_memory_mb.some((value) => value !== null) ? gpu.element : null);
      }
      cpu.show({
        title: "CPU",
        times: history.times,
        series: [{ label: "CPU", values: usage.cpu_pct, scale: "pct", colour: COLOURS.blue, format: formatPercent }],
      });
      memory.show({
        title: "Memory (resident)",
        times: history.times,
        series: [{ label: "Memory", values: usage.rss_bytes, scale: "bytes", colour: COLOURS.orange, format: formatBytes }],
      });
      if (gpu.element.isConnected) {
        gpu.show({
          title: "GPU memory",
          times: history.times,
          series: [{ label: "GPU memory", values: usage.gpu_memory_mb, scale: "mib", colour: COLOURS.purple, format: formatMib }],
        });
      }
    },
    () => [cpu, memory, gpu],
  );
}

/**
 * keepCharts reads the metrics history at `path` and draws it now and every 5 s, asking only for
 * the samples after the last one it holds; a failed read shows its error while no chart is drawn
 * yet. It returns the cleanup, which stops the reads and destroys `charts()`.
 */
async function keepCharts(
  container: HTMLElement,
  path: (since: number | undefined) => string,
  draw: (history: MetricsHistory) => void,
  charts: () => Iterable<Chart>,
): Promise<() => void> {
  let history: MetricsHistory | null = null;
  const tick = async () => {
    try {
      history = mergeHistory(history, await api<MetricsHistory>("GET", path(history?.times.at(-1))));
      draw(history);
    } catch (error) {
      if (!container.querySelector("figure")) fill(container, errorBox(messageOf(error)));
    }
  };
  await tick();
  const timer = setInterval(() => void tick(), 5000);
  return () => {
    clearInterval(timer);
    for (const chart of charts()) chart.destroy();
  };
}

/**
 * mergeHistory appends a `since` answer to what the page holds and drops what fell out of the
 * window, so a page left open asks for a few samples at a time rather than the whole hour.
 */
function mergeHistory(held: MetricsHistory | null, fresh: MetricsHistory): MetricsHistory {
  if (!held) return fresh;
  const cutoff = fresh.now - fresh.window_s;
  const keep = held.times.findIndex((time) => time > cutoff);
  const from = keep < 0 ? held.times.length : keep;
  const join = <T>(old: T[] | undefined, added: T[], length: number): T[] => [
    ...(old ?? new Array(length).fill(null)).slice(from),
    ...added,
  ];
  const n = held.times.length;
  return {
    ...fresh,
    times: join(held.times, fresh.times, n),
    gpus: fresh.gpus.map((gpu) => {
      const old = held.gpus.find((entry) => entry.uuid === gpu.uuid);
      return {
        ...gpu,
        utilization_pct: join(old?.utilization_pct, gpu.utilization_pct, n),
        memory_used_mb: join(old?.memory_used_mb, gpu.memory_used_mb, n),
      };
    }),
    services: fresh.services.map((service) => {
      const old = held.services.find((entry) => entry.id === service.id);
      return {
        ...service,
        cpu_pct: join(old?.cpu_pct, service.cpu_pct, n),
        rss_bytes: join(old?.rss_bytes, service.rss_bytes, n),
        gpu_memory_mb: join(old?.gpu_memory_mb, service.gpu_memory_mb, n),
      };
    }),
  };
}

/** gpuCharts draws each GPU's utilization and memory over the last hour, kept current; it returns the cleanup. */
async function gpuCharts(container: HTMLElement): Promise<() => void> {
  const charts = new Map<string, Chart>();
  return keepCharts(
    container,
    (since) => `/api/metrics/history${since === undefined ? "" : `?since=${since}`}`,
    (history) => {
      if (history.gpus.length === 0) {
        if (container.querySelector("figure") === null) {
          fill(
            container,
            h("p", { class: "muted" }, "No GPU reports utilization or memory (no nvidia-smi, or GPUs declared with ENGINE_GPUS)."),
          );
        }
        return;
      }
      for (const gpu of history.gpus) {
        let chart = charts.get(gpu.uuid);
        if (!chart) {
          chart = new Chart();
          charts.set(gpu.uuid, chart);
          if (charts.size === 1) container.replaceChildren();
          container.append(chart.element);
        }
        chart.show({
          title: `GPU ${gpu.index} · ${gpu.name}`,
          times: history.times,
          series: [
            { label: "Utilization", values: gpu.utilization_pct, scale: "pct", colour: COLOURS.blue, format: formatPercent },
            { label: "Memory used", values: gpu.memory_used_mb, scale: "mib", colour: COLOURS.orange, format: formatMib },
          ],
          ranges: { pct: [0, 100], ...(gpu.memory_total_mb ? { mib: [0, gpu.memory_total_mb] as [number, number] } : {}) },
        });
      }
    },
    () => charts.values(),
  );
}

async function renderGpus(): Promise<void> {
  fill(main(), h("h1", {}, "GPUs"), h("p", { class: "muted" }, "Loading…"));
  try {
    const inventory = await api<GpuInventory>("GET", "/api/gpus");
    const usage = h("div", { class: "charts" }, h("p", { class: "muted" }, "Measuring…"));
    fill(
      main(),
      h("h1", {}, "GPUs"),
      h("p", { class: "muted" }, `Source: ${inventory.source}`),
      inventory.warnings.map((w) => h("p", { class: "warning" }, w)),
      table(
        "GPUs",
        ["#", "Name", "Memory used / total", "Utilization", "Reserved", "Held by"],
        inventory.devices.map((d) => [
          d.index,
          d.name,
          `${d.memory_used_mb ?? "?"} / ${d.memory_total_mb} MB`,
          d.utilization_pct === null ? "—" : `${d.utilization_pct}%`,
          `${d.reserved_mb} MB`,
          d.holders.length === 0 ? "free" : d.holders.map((x) => `${x.service}${x.whole ? " (whole)" : ` (${x.memory_mb} MB)`}`).join(", "),
        ]),
      ),
      h("section", { class: "card", "aria-labelledby": "gpu-usage-title" }, h("h2", { id: "gpu-usage-title" }, "Usage, last hour"), usage),
    );
    cleanups.push(await gpuCharts(usage));
  } catch (error) {
    fill(main(), h("h1", {}, "GPUs"), errorBox(messageOf(error)));
  }
}

interface ProxyStatus {
  state: string;
  mode: string;
  hostname: string;
  https_port: number;
  ca: { fingerprint_sha256?: string; subject: string; not_after?: string; trusted_in_system?: boolean };
  mdns: { enabled: boolean; backend: string; published: boolean; names: string[] };
  domains: ProxyDomain[];
}

async function renderProxy(): Promise<void> {
  try {
    const status = await api<ProxyStatus>("GET", "/api/proxy/status");
    fill(
      main(),
      h("h1", {}, "Proxy"),
      h(
        "section",
        { class: "card" },
        dl([
          ["State", badge(status.state)],
          ["Mode", status.mode],
          ["Host name", status.hostname],
          ["HTTPS port", status.https_port],
          ["CA", status.ca.subject],
          ["CA fingerprint (SHA-256)", h("code", { class: "wrap" }, status.ca.fingerprint_sha256 ?? "—")],
          ["CA expires", when(status.ca.not_after)],
          ["CA trusted by the system", status.ca.trusted_in_system === undefined ? "—" : yesNo(status.ca.trusted_in_system)],
          [
            "mDNS",
            `${status.mdns.backend}${status.mdns.published ? ", published" : ""}${status.mdns.names.length ? `: ${status.mdns.names.join(", ")}` : ""}`,
          ],
        ]),
      ),
      h("h2", {}, "Domains"),
      table(
        "Domains",
        ["Domain", "Service", "Kind", "Certificate", "Expires"],
        status.domains.map((d) => [
          h("a", { href: safeHref(d.url) }, d.domain + (d.path_prefix === "/" ? "" : d.path_prefix)),
          d.service,
          d.kind,
          d.certificate.issuer ?? d.certificate.source ?? "—",
          when(d.certificate.not_after),
        ]),
      ),
    );
  } catch (error) {
    fill(main(), h("h1", {}, "Proxy"), errorBox(messageOf(error)));
  }
}

interface LinkStatus {
  linked: boolean;
  cloud_url: string | null;
  node_id: string | null;
  slug: string | null;
  account_id: string | null;
  hosted_base_domain: string | null;
  linked_at: string | null;
  metadata_refreshed_at: string | null;
  tunnel: TunnelStatus;
}

/**
 * tunnelRows say how the relay's tunnel to the console stands: connected since when, or
 * disconnected with the last error and the next attempt (a user reads why the console shows
 * this machine offline).
 */
function tunnelRows(tunnel: LinkStatus["tunnel"]): [string, Child][] {
  const state = tunnel.state === "connected" ? "connected" : tunnel.state === "connecting" ? "connecting" : "disconnected";
  return [
    ["Tunnel", h("span", {}, badge(state), ` since ${when(tunnel.since)}`)],
    ["Last error", tunnel.last_error ? `${tunnel.last_error} (${when(tunnel.last_error_at)})` : ""],
    ["Next attempt", tunnel.state === "disconnected" ? when(tunnel.next_attempt_at) : ""],
  ];
}

async function renderLink(): Promise<void> {
  const steps = h(
    "ol",
    {},
    h("li", {}, "On this machine, run ", h("code", {}, "engine link"), "."),
    h("li", {}, "Open the address it prints and enter the code it shows; check the host name before approving."),
    h(
      "li",
      {},
      "Or, with a pre-authorized key: ",
      h("code", {}, "engine link --key <key>"),
      "; with a link code: ",
      h("code", {}, "engine link --code <code>"),
      ".",
    ),
  );
  let status: HTMLElement;
  try {
    const link = await api<LinkStatus>("GET", "/api/link/status");
    status = link.linked
      ? h(
          "section",
          { class: "card", "aria-labelledby": "linked-title" },
          h("h2", { id: "linked-title" }, "Linked ", badge("active")),
          dl([
            ["Cloud console", link.cloud_url ? h("a", { href: safeHref(link.cloud_url) }, link.cloud_url) : "—"],
            ["Node", `${link.slug ?? "—"} (${link.node_id ?? "—"})`],
            ["Account", link.account_id ?? "—"],
            ["Hosted base domain", link.hosted_base_domain ?? "—"],
            ["Linked at", when(link.linked_at)],
            ["Metadata refreshed", when(link.metadata_refreshed_at)],
            ...tunnelRows(link.tunnel),
          ]),
          h(
            "p",
            { class: "muted" },
            "To link elsewhere, run ",
            h("code", {}, "engine unlink"),
            " and then ",
            h("code", {}, "engine link"),
            " again.",
          ),
        )
      : h(
          "section",
          { class: "card", "aria-labelledby": "linked-title" },
          h("h2", { id: "linked-title" }, "Not linked"),
          h("p", {}, "Linking lets you manage this machine from the cloud console and authorize assistants to reach it."),
          steps,
        );
  } catch (error) {
    status = errorBox(messageOf(error));
  }
  fill(main(), h("h1", {}, "Link to the cloud console"), status);
}

async function renderDatabases(): Promise<void> {
  const panel = h("div", {});
  fill(main(), h("h1", {}, "Databases"), panel);
  let services: ServiceRecord[];
  try {
    services = (await api<ServiceRecord[]>("GET", "/api/services")).filter((s) => s.kind === "database");
  } catch (error) {
    panel.replaceChildren(errorBox(messageOf(error)));
    return;
  }
  if (services.length === 0) {
    panel.replaceChildren(
      h("p", { class: "muted" }, "No database services. Deploy PostgreSQL, MariaDB, Redis or SQLite from the templates."),
    );
    return;
  }
  const target = h(
    "select",
    { name: "database" },
    services.map((s) => h("option", { value: s.name }, `${s.name} (${s.status})`)),
  ) as HTMLSelectElement;
  const dump = h("input", { name: "dump", required: true, placeholder: "/path/to/dump.sql.gz or https://…" }) as HTMLInputElement;
  // The same default as `engine restore` without --timeout.
  const timeout = h("input", {
    name: "timeout_s",
    type: "number",
    min: 1,
    max: MAX_RESTORE_TIMEOUT_S,
    value: DEFAULT_RESTORE_TIMEOUT_S,
  }) as HTMLInputElement;
  const progress = h("div", { "aria-live": "polite" });
  panel.replaceChildren(
    h(
      "form",
      {
        class: "card",
        "aria-labelledby": "restore-title",
        onsubmit: async (event: Event) => {
          event.preventDefault();
          const started = Date.now();
          const bar = h("progress", { "aria-label": "Restore progress", max: 100 }) as HTMLProgressElement;
          bar.removeAttribute("value");
          const elapsed = h("span", {}, "0 s");
          const read = h("span", {}, "");
          progress.replaceChildren(h("p", {}, bar, " Restoring… ", read, " ", elapsed));
          const timer = setInterval(() => {
            elapsed.textContent = `${Math.round((Date.now() - started) / 1000)} s`;
          }, 500);
          // The engine writes `restore: read N of M bytes (P%)` to the database's log as it reads.
          const source = new EventSource(`/api/services/${encodeURIComponent(target.value)}/logs?tail=0&follow=true`);
          source.addEventListener("line", (message) => {
            const line = (JSON.parse((message as MessageEvent<string>).data) as { line: string }).line;
            const match = /^restore: read (\d+) of (\d+|\?) bytes/.exec(line);
            if (!match) return;
            const bytesRead = Number(match[1]);
            const total = match[2] === "?" ? null : Number(match[2]);
            if (total) bar.value = Math.min(100, (bytesRead / total) * 100);
            read.textContent = `${(bytesRead / 1048576).toFixed(1)}${total ? ` of ${(total / 1048576).toFixed(1)}` : ""} MiB`;
          });
          try {
            const result = await api<{ engine: string; duration_s: number }>(
              "POST",
              `/api/databases/${encodeURIComponent(target.value)}/restore`,
              {
                dump: dump.value,
                timeout_s: Number(timeout.value),
              },
            );
            progress.replaceChildren(
              h(
                "p",
                { class: "ok", role: "status" },
                `Restored into ${target.value} (${result.engine}) in ${result.duration_s.toFixed(1)} s.`,
              ),
            );
          } catch (error) {
            progress.replaceChildren(errorBox(messageOf(error)));
          } finally {
            clearInterval(timer);
            source.close();
          }
        },
      },
      h("h2", { id: "restore-title" }, "Restore a dump"),
      field("Database", target),
      field("Dump", dump, "A path on this machine or an https:// URL; the database is replaced only when the restore succeeds."),
      field("Timeout (seconds)", timeout),
      h("button", { type: "submit" }, "Restore"),
      progress,
    ),
  );
}

// ---------------------------------------------------------------- router

async function route(): Promise<void> {
  for (const cleanup of cleanups) cleanup();
  cleanups = [];
  if (!session) {
    try {
      session = await api<Session>("GET", "/ui/session");
    } catch {
      renderLogin();
      return;
    }
  }
  const hash = location.hash.replace(/^#/, "") || "/";
  renderNav(hash);
  const [, section = "", param] = hash.split("/");
  const titles: Record<string, string> = {
    "": "Services",
    services: "Services",
    templates: "Templates",
    gpus: "GPUs",
    tokens: "Tokens",
    proxy: "Proxy",
    databases: "Databases",
    link: "Link",
  };
  document.title = `${param ? decodeURIComponent(param) : (titles[section] ?? "engine")} · engine`;
  if (section === "services" && param) await renderService(decodeURIComponent(param));
  else if (section === "templates") await renderTemplates();
  else if (section === "tokens") await renderTokens();
  else if (section === "gpus") await renderGpus();
  else if (section === "proxy") await renderProxy();
  else if (section === "databases") await renderDatabases();
  else if (section === "link") await renderLink();
  else await renderServices();
}

window.addEventListener("hashchange", () => {
  // Move focus to the new page's content so keyboard and screen-reader users land there.
  void route().then(() => {
    if (session) main().focus({ preventScroll: true });
  });
});
void route();
