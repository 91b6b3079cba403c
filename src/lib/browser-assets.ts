/** BrowserAssets are a web page's bundled script and stylesheet, and a tag naming this build of them. */
export interface BrowserAssets {
  js: string;
  css: string;
  tag: string;
}

/**
 * bundleBrowserAssets bundles a browser script with Bun.build (minified ESM) and reads its
 * stylesheets. build.ts calls it to embed the result in a binary; a server run from source
 * calls it once, at the first page request. `what` names the page set in the error.
 */
export async function bundleBrowserAssets(entry: string, stylesheet: string | string[], what: string): Promise<BrowserAssets> {
  const result = await Bun.build({ entrypoints: [entry], target: "browser", minify: true, format: "esm" });
  if (!result.success || !result.outputs[0]) {
    throw new Error(`bundling ${what} failed: ${result.logs.map((log) => String(log)).join("; ")}`);
  }
  const js = await result.outputs[0].text();
  // Several stylesheets (a bundled library's, then the page's own) become one file, in order.
  const css = (await Promise.all([stylesheet].flat().map((file) => Bun.file(file).text()))).join("\n");
  return { js, css, tag: Bun.hash(js + css).toString(36) };
}

/**
 * lazyBrowserAssets returns a loader for a page set's assets: the JSON build.ts embedded in
 * the compiled binary when there is one, else `bundle()` run once from source (a failed bundle
 * is tried again on the next request).
 */
export function lazyBrowserAssets(embedded: string | undefined, bundle: () => Promise<BrowserAssets>): () => Promise<BrowserAssets> {
  let assets: Promise<BrowserAssets> | undefined;
  return () => {
    if (typeof embedded === "string") assets ??= Promise.resolve(JSON.parse(embedded) as BrowserAssets);
    assets ??= bundle().catch((error) => {
      assets = undefined;
      throw error;
    });
    return assets;
  };
}
