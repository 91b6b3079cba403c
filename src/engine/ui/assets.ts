import { join } from "node:path";
import { type BrowserAssets, bundleBrowserAssets, lazyBrowserAssets } from "../../lib/browser-assets";

/** UiAssets are the web UI's three files: the page shell, its script and its stylesheet. */
export interface UiAssets {
  html: string;
  js: string;
  css: string;
}

// build.ts defines this as the bundled script and stylesheet (JSON), so the compiled binary
// carries the UI; from source they are bundled on first use.
declare const __ENGINE_UI__: string | undefined;

/** uiSourceDir is where the UI's sources live in the repository. */
export const uiSourceDir = import.meta.dir;

/**
 * pageShell is the HTML every UI address answers with. It carries no data and no inline
 * script, so the Content-Security-Policy can forbid both; the script renders the pages.
 */
export function pageShell(): string {
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>engine</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/ui/app.css">
<script type="module" src="/ui/app.js"></script>
</head>
<body>
<a class="skip" href="#main">Skip to content</a>
<header class="top" role="banner"><a class="brand" href="#/">engine</a><nav id="nav" aria-label="Main"></nav></header>
<main id="main" tabindex="-1"><p class="muted">Loading…</p></main>
<div id="live" class="visually-hidden" aria-live="polite"></div>
</body>
</html>
`;
}

/**
 * bundleUiAssets bundles src/engine/ui/app.ts for the browser (uPlot with it) and reads uPlot's
 * stylesheet and app.css into one (build.ts, and the first request from source): nothing is
 * loaded from elsewhere (docs/decisions.md 338).
 */
export function bundleUiAssets(): Promise<BrowserAssets> {
  const uplotCss = Bun.resolveSync("uplot/dist/uPlot.min.css", uiSourceDir);
  return bundleBrowserAssets(join(uiSourceDir, "app.ts"), [uplotCss, join(uiSourceDir, "app.css")], "the web UI");
}

const loadAssets = lazyBrowserAssets(typeof __ENGINE_UI__ === "string" ? __ENGINE_UI__ : undefined, bundleUiAssets);

/** uiAssets returns the UI's files: embedded in the binary, else bundled once from the sources. */
export async function uiAssets(): Promise<UiAssets> {
  const { js, css } = await loadAssets();
  return { html: pageShell(), js, css };
}
