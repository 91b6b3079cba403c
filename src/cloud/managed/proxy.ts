import { randomId } from "../../lib/crypto";
import { AppError, isAppError } from "../../lib/errors";
import { assertNotCrossSite } from "../auth/csrf";
import { requireSession } from "../auth/guard";
import { type CloudDeps, STATUS_BY_CODE } from "../context";
import type { ManagedService } from "./service";

/** BOX_PATH is `/boxes/<allocation id>` and the rest of the path, forwarded to the box's engine. */
const BOX_PATH = /^\/boxes\/([a-z0-9][a-z0-9_-]{0,63})(\/.*)?$/;
/** TOUCH_EVERY_MS bounds how often a box's activity is written: one write per box per this interval. */
const TOUCH_EVERY_MS = 15_000;
/**
 * DROPPED_REQUEST_HEADERS never reach the box: the console's own credentials (the session is
 * the console's business; the box is reached as its admin over its socket) and hop-by-hop ones.
 */
const DROPPED_REQUEST_HEADERS = ["authorization", "cookie", "host", "connection", "keep-alive", "x-engine-csrf", "transfer-encoding"];

/** BoxProxy forwards `/boxes/<id>/…` to the caller's box. */
export interface BoxProxy {
  matches(request: Request): boolean;
  handle(request: Request): Promise<Response>;
}

/**
 * boxProxy is how a signed-in user reaches their hosted machine through the console
 * (docs/decisions.md 301): `/boxes/<allocation id>/<path>` is the box engine's `/<path>`. The
 * console authenticates the session (cookie or bearer, with the console's CSRF rule for
 * state-changing cookie calls), checks the box is the caller's and running (a request never
 * wakes a box), and forwards over the box's unix socket, where the engine treats the caller as
 * its admin: the box's own token never leaves the host. Each forwarded request counts as the
 * box's activity for idle sleep; the console's own polling and health checks never pass here.
 */
export function boxProxy(deps: CloudDeps, managed: ManagedService): BoxProxy {
  const touched = new Map<string, number>();
  const origin = () => new URL(deps.site.publicUrl).origin;
  const failure = (error: unknown): Response => {
    const known = isAppError(error) ? error : new AppError("internal", "the box could not be reached");
    if (!isAppError(error)) deps.log.error({ err: (error as Error).message }, "box proxy failed");
    const status = STATUS_BY_CODE[known.code as keyof typeof STATUS_BY_CODE] ?? 500;
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (status === 401) headers["www-authenticate"] = `Bearer realm="engine-cloud"`;
    return new Response(JSON.stringify({ error: { code: known.code, message: known.message, request_id: randomId("req") } }), {
      status,
      headers,
    });
  };
  return {
    matches: (request) => BOX_PATH.test(new URL(request.url).pathname),
    async handle(request) {
      const url = new URL(request.url);
      const [, id = "", rest = "/"] = BOX_PATH.exec(url.pathname) ?? [];
      let allocationId: string;
      let endpoint: { unix?: string; url: string };
      try {
        assertNotCrossSite(request, origin());
        const { account } = await requireSession(deps, request);
        const allocation = await managed.boxFor(account, id);
        allocationId = allocation.id;
        endpoint = managed.provider.endpoint(allocation.sandboxId ?? allocation.id);
      } catch (error) {
        return failure(error);
      }
      const headers = new Headers(request.headers);
      for (const name of DROPPED_REQUEST_HEADERS) headers.delete(name);
      headers.set("x-forwarded-prefix", `/boxes/${id}`);
      let answer: Response;
      try {
        answer = await fetch(`${endpoint.url}${rest}${url.search}`, {
          method: request.method,
          headers,
          body: request.method === "GET" || request.method === "HEAD" ? undefined : request.body,
          redirect: "manual",
          unix: endpoint.unix,
          duplex: "half",
        } as RequestInit);
      } catch (error) {
        deps.log.warn({ box: id, err: (error as Error).message }, "box did not answer through the proxy");
        return failure(new AppError("box_unreachable", "the box did not answer; try again in a moment"));
      }
      const now = managed.ctx.clock();
      if (now - (touched.get(allocationId) ?? 0) >= TOUCH_EVERY_MS) {
        touched.set(allocationId, now);
        void managed.store.touch(allocationId, now).catch(() => undefined);
      }
      const out = new Headers(answer.headers);
      // The box's cookies would be set on the console's origin: none pass. Nothing a box answers
      // may run as the console's origin either: no script, no frame, no sniffed type.
      out.delete("set-cookie");
      out.set("content-security-policy", "sandbox; default-src 'none'; frame-ancestors 'none'");
      out.set("x-content-type-options", "nosniff");
      out.delete("content-encoding");
      out.delete("content-length");
      return new Response(answer.body, { status: answer.status, headers: out });
    },
  };
}
