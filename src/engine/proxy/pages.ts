import type { LocalAnswer } from "./http1";

/** escapeHtml makes text safe inside an HTML page. */
function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c] ?? c);
}

/**
 * errorPage is the proxy's own answer when it cannot forward: a small HTML page a person can
 * read (what is wrong, what to do) for browsers, whose Accept names text/html, and plain text
 * for everything else.
 */
export function errorPage(
  accept: string | null,
  status: number,
  title: string,
  detail: string,
  headers: Record<string, string> = {},
): LocalAnswer {
  const wantsHtml = (accept ?? "").includes("text/html");
  const body = wantsHtml
    ? `<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">` +
      `<title>${status} ${escapeHtml(title)}</title><style>body{font:16px system-ui,sans-serif;max-width:40rem;margin:4rem auto;padding:0 1rem;color:#222}` +
      `h1{font-size:1.4rem}code{background:#eee;padding:0 .2rem}</style></head><body><h1>${status} ${escapeHtml(title)}</h1>` +
      `<p>${escapeHtml(detail)}</p><p><small>engine proxy</small></p></body></html>`
    : `${status} ${title}: ${detail}\n`;
  return {
    status,
    headers: {
      "content-type": wantsHtml ? "text/html; charset=utf-8" : "text/plain; charset=utf-8",
      "cache-control": "no-store",
      ...headers,
    },
    body,
  };
}
