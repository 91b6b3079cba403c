import { describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join, relative, resolve, sep } from "node:path";

/**
 * The console's modules form no import cycle (issue 16, decision 410). A module is a folder (or
 * a top-level file) directly under src/cloud, and module A depends on module B when a file of A
 * imports a file of B, type-only imports included: a type import is still an edge a reader has
 * to follow. The composition root (src/cloud/server) imports every module and no module imports
 * it back. The one edge left out is src/cloud/context.ts naming the stores' types in
 * `CloudDeps`: it may import nothing else from a module (checked below), and the file graph,
 * which keeps it, must have no cycle either.
 */

const CLOUD = resolve(import.meta.dir, "../../src/cloud");
const CONTEXT = "context.ts";

/**
 * IMPORT finds every `import … from`, `export … from`, bare `import "…"` and `import("…")` of a
 * relative path; group 1 is `type` for an `import type` or `export type` statement.
 */
const IMPORT = /\b(?:import|export)(?:\s+(type)\b)?[^;"'`]*?\bfrom\s*["'](\.{1,2}\/[^"']+)["']|\bimport\s*\(?\s*["'](\.{1,2}\/[^"']+)["']/g;

/** Import is one relative import of a file: the file it resolves to, and whether it is type-only. */
interface Import {
  target: string;
  typeOnly: boolean;
}

/** sourceFiles lists the TypeScript files under a directory, recursively. */
function sourceFiles(dir: string): string[] {
  const files: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) files.push(...sourceFiles(path));
    else if (entry.isFile() && path.endsWith(".ts")) files.push(path);
  }
  return files;
}

/** resolveSpecifier finds the file a relative specifier names: `x.ts`, `x/index.ts`, or `x` itself. */
function resolveSpecifier(from: string, specifier: string): string {
  const path = resolve(dirname(from), specifier);
  for (const candidate of [`${path}.ts`, join(path, "index.ts")]) if (existsSync(candidate)) return candidate;
  return path;
}

/** importsOf lists a file's relative imports. */
function importsOf(file: string): Import[] {
  return [...readFileSync(file, "utf8").matchAll(IMPORT)].map((match) => ({
    target: resolveSpecifier(file, (match[2] ?? match[3]) as string),
    typeOnly: match[1] === "type",
  }));
}

/** moduleOf names the module a path under `root` belongs to: its first segment, without `.ts` for a top-level file; null outside `root`. */
function moduleOf(root: string, path: string): string | null {
  const inside = relative(root, path);
  if (inside.startsWith("..") || inside === "") return null;
  return (inside.split(sep)[0] as string).replace(/\.ts$/, "");
}

/**
 * moduleGraph maps each module under `root` to the modules its files import, with one importing
 * file per edge as evidence. The context's type-only imports are left out (see above).
 */
export function moduleGraph(root: string): Map<string, Map<string, string>> {
  const graph = new Map<string, Map<string, string>>();
  for (const file of sourceFiles(root)) {
    const from = moduleOf(root, file) as string;
    const edges = graph.get(from) ?? new Map<string, string>();
    graph.set(from, edges);
    const isContext = relative(root, file) === CONTEXT;
    for (const { target, typeOnly } of importsOf(file)) {
      if (isContext && typeOnly) continue;
      const to = moduleOf(root, target);
      if (to !== null && to !== from && !edges.has(to)) edges.set(to, relative(root, file));
    }
  }
  return graph;
}

/** fileGraph maps each file under `root` to the files under `root` it imports, type-only imports included. */
function fileGraph(root: string): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const file of sourceFiles(root)) {
    const targets = importsOf(file)
      .map(({ target }) => target)
      .filter((target) => moduleOf(root, target) !== null);
    graph.set(relative(root, file), [...new Set(targets.map((target) => relative(root, target)))]);
  }
  return graph;
}

/** cyclesOf returns the strongly connected components of more than one node (Tarjan), each sorted, so every cycle shows as the set of nodes it ties together. */
export function cyclesOf(graph: Map<string, Iterable<string>>): string[][] {
  let next = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const components: string[][] = [];
  const visit = (node: string) => {
    index.set(node, next);
    low.set(node, next);
    next += 1;
    stack.push(node);
    onStack.add(node);
    for (const peer of graph.get(node) ?? []) {
      if (!index.has(peer)) {
        visit(peer);
        low.set(node, Math.min(low.get(node) as number, low.get(peer) as number));
      } else if (onStack.has(peer)) {
        low.set(node, Math.min(low.get(node) as number, index.get(peer) as number));
      }
    }
    if (low.get(node) === index.get(node)) {
      const component: string[] = [];
      let member: string;
      do {
        member = stack.pop() as string;
        onStack.delete(member);
        component.push(member);
      } while (member !== node);
      if (component.length > 1) components.push(component.sort());
    }
  };
  for (const node of [...graph.keys()].sort()) if (!index.has(node)) visit(node);
  return components;
}

describe("cyclesOf", () => {
  test.each([
    ["no edges", { a: [], b: [] }, []],
    ["a chain", { a: ["b"], b: ["c"], c: [] }, []],
    ["two modules importing each other", { a: ["b"], b: ["a"] }, [["a", "b"]]],
    ["a root importing modules that import it back", { root: ["a", "b"], a: ["root"], b: ["c"], c: [] }, [["a", "root"]]],
    ["a long loop", { a: ["b"], b: ["c"], c: ["d"], d: ["a"], e: ["a"] }, [["a", "b", "c", "d"]]],
  ] as const)("%s", (_label, edges, expected) => {
    const graph = new Map(Object.entries(edges).map(([node, peers]) => [node, [...peers] as string[]]));
    expect(cyclesOf(graph)).toEqual(expected.map((component) => [...component]));
  });
});

test("no import cycle among the console's modules under src/cloud", () => {
  const graph = moduleGraph(CLOUD);
  // The walk must have seen the console's modules and their edges, or an empty graph would pass.
  expect(graph.get("server")?.has("approvals")).toBe(true);
  expect(graph.get("approvals")?.has("accounts")).toBe(true);
  const cycles = cyclesOf(new Map([...graph].map(([node, edges]) => [node, [...edges.keys()]])));
  const described = cycles.map((members) =>
    members
      .flatMap((from) =>
        [...(graph.get(from) ?? [])].filter(([to]) => members.includes(to)).map(([to, file]) => `${from} → ${to} (${file})`),
      )
      .join("\n"),
  );
  expect(described).toEqual([]);
});

test("the context imports nothing from a module but types", () => {
  const file = join(CLOUD, CONTEXT);
  const fromModules = importsOf(file).filter(({ target }) => moduleOf(CLOUD, target) !== null);
  expect(fromModules.length).toBeGreaterThan(0);
  expect(fromModules.filter(({ typeOnly }) => !typeOnly).map(({ target }) => relative(CLOUD, target))).toEqual([]);
});

test("no import cycle among the files under src/cloud, type-only imports included", () => {
  const graph = fileGraph(CLOUD);
  expect(graph.get(CONTEXT)?.length).toBeGreaterThan(0);
  expect(cyclesOf(graph)).toEqual([]);
});
