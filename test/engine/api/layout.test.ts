import { expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { basename, dirname, join, relative, resolve, sep } from "node:path";

/**
 * The engine's routes live beside their module (docs/decisions.md 400): every Elysia plugin is
 * in a `routes.ts` or `<resource>-routes.ts`, and the API (src/engine/api) only assembles them.
 * A route file imports its own module, the contract and auth, never the assembly, so no module
 * depends on the API or on the daemon that composes everything.
 */

const ENGINE = resolve(import.meta.dir, "../../../src/engine");

/** IMPORT_SPECIFIER finds the relative specifier of every `import … from`, `export … from` and `import("…")`. */
const IMPORT_SPECIFIER = /(?:\bfrom\s*|\bimport\s*\(?\s*)["'](\.{1,2}\/[^"']+)["']/g;

/** engineFiles lists the engine's TypeScript sources as paths relative to src/engine. */
function engineFiles(dir = ENGINE): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return engineFiles(path);
    return entry.name.endsWith(".ts") ? [relative(ENGINE, path)] : [];
  });
}

/** moduleOf names the module (top folder under src/engine) a path relative to src/engine belongs to. */
const moduleOf = (path: string) => path.split(sep)[0] as string;

test("every Elysia plugin of the engine is in a routes file beside its module, or is the API's assembly", () => {
  const plugins = engineFiles().filter((file) => readFileSync(join(ENGINE, file), "utf8").includes("new Elysia("));
  // The walk must have found the route files, or an empty list would pass.
  expect(plugins).toContain(join("services", "routes.ts"));
  expect(plugins).toContain(join("proxy", "domain-routes.ts"));
  const elsewhere = plugins.filter((file) => file !== join("api", "index.ts") && !/^(.+-)?routes\.ts$/.test(basename(file)));
  expect(elsewhere).toEqual([]);
});

test("no module imports the API's assembly or the daemon", () => {
  const composition = new Set(["api", "daemon"]);
  const edges: string[] = [];
  let seen = 0;
  for (const file of engineFiles()) {
    const from = moduleOf(file);
    for (const match of readFileSync(join(ENGINE, file), "utf8").matchAll(IMPORT_SPECIFIER)) {
      seen += 1;
      const to = moduleOf(relative(ENGINE, resolve(ENGINE, dirname(file), match[1] as string)));
      // The daemon composes everything, the API included; the API may import every module but the daemon.
      if (to !== from && composition.has(to) && from !== "daemon") edges.push(`${file} → ${to}`);
    }
  }
  expect(seen).toBeGreaterThan(100);
  expect(edges).toEqual([]);
});
