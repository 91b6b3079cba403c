import { join } from "node:path";

/** ConsoleAssets are the console pages' script and stylesheet, and a tag naming this build of them. */
export interface ConsoleAssets {
  js: string;
  css: string;
  tag: string;
}

/** __ENGINE_CLOUD_UI__ is set by build.ts in the compiled binary: the assets as JSON, bundled at build time. */
declare const __ENGINE_CLOUD_UI__: string | undefined;

const CLIENT_DIR = join(import.meta.dir, "client");

/**
 * buildConsoleAssets bundles the browser script (client/app.ts) with Bun.build for browsers,
 * minified, and reads the stylesheet. build.ts calls it to embed the result in the binary; a
 * console run from source calls it once, at the first page request.
 */
export async function buildConsoleAssets(): Promise<ConsoleAssets> {
  const result = await Bun.build({ entrypoints: [join(CLIENT_DIR, "app.ts")], target: "browser", minify: true, format: "esm" });
  if (!result.success || !result.outputs[0]) {
    throw new Error(`bundling the console pages failed: ${result.logs.map((log) => String(log)).join("\n")}`);
  }
  const js = await result.outputs[0].text();
  const css = await Bun.file(join(CLIENT_DIR, "style.css")).text();
  return { js, css, tag: Bun.hash(js + css).toString(36) };
}

let assets: Promise<ConsoleAssets> | undefined;

/** consoleAssets returns the embedded assets in the compiled binary, else bundles from source once. */
export function consoleAssets(): Promise<ConsoleAssets> {
  if (typeof __ENGINE_CLOUD_UI__ === "string") assets ??= Promise.resolve(JSON.parse(__ENGINE_CLOUD_UI__) as ConsoleAssets);
  assets ??= buildConsoleAssets().catch((error) => {
    assets = undefined; // a failed bundle is retried on the next request
    throw error;
  });
  return assets;
}
