/**
 * build.ts compiles the engine into one self-contained executable, dist/engine, with
 * `bun build --compile`: the runtime, SQLite, the CLI, the API, the app templates and the
 * process shim inside,
 * so it runs with no node_modules beside it.
 *
 * Usage: bun build.ts [--outfile dist/engine]
 */
import { mkdirSync, readFileSync, rmSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { compileShim, shimSource } from "./src/engine/supervisor";
import { readTemplateDir } from "./src/engine/templates";

const root = import.meta.dir;
const args = process.argv.slice(2);
const outIndex = args.indexOf("--outfile");
const outArg = outIndex >= 0 ? args[outIndex + 1] : undefined;
const outfile = resolve(outArg ?? join(root, "dist", "engine"));
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

const started = performance.now();
const result = await Bun.build({
  entrypoints: [join(root, "cli", "engine.ts")],
  compile: { outfile },
  minify: true,
  sourcemap: "linked",
  define: {
    __ENGINE_EMBEDDED_TEMPLATES__: JSON.stringify(JSON.stringify(templates)),
    __ENGINE_EMBEDDED_SHIM__: JSON.stringify(shim),
    __ENGINE_COMPILED__: "true",
  },
});
if (!result.success) {
  for (const log of result.logs) console.error(log);
  process.exit(1);
}
console.log(`built ${outfile} with ${templates.length} templates in ${Math.round(performance.now() - started)} ms`);
