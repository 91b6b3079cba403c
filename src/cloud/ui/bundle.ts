import { join } from "node:path";
import { type BrowserAssets, bundleBrowserAssets, lazyBrowserAssets } from "../../lib/browser-assets";

/** ConsoleAssets are the console pages' script and stylesheet, and a tag naming this build of them. */
export type ConsoleAssets = BrowserAssets;

/** __ENGINE_CLOUD_UI__ is set by build.ts in the compiled binary: the assets as JSON, bundled at build time. */
declare const __ENGINE_CLOUD_UI__: string | undefined;

const CLIENT_DIR = join(import.meta.dir, "client");

/** buildConsoleAssets bundles the console's browser script (client/app.ts) and reads its stylesheet. */
export function buildConsoleAssets(): Promise<ConsoleAssets> {
  return bundleBrowserAssets(join(CLIENT_DIR, "app.ts"), join(CLIENT_DIR, "style.css"), "the console pages");
}

/** consoleAssets returns the embedded assets in the compiled binary, else bundles from source once. */
export const consoleAssets = lazyBrowserAssets(
  typeof __ENGINE_CLOUD_UI__ === "string" ? __ENGINE_CLOUD_UI__ : undefined,
  buildConsoleAssets,
);
