import { readFileSync } from "node:fs";
import { join } from "node:path";

/** UiAssets are the web UI's three files: the page shell, its script and its stylesheet. */
export interface UiAssets {
  html: string;
  js: string;
  css: string;
}

// build.ts defines these as the bundled script and the stylesheet, so the compiled binary
// carries the UI; from source they are built on first use.
declare const __ENGINE_UI_JS__: string | undefined;
declare const __ENGINE_UI_CSS__: string | undefined;

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

/** bundleUiScript bundles src/engine/ui/app.ts for the browser (build.ts and the first request from source). */
export async function bundleUiScript(): Promise<string> {
  const result = await Bun.build({ entrypoints: [join(uiSourceDir, "app.ts")], target: "browser", minify: true, format: "esm" });
  if (!result.success || !result.outputs[0]) {
    throw new Error(`the web UI failed to bundle: ${result.logs.map((log) => String(log)).join("; ")}`);
  }
  return result.outputs[0].text();
}

/** readUiStylesheet reads the UI's stylesheet from the sources. */
export function readUiStylesheet(): string {
  return readFileSync(join(uiSourceDir, "app.css"), "utf8");
}

let loading: Promise<UiAssets> | undefined;

/** uiAssets returns the UI's files: embedded in the binary, else bundled once from the sources. */
export function uiAssets(): Promise<UiAssets> {
  loading ??= (async () => {
    if (typeof __ENGINE_UI_JS__ === "string" && typeof __ENGINE_UI_CSS__ === "string") {
      return { html: pageShell(), js: __ENGINE_UI_JS__, css: __ENGINE_UI_CSS__ };
    }
    return { html: pageShell(), js: await bundleUiScript(), css: readUiStylesheet() };
  })();
  loading.catch(() => {
    loading = undefined;
  });
  return loading;
}
