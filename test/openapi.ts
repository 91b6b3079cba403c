import Ajv2020, { type ErrorObject, type ValidateFunction } from "ajv/dist/2020";
import addFormats from "ajv-formats";

/** OpenApiOperation is the part of an operation the tests read. */
export interface OpenApiOperation {
  operationId?: string;
  parameters?: { name: string; in: string; required?: boolean; schema?: Record<string, unknown> }[];
  requestBody?: { required?: boolean; content: Record<string, { schema?: Record<string, unknown> }> };
  responses: Record<string, { description: string; content?: Record<string, { schema?: Record<string, unknown> }> }>;
  security?: unknown[];
}

/** OpenApiDocument is an OpenAPI 3.1 document as both binaries serve it. */
export interface OpenApiDocument {
  openapi: string;
  info: Record<string, unknown>;
  paths: Record<string, Record<string, OpenApiOperation>>;
  components: { schemas: Record<string, Record<string, unknown>> };
}

export const METHODS = ["get", "put", "post", "delete", "patch"];

/** operationsOf lists a document's operations as [METHOD, path template, operation]. */
export function operationsOf(document: OpenApiDocument): [string, string, OpenApiOperation][] {
  return Object.entries(document.paths).flatMap(([path, item]) =>
    Object.entries(item)
      .filter(([method]) => METHODS.includes(method))
      .map(([method, operation]): [string, string, OpenApiOperation] => [method.toUpperCase(), path, operation]),
  );
}

/** pointer writes a JSON pointer as a URI fragment (RFC 6901 §6). */
function pointer(tokens: string[]): string {
  return `#/${tokens.map((token) => encodeURIComponent(token.replaceAll("~", "~0").replaceAll("/", "~1"))).join("/")}`;
}

/**
 * DocumentValidator checks values against an OpenAPI 3.1 document with Ajv's JSON Schema
 * 2020-12 validator (the dialect OpenAPI 3.1 schemas use), not with TypeBox, which the
 * servers validate with: an independent reading of the document. `$ref`s resolve inside
 * the document itself.
 */
export class DocumentValidator {
  readonly document: OpenApiDocument;
  readonly #ajv: Ajv2020;
  readonly #compiled = new Map<string, ValidateFunction>();

  constructor(document: OpenApiDocument, name: string) {
    this.document = document;
    // strict: an unknown keyword or format in the document is an error, not silently ignored.
    this.#ajv = new Ajv2020({ strict: true, strictTypes: false, allErrors: true, validateFormats: true });
    addFormats(this.#ajv);
    this.#ajv.addVocabulary(["openapi", "info", "servers", "tags", "paths", "components", "security", "webhooks", "externalDocs"]);
    this.#ajv.addSchema(document as unknown as Record<string, unknown>, name);
    this.name = name;
  }
  readonly name: string;

  operation(method: string, path: string): OpenApiOperation {
    const operation = this.document.paths[path]?.[method.toLowerCase()];
    if (!operation) throw new Error(`${this.name} has no operation ${method} ${path}`);
    return operation;
  }

  #validator(tokens: string[]): ValidateFunction {
    const ref = `${this.name}${pointer(tokens)}`;
    let validate = this.#compiled.get(ref);
    if (!validate) {
      validate = this.#ajv.compile({ $ref: ref });
      this.#compiled.set(ref, validate);
    }
    return validate;
  }

  /** requestBody returns the errors of `body` against the operation's JSON body schema (null when valid). */
  requestBody(method: string, path: string, body: unknown): ErrorObject[] | null {
    const content = this.operation(method, path).requestBody?.content["application/json"];
    if (!content?.schema) throw new Error(`${method} ${path} documents no JSON request body`);
    const validate = this.#validator(["paths", path, method.toLowerCase(), "requestBody", "content", "application/json", "schema"]);
    return validate(body) ? null : (validate.errors ?? []);
  }

  /** response returns the errors of an answer against the operation's schema for its status (null when valid). */
  response(method: string, path: string, status: number, body: unknown): ErrorObject[] | null {
    const response = this.operation(method, path).responses[String(status)];
    if (!response) return [{ message: `status ${status} is not documented` } as ErrorObject];
    if (!response.content)
      return body === undefined || body === null || body === "" ? null : [{ message: "documented without a body" } as ErrorObject];
    if (!response.content["application/json"]?.schema) return [{ message: "no JSON schema for this status" } as ErrorObject];
    const validate = this.#validator([
      "paths",
      path,
      method.toLowerCase(),
      "responses",
      String(status),
      "content",
      "application/json",
      "schema",
    ]);
    return validate(body) ? null : (validate.errors ?? []);
  }
}
