/**
 * The OpenAPI document both binaries serve at GET /api/openapi.json.
 *
 * @elysiajs/openapi turns each route's TypeBox schemas into operations, but it writes a request
 * body's media types from the route's named parsers, and our one parser (apiBasics in
 * ./http.ts, which turns a bad body into the contract's 422) is a function: the plugin then
 * writes `content: {}`, and a client generated from the document cannot send a body. This
 * module serves the plugin's document completed from the same route declarations: every body
 * is `application/json` (the only media type apiBasics parses) with the route's own schema;
 * every schema with an `$id` is one shared component referenced by `$ref`; body-less answers
 * (204, 304) carry no content; and the document passes Spectral's `spectral:oas` ruleset
 * (test/lib/openapi.test.ts).
 */
import { toOpenAPISchema, unwrapSchema } from "@elysiajs/openapi/openapi";
import { OptionalKind } from "@sinclair/typebox";
import { type AnyElysia, Elysia } from "elysia";
import type { OpenAPIV3_1 } from "openapi-types";

/** OPENAPI_VERSION is the version both documents declare; their schemas are JSON Schema 2020-12. */
export const OPENAPI_VERSION = "3.1.2";

/** OpenApiDocumentOptions describe the document's fixed parts; paths come from the routes. */
export interface OpenApiDocumentOptions {
  /** specPath is where the document is served. */
  specPath: string;
  info: OpenAPIV3_1.InfoObject;
  /** servers is read when the document is built, so a server that learns its address late lists it. */
  servers: () => OpenAPIV3_1.ServerObject[];
  /** tags describe the operations' tags; a tag an operation uses and this omits is listed by name. */
  tags: OpenAPIV3_1.TagObject[];
  securitySchemes?: Record<string, OpenAPIV3_1.SecuritySchemeObject>;
  security?: OpenAPIV3_1.SecurityRequirementObject[];
  /** paths are operations no route declares (the document's own route, say). */
  paths?: OpenAPIV3_1.PathsObject;
}

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type JsonObject = { [key: string]: Json };
type Operation = JsonObject & { parameters?: JsonObject[]; requestBody?: JsonObject; responses?: Record<string, JsonObject> };

const METHODS = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

/** plain drops what JSON cannot carry (TypeBox's symbol keys among them) and copies the rest. */
function plain(value: unknown): Json {
  return value === undefined ? null : (JSON.parse(JSON.stringify(value)) as Json);
}

/** docPath writes an Elysia route path (`/a/:b`) as an OpenAPI path template (`/a/{b}`). */
function docPath(path: string): string {
  return path.replace(/:([^/]+)/g, "{$1}");
}

/**
 * withRequestBodies gives every operation whose route declares a body that body's schema, as
 * the one media type the API parses. A body is required unless the route declares it
 * `t.Optional` (apiBasics answers 422 when a required one is missing).
 */
function withRequestBodies(paths: Record<string, Record<string, Operation>>, routes: AnyElysia["routes"]): void {
  for (const route of routes) {
    const body = route.hooks?.body;
    if (!body || route.hooks?.detail?.hide) continue;
    const operation = paths[docPath(route.path)]?.[route.method.toLowerCase()];
    if (!operation) continue;
    const schema = plain(unwrapSchema(body, undefined, "input", OPENAPI_VERSION));
    const description = operation.requestBody?.description;
    operation.requestBody = {
      ...(typeof description === "string" ? { description } : {}),
      required: (body as Record<symbol, unknown>)[OptionalKind] !== "Optional",
      content: { "application/json": { schema } },
    };
  }
}

/**
 * withoutBodyContent drops the content the plugin writes for a void answer (a schema where a
 * media-type map belongs): a 204 or a 304 has no body, and the document must say so.
 */
function withoutBodyContent(operation: Operation): void {
  for (const [status, response] of Object.entries(operation.responses ?? {})) {
    const content = response.content;
    const mediaTyped =
      content && typeof content === "object" && !Array.isArray(content) && Object.keys(content).every((k) => k.includes("/"));
    if (status === "204" || status === "304" || (content !== undefined && !mediaTyped)) {
      if (content && typeof content === "object" && !Array.isArray(content) && typeof content.description === "string") {
        response.description = content.description;
      }
      delete response.content;
    }
  }
}

/**
 * withSharedParameterNames renames the path parameters of paths that differ only in their
 * parameters' names (Elysia needs `DELETE /api/services/:name` beside `/:name/domains/:domain`
 * while GET uses `:ident`): OpenAPI forbids equivalent paths, so the first name seen is used.
 */
function withSharedParameterNames(paths: Record<string, Record<string, Operation>>): Record<string, Record<string, Operation>> {
  const firstOfShape = new Map<string, string>();
  const out: Record<string, Record<string, Operation>> = {};
  for (const [path, item] of Object.entries(paths)) {
    const shape = path.replace(/\{[^}]+\}/g, "{}");
    const first = firstOfShape.get(shape);
    if (first === undefined || first === path) {
      firstOfShape.set(shape, path);
      out[path] = { ...out[path], ...item };
      continue;
    }
    const names = [...path.matchAll(/\{([^}]+)\}/g)].map((m) => m[1] ?? "");
    const firstNames = [...first.matchAll(/\{([^}]+)\}/g)].map((m) => m[1] ?? "");
    for (const operation of Object.values(item)) {
      for (const parameter of operation.parameters ?? []) {
        const index = parameter.in === "path" ? names.indexOf(parameter.name as string) : -1;
        if (index !== -1) parameter.name = firstNames[index] ?? (parameter.name as string);
      }
    }
    out[first] = { ...out[first], ...item };
  }
  return out;
}

/**
 * SharedSchemas hoists every schema that has an `$id` into `components.schemas` under that id
 * and leaves a `$ref` in its place, so each record is described once and a generated client
 * gets one type per record. Two different schemas under one id are a bug in src/contract.
 */
class SharedSchemas {
  readonly components: Record<string, Json> = {};
  readonly #seen = new Map<string, string>();

  hoist(value: Json): Json {
    if (Array.isArray(value)) return value.map((item) => this.hoist(item));
    if (value === null || typeof value !== "object") return value;
    const { $id, ...rest } = value;
    const inner: JsonObject = {};
    for (const [key, child] of Object.entries(rest)) inner[key] = this.hoist(child as Json);
    if (typeof $id !== "string") return $id === undefined ? inner : { $id, ...inner };
    const text = JSON.stringify(inner);
    const known = this.#seen.get($id);
    if (known !== undefined && known !== text) throw new Error(`two different schemas share the $id ${$id}`);
    this.#seen.set($id, text);
    this.components[$id] = inner;
    return { $ref: `#/components/schemas/${encodeURIComponent($id)}` };
  }
}

/**
 * globalRoutes lists every route of the app a plugin is mounted in; Elysia keeps the method
 * protected, and @elysiajs/openapi reads the same list.
 */
function globalRoutes(app: AnyElysia): AnyElysia["routes"] {
  return (app as unknown as { getGlobalRoutes(): AnyElysia["routes"] }).getGlobalRoutes();
}

/** buildOpenApiDocument builds the document from an app's routes (the plugin's own tree is the app's). */
export function buildOpenApiDocument(app: AnyElysia, options: OpenApiDocumentOptions): OpenAPIV3_1.Document {
  const generated = toOpenAPISchema(app, undefined, undefined, undefined, OPENAPI_VERSION);
  const paths = plain({ ...generated.paths, ...options.paths }) as Record<string, Record<string, Operation>>;
  withRequestBodies(paths, globalRoutes(app));
  const unified = withSharedParameterNames(paths);
  const used = new Set<string>();
  for (const item of Object.values(unified)) {
    for (const [method, operation] of Object.entries(item)) {
      if (!METHODS.includes(method)) continue;
      withoutBodyContent(operation);
      for (const tag of (operation.tags as string[] | undefined) ?? []) used.add(tag);
    }
  }
  const shared = new SharedSchemas();
  const hoisted = shared.hoist(unified as unknown as Json) as unknown as OpenAPIV3_1.PathsObject;
  const described = new Set(options.tags.map((tag) => tag.name));
  const tags = [
    ...options.tags.filter((tag) => used.has(tag.name)),
    ...[...used].filter((name) => !described.has(name)).map((name) => ({ name })),
  ];
  return {
    openapi: OPENAPI_VERSION,
    info: options.info,
    servers: options.servers(),
    tags,
    ...(options.security ? { security: options.security } : {}),
    paths: hoisted,
    components: {
      ...(options.securitySchemes ? { securitySchemes: options.securitySchemes } : {}),
      schemas: shared.components as Record<string, OpenAPIV3_1.SchemaObject>,
    },
  };
}

/**
 * openapiDocument is the plugin that serves the document. It is built on the first request,
 * when every route is declared, and again only if routes were added since.
 */
export function openapiDocument(options: OpenApiDocumentOptions) {
  const plugin = new Elysia({ name: "openapi-document" });
  let cached: { routes: number; document: OpenAPIV3_1.Document } | undefined;
  return plugin.get(
    options.specPath,
    () => {
      const count = globalRoutes(plugin).length;
      if (cached?.routes !== count) cached = { routes: count, document: buildOpenApiDocument(plugin, options) };
      return cached.document;
    },
    { detail: { hide: true } },
  );
}
