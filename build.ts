/**
 * build.ts compiles the two programs into self-contained executables with
 * `bun build --compile`, so each runs with no node_modules beside it:
 *
 * - dist/engine: the runtime, SQLite, the CLI, the API, the web UI, the app templates, the
 *   process shim and the proxy processes' own bundle inside;
 * - dist/engine-cloud: the cloud console (cli/cloud.ts), compiled the same way but without
 *   the engine's templates and shim, which it never uses; its pages' script and stylesheet
 *   (src/cloud/ui/client) are bundled here and embedded.
 *
 * Both carry their modules as bytecode as well as source (decision 478).
 *
 * Usage: bun build.ts [--outfile dist/engine] [--cloud-outfile dist/engine-cloud] [--only engine|engine-cloud]
 *                     [--version X.Y.Z]
 *
 * --version stamps another version than package.json's into the binaries (`engine version`,
 * /api/health): the upgrade tests build two of them.
 *
 * Without --cloud-outfile the console is written beside the engine, as `engine-cloud`.
 */
import { mkdirSync, readFileSync, rmSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { buildConsoleAssets } from "./src/cloud/ui";
import { compileShim, shimSource } from "./src/engine/supervisor";
import { readTemplateDir } from "./src/engine/templates";
import { bundleUiAssets } from "./src/engine/ui";

const root = import.meta.dir;
const args = process.argv.slice(2);
const flag = (name: string): string | undefined => {
  const index = args.indexOf(name);
  return index >= 0 ? args[index + 1] : undefined;
};
const outfile = resolve(flag("--outfile") ?? join(root, "dist", "engine"));
const cloudOutfile = resolve(flag("--cloud-outfile") ?? join(dirname(outfile), "engine-cloud"));
const only = flag("--only");
const versionOverride = flag("--version");
if (versionOverride !== undefined && !/^\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?$/.test(versionOverride)) {
  console.error(`--version takes a version such as 1.2.3 or 1.2.3-rc.1 (got ${JSON.stringify(versionOverride)})`);
  process.exit(2);
}
if (only !== undefined && only !== "engine" && only !== "engine-cloud") {
  console.error(`--only takes engine or engine-cloud (got ${JSON.stringify(only)})`);
  process.exit(2);
}

/**
 * PRODUCTION is what every bundle here is built with: production mode (the servers also say
 * `development: false`, but nothing bundled should take a development path: Bun's error page
 * shows cwd, stacks and source), and the version asked for.
 */
const PRODUCTION: Record<string, string> = {
  "process.env.NODE_ENV": JSON.stringify("production"),
  ...(versionOverride ? { __ENGINE_VERSION__: JSON.stringify(versionOverride) } : {}),
};

/** succeeded fails the build with Bun's messages when a bundle did not build. */
function succeeded(result: Awaited<ReturnType<typeof Bun.build>>): void {
  if (result.success && result.outputs.length > 0) return;
  for (const log of result.logs) console.error(log);
  process.exit(1);
}

/** compile bundles one entry point into one executable, failing the build with Bun's messages. */
async function compile(entry: string, target: string, define: Record<string, string>): Promise<void> {
  mkdirSync(dirname(target), { recursive: true });
  const result = await Bun.build({
    entrypoints: [join(root, "cli", entry)],
    // A standalone executable reads bunfig.toml (its preload scripts run first) and .env files
    // from the directory it is started in, unless told not to: `sudo engine serve` in a
    // directory someone else wrote would run their code as root (decision 488).
    compile: { outfile: target, autoloadBunfig: false, autoloadDotenv: false, autoloadTsconfig: false, autoloadPackageJson: false },
    // The modules travel as JSC bytecode, not only as source: a start (and a restart's
    // successor, before and after its switch) runs its code without parsing and compiling
    // it first (decision 478).
    bytecode: true,
    format: "esm",
    minify: true,
    sourcemap: "linked",
    define: { ...PRODUCTION, ...define },
  });
  succeeded(result);
}

if (only !== "engine-cloud") {
  mkdirSync(dirname(outfile), { recursive: true });
  // Templates travel inside the binary; file names keep only their base name.
  const templates = readTemplateDir(join(root, "templates")).map((source) => ({
    file: `templates/${source.file.split("/").at(-1)}`,
    text: source.text,
  }));

  // The process shim travels inside the binary too, compiled statically where the libc allows.
  const shimFile = join(dirname(outfile), `.engine-shim-${process.pid}`);
  compileShim(shimSource() ?? "", shimFile);
  const shim = readFileSync(shimFile).toString("base64");
  rmSync(shimFile, { force: true });

  // The web UI travels inside the binary too: its script bundled for the browser, and its stylesheet.
  const ui = await bundleUiAssets();

  // So does the proxy processes' code, as a bundle of its own: a proxy process runs it alone,
  // without the rest of the binary's modules (src/engine/proxy/processes.ts, decision 487).
  const proxyBundle = await Bun.build({
    entrypoints: [join(root, "src", "engine", "proxy", "main.ts")],
    target: "bun",
    format: "esm",
    minify: true,
    define: { ...PRODUCTION, __ENGINE_COMPILED__: "true" },
  });
  succeeded(proxyBundle);
  const proxy = await (proxyBundle.outputs[0] as Blob).text();

  const started = performance.now();
  await compile("engine.ts", outfile, {
    __ENGINE_EMBEDDED_TEMPLATES__: JSON.stringify(JSON.stringify(templates)),
    __ENGINE_EMBEDDED_SHIM__: JSON.stringify(shim),
    __ENGINE_EMBEDDED_PROXY__: JSON.stringify(proxy),
    __ENGINE_UI__: JSON.stringify(JSON.stringify(ui)),
    __ENGINE_COMPILED__: "true",
  });
  console.log(`built ${outfile} with ${templates.length} templates in ${Math.round(performance.now() - started)} ms`);
}

if (only !== "engine") {
  const started = performance.now();
  // The console pages' script and stylesheet are bundled now and travel inside the binary.
  const consoleUi = await buildConsoleAssets();
  await compile("cloud.ts", cloudOutfile, { __ENGINE_COMPILED__: "true", __ENGINE_CLOUD_UI__: JSON.stringify(JSON.stringify(consoleUi)) });
  console.log(`built ${cloudOutfile} in ${Math.round(performance.now() - started)} ms`);
}
