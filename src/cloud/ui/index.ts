import { Elysia } from "elysia";
import type { CloudDeps } from "../context";
import { consoleAssets } from "./bundle";

export { buildConsoleAssets, type ConsoleAssets, consoleAssets } from "./bundle";

/**
 * CONSOLE_PAGES maps each page path outside /api to its page id (the body's `data-page`) and
 * title. Every page is the same shell; the bundled script draws it after checking the session.
 */
export const CONSOLE_PAGES: Record<string, { page: string; title: string; routedBy?: "oauth" }> = {
  "/signin": { page: "signin", title: "Sign in" },
  "/nodes": { page: "nodes", title: "Nodes" },
  "/link": { page: "link", title: "Approve a device" },
  "/link-codes": { page: "link-codes", title: "Link codes" },
  "/keys": { page: "keys", title: "Pre-authorized keys" },
  "/assistants": { page: "assistants", title: "Assistants" },
  "/hosted": { page: "hosted", title: "Hosted machine" },
  // The authorization endpoint shares this path: src/cloud/oauth serves the page when the query
  // carries only the pending request's `rid`, and handles an assistant's request otherwise.
  "/oauth/authorize": { page: "consent", title: "Authorize an assistant", routedBy: "oauth" },
};

/**
 * PAGE_HEADERS keep the pages to their own origin: scripts and styles only from the console,
 * no framing (clickjacking an Approve button), and no Referer, so a user code in `/link`'s
 * query never leaves in one.
 */
const PAGE_HEADERS = {
  "content-type": "text/html; charset=utf-8",
  "cache-control": "no-store",
  "content-security-policy":
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
  "x-frame-options": "DENY",
  "referrer-policy": "no-referrer",
  "x-content-type-options": "nosniff",
};

const escapeHtml = (text: string) => text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

/**
 * signInAttributes tell the sign-in page's script what this console offers: whether an
 * OpenID provider is configured, which social providers it brokers, and the public URL
 * (a browser on another host would lose the sign-in cookie on the way back). None is secret.
 */
function signInAttributes(deps: CloudDeps): Record<string, string> {
  const oidc = deps.config.oidc;
  return {
    "data-sign-in": oidc ? "oidc" : "none",
    "data-social": oidc ? oidc.socialProviders.join(" ") : "",
    "data-public-url": deps.site.publicUrl,
  };
}

function shell(page: string, title: string, tag: string, attributes: Record<string, string> = {}, content?: string): string {
  const extra = Object.entries(attributes)
    .map(([name, value]) => ` ${name}="${escapeHtml(value)}"`)
    .join("");
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHtml(title)} · engine cloud</title>
<link rel="stylesheet" href="/ui/app.css?v=${tag}">
<script type="module" src="/ui/app.js?v=${tag}"></script>
</head>
<body data-page="${escapeHtml(page)}"${extra}>
<main id="app">${content ?? "<noscript>The engine cloud console needs JavaScript.</noscript>"}</main>
</body>
</html>`;
}

/** pageResponse answers a console page's shell (see CONSOLE_PAGES), for the module that routes its path. */
export async function pageResponse(path: string): Promise<Response> {
  const { page, title } = CONSOLE_PAGES[path] as { page: string; title: string };
  return new Response(shell(page, title, (await consoleAssets()).tag), { headers: PAGE_HEADERS });
}

/**
 * messagePageResponse answers a page that says one thing and needs no script: an error the
 * browser must not be sent on from (an assistant's request the console refuses to redirect).
 * Every text is escaped.
 */
export async function messagePageResponse(title: string, paragraphs: string[], status: number): Promise<Response> {
  const content = `<section class="card narrow"><h1>${escapeHtml(title)}</h1>${paragraphs.map((p) => `<p>${escapeHtml(p)}</p>`).join("")}</section>`;
  return new Response(shell("message", title, (await consoleAssets()).tag, {}, content), { status, headers: PAGE_HEADERS });
}

/**
 * consolePages serves the console's pages outside /api: the page shells (see CONSOLE_PAGES),
 * `/` sending the browser to the nodes page, and the bundled script and stylesheet under
 * /ui/ (immutable per build tag, which the shells put in their URLs). The sign-in shell
 * carries what the console offers (signInAttributes), read when the page is asked for.
 */
export function consolePages(deps: CloudDeps) {
  let app = new Elysia({ detail: { hide: true } })
    .get("/", () => new Response(null, { status: 303, headers: { location: "/nodes" } }))
    .get("/ui/app.js", async () => {
      const { js } = await consoleAssets();
      return new Response(js, {
        headers: { "content-type": "text/javascript; charset=utf-8", "cache-control": "public, max-age=31536000, immutable" },
      });
    })
    .get("/ui/app.css", async () => {
      const { css } = await consoleAssets();
      return new Response(css, {
        headers: { "content-type": "text/css; charset=utf-8", "cache-control": "public, max-age=31536000, immutable" },
      });
    });
  for (const [path, { page, title, routedBy }] of Object.entries(CONSOLE_PAGES)) {
    if (routedBy) continue;
    app = app.get(path, async () => {
      const attributes = page === "signin" ? signInAttributes(deps) : {};
      return new Response(shell(page, title, (await consoleAssets()).tag, attributes), { headers: PAGE_HEADERS });
    }) as unknown as typeof app;
  }
  return app;
}
