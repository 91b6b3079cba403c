import { TypeCompiler } from "@sinclair/typebox/compiler";
import { Elysia, t } from "elysia";
import {
  AUTHED,
  Diagnosis,
  errorResponses,
  LogLine,
  LogsQuery,
  ServiceAction,
  ServiceDeploy,
  ServiceIdentParams,
  ServicePatch,
  ServiceReadQuery,
  ServiceRecord,
  ServiceStatsRecord,
} from "../../contract/engine";
import type { Logger } from "../../lib/logger";
import { assertServiceInScope, type RequestContext } from "../auth";
import type { ServiceDirectory } from "./index";
import { formatCursor, type LogCursor, type LogRecord, parseCursor } from "./logs";

/** ServiceRouteDeps are what the service routes need: the coordinator, the log, and the signal that ends event streams. */
export interface ServiceRouteDeps {
  log: Logger;
  services: ServiceDirectory;
  /** closing aborts when the daemon hands over to a successor: event streams end, and their clients reconnect there. */
  closing?: AbortSignal;
}

/** DEFAULT_LOG_TAIL is how many lines a logs request returns without `tail`. */
const DEFAULT_LOG_TAIL = 100;
/** SSE_HEARTBEAT_MS keeps idle log streams alive through proxies that close silent connections. */
const SSE_HEARTBEAT_MS = 15_000;
/** SSE_RETRY_MS is how soon a browser's EventSource reconnects after a stream ends (a daemon restart ends it). */
const SSE_RETRY_MS = 500;

/** WAIT_RECHECK_MS is how often a blocking read looks at its record without a change notice (a restart leaving the window). */
const WAIT_RECHECK_MS = 1000;

/** recordShape checks each listed record against the schema the list answers with. */
const recordShape = TypeCompiler.Compile(ServiceRecord);

/**
 * listableRecords keeps the records that fit the contract and reports the rest: one row stored
 * by an older engine that let a malformed value in (`"env":[["x"]]`, issue 13) must not turn the
 * whole list, the UI's dashboard included, into a 500 for every caller. The row is left out of
 * the list, logged with its name and what is wrong, and counted in `X-Engine-Unlisted`; it can
 * still be deleted by name (decision 143).
 */
function listableRecords(
  records: ServiceRecord[],
  deps: ServiceRouteDeps,
  set: { headers: Record<string, string | number> },
): ServiceRecord[] {
  const listable: ServiceRecord[] = [];
  for (const record of records) {
    if (recordShape.Check(record)) {
      listable.push(record);
      continue;
    }
    const problems = [...recordShape.Errors(record)].slice(0, 5).map((error) => `${error.path}: ${error.message}`);
    deps.log.error(
      { service: (record as ServiceRecord).name, problems },
      "a stored service does not fit the contract; left out of the list",
    );
  }
  if (listable.length === records.length) return records;
  set.headers["x-engine-unlisted"] = String(records.length - listable.length);
  return listable;
}

/**
 * serviceRoutes serves services: deploy, list, read, change, control, delete, logs (with SSE
 * follow), diagnosis and what the live workloads use. A scoped token sees and touches only the
 * services in its scope.
 */
export function serviceRoutes(deps: ServiceRouteDeps, ctx: RequestContext) {
  const inScope = (request: Request, ident: string) => assertServiceInScope(ctx.principalOf(request), deps.services.serviceName(ident));
  return new Elysia({ name: "services" })
    .post(
      "/api/services",
      async ({ body, request, set }) => {
        const { record } = await deps.services.deploy(body, ctx.principalOf(request));
        set.status = 201;
        return record;
      },
      {
        body: ServiceDeploy,
        response: { 201: ServiceRecord, ...errorResponses(...AUTHED, 404, 409, 422, 503) },
        detail: {
          tags: ["services"],
          summary: "Deploy a service, or a new version of one (201 either way)",
        },
      },
    )
    .get("/api/services", ({ request, set }) => listableRecords(deps.services.list(ctx.principalOf(request)), deps, set), {
      response: { 200: t.Array(ServiceRecord), ...errorResponses(...AUTHED) },
      detail: { tags: ["services"], summary: "List services (a scoped token sees its scope only)" },
    })
    .get(
      "/api/services/:ident",
      async ({ params, query, request, set, server }) => {
        // One lookup: the record names the service the scope is checked against (an unknown
        // ident is 404 either way, as it was when the scope was checked first).
        const read = () => {
          const record = deps.services.get(params.ident);
          assertServiceInScope(ctx.principalOf(request), record.name);
          return record;
        };
        let record = read();
        if (query.index !== undefined && query.wait !== undefined && recordIndex(record) === query.index) {
          // Held past the listener's idle timeout if need be: the wait is what the client asked for.
          server?.timeout(request, 0);
          record = await changedRecord(deps, record.id, query.index, Number(query.wait) * 1000, read, [request.signal, deps.closing]);
        }
        const index = recordIndex(record);
        set.headers["x-engine-index"] = index;
        set.headers.etag = `"${index}"`;
        return record;
      },
      {
        params: ServiceIdentParams,
        query: ServiceReadQuery,
        response: { 200: ServiceRecord, ...errorResponses(...AUTHED, 404, 422) },
        detail: {
          tags: ["services"],
          summary:
            "Read a service by name or id. The answer's X-Engine-Index names this state of the record; a read with `index` (that value) and `wait` (seconds, at most 300) is a blocking query: it answers once the record differs, or when the wait is over with the record as it is (the same index), or at once when the index is not the current one. A deleted service answers 404",
        },
      },
    )
    .patch(
      "/api/services/:ident",
      async ({ params, body, request }) => {
        inScope(request, params.ident);
        return (await deps.services.patch(params.ident, body, ctx.principalOf(request))).record;
      },
      {
        params: ServiceIdentParams,
        body: ServicePatch,
        response: { 200: ServiceRecord, ...errorResponses(...AUTHED, 404, 409, 422, 503) },
        detail: {
          tags: ["services"],
          summary:
            "Change some settings of a service: a new version from the latest one with the given fields changed (null resets a field; env and secrets merge key by key, a null value removing the key), checked as a deploy is; a running service rolls to it, one stopped by request stays stopped. A patch that changes nothing makes no version.",
        },
      },
    )
    .post(
      "/api/services/:ident/:action",
      ({ params, request }) => {
        inScope(request, params.ident);
        return deps.services.control(params.ident, params.action);
      },
      {
        params: ServiceAction,
        response: { 200: ServiceRecord, ...errorResponses(...AUTHED, 404, 409, 422) },
        detail: { tags: ["services"], summary: "start, stop, restart, pause (SIGSTOP) or resume (SIGCONT) a service" },
      },
    )
    .delete(
      // The param is called `name` because the router shares one tree per method with the
      // spec's DELETE /api/services/{name}/domains/{domain}; it takes a name or an id all the same.
      "/api/services/:name",
      async ({ params, request }) => {
        inScope(request, params.name);
        const record = deps.services.get(params.name);
        await deps.services.remove(params.name);
        return { id: record.id, name: record.name, deleted: true };
      },
      {
        params: t.Object({ name: t.String({ minLength: 1, maxLength: 128 }) }),
        response: { 200: t.Object({ id: t.String(), name: t.String(), deleted: t.Boolean() }), ...errorResponses(...AUTHED, 404, 422) },
        detail: { tags: ["services"], summary: "Stop and delete a service by name or id (its data directory is kept)" },
      },
    )
    .get(
      "/api/services/:ident/logs",
      ({ params, query, request }) => {
        inScope(request, params.ident);
        const tail = query.tail === undefined ? DEFAULT_LOG_TAIL : Number(query.tail);
        if (query.follow !== "true" && query.follow !== "1") return deps.services.logs(params.ident, tail);
        // A reconnecting client names the last record it got: the stream resumes after it,
        // without the tail (decision 366). Any other id is ignored, and the tail is sent.
        const after = parseCursor(request.headers.get("last-event-id"));
        const start = after ? { records: [], end: after } : deps.services.logRecords(params.ident, tail);
        return sseStream(start, after !== null, (signal, from) => deps.services.followLogs(params.ident, signal, from), [
          request.signal,
          deps.closing,
        ]);
      },
      {
        params: ServiceIdentParams,
        query: LogsQuery,
        response: { 200: t.Array(LogLine), ...errorResponses(...AUTHED, 404, 422) },
        detail: {
          tags: ["services"],
          summary:
            "The service's latest log lines; with follow=true a text/event-stream: a `ready` event at once ({lines: the tail's count, resumed}), then a `line` event for each line, the tail first. Every event has an id (a place in the log); a client that reconnects with Last-Event-ID gets the lines after it instead of the tail, so a stream the daemon ends as it restarts resumes without a gap",
        },
      },
    )
    .get(
      "/api/services/:ident/diagnose",
      ({ params, request }) => {
        inScope(request, params.ident);
        return deps.services.diagnose(params.ident);
      },
      {
        params: ServiceIdentParams,
        response: { 200: Diagnosis, ...errorResponses(...AUTHED, 404, 422) },
        detail: { tags: ["services"], summary: "Diagnose a service: status, forensics, restarts, health, bindings, build, logs" },
      },
    )
    .get("/api/stats", ({ request }) => deps.services.stats(ctx.principalOf(request)), {
      response: { 200: ServiceStatsRecord, ...errorResponses(...AUTHED) },
      detail: {
        tags: ["services"],
        summary:
          "What each live workload uses now (its process group and descendants, from /proc): CPU seconds so far and resident memory; a scoped token sees its scope only",
      },
    });
}

/** recordIndex names one state of a service's record: a digest of what the API answers. */
function recordIndex(record: ServiceRecord): string {
  return Bun.hash(JSON.stringify(record)).toString(36);
}

/**
 * changedRecord waits until the service's record (read by `read`) no longer has `index`, or
 * `waitMs` passed, or one of `endWhen` aborted (the client left, or the daemon hands over: the
 * client asks again, of the next one), and answers the record as it is then; a read that throws
 * (the service deleted, 404) ends the wait with that error. The record is read again after each
 * change notice of the service, once the change's transaction has returned, and every
 * WAIT_RECHECK_MS (a count of restarts in a window changes with time alone).
 */
function changedRecord(
  deps: ServiceRouteDeps,
  serviceId: string,
  index: string,
  waitMs: number,
  read: () => ServiceRecord,
  endWhen: (AbortSignal | undefined)[],
): Promise<ServiceRecord> {
  return new Promise<ServiceRecord>((resolve, reject) => {
    const signals = endWhen.filter((signal): signal is AbortSignal => signal !== undefined);
    let done = false;
    const finish = (outcome: () => void) => {
      if (done) return;
      done = true;
      unsubscribe();
      clearInterval(recheck);
      clearTimeout(timer);
      for (const signal of signals) signal.removeEventListener("abort", end);
      outcome();
    };
    // Answers the record once it has another index, or as it is with `always`; a read that
    // throws (deleted: 404) answers that.
    const settle = (always: boolean) => {
      if (done) return;
      try {
        const record = read();
        if (always || recordIndex(record) !== index) finish(() => resolve(record));
      } catch (error) {
        finish(() => reject(error));
      }
    };
    const look = () => settle(false);
    const end = () => settle(true);
    // A change is told inside the transaction that makes it: read once that has returned.
    const unsubscribe = deps.services.subscribe((id) => {
      if (id === serviceId) queueMicrotask(look);
    });
    const recheck = setInterval(look, WAIT_RECHECK_MS);
    const timer = setTimeout(end, waitMs);
    for (const signal of signals) {
      if (signal.aborted) return end();
      signal.addEventListener("abort", end, { once: true });
    }
  });
}

/**
 * sseStream sends a `ready` event, the tail, then each new line, as server-sent events until
 * the client leaves or one of `endWhen` aborts (the daemon handing over to its successor).
 * Each event's id is the log cursor after it (`ready`'s: where the stream starts), so the
 * client's reconnection resumes exactly there.
 */
function sseStream(
  start: { records: LogRecord[]; end: LogCursor },
  resumed: boolean,
  follow: (signal: AbortSignal, from: LogCursor) => AsyncGenerator<LogRecord>,
  endWhen: (AbortSignal | undefined)[],
): Response {
  const controller = new AbortController();
  const abort = () => controller.abort();
  const signals = endWhen.filter((signal): signal is AbortSignal => signal !== undefined);
  for (const signal of signals) {
    if (signal.aborted) controller.abort();
    else signal.addEventListener("abort", abort, { once: true });
  }
  const encoder = new TextEncoder();
  const stream = new ReadableStream<Uint8Array>({
    async start(sink) {
      const send = (text: string) => {
        try {
          sink.enqueue(encoder.encode(text));
        } catch {
          controller.abort();
        }
      };
      const line = (record: LogRecord) => send(`event: line\nid: ${formatCursor(record.cursor)}\ndata: ${JSON.stringify(record.line)}\n\n`);
      // The headers and a first event go out at once, even for a service that never printed:
      // a client (the UI's log panel) learns the stream is live and how many lines the tail had.
      // `ready` carries the starting cursor only when no tail follows it: a client cut off
      // between `ready` and the tail's lines then reconnects for the tail again, losing nothing.
      const ready = { lines: start.records.length, resumed };
      const readyId = start.records.length > 0 ? "" : `id: ${formatCursor(start.end)}\n`;
      send(`retry: ${SSE_RETRY_MS}\nevent: ready\n${readyId}data: ${JSON.stringify(ready)}\n\n`);
      for (const record of start.records) line(record);
      const heartbeat = setInterval(() => send(": keep-alive\n\n"), SSE_HEARTBEAT_MS);
      try {
        for await (const record of follow(controller.signal, start.end)) line(record);
      } finally {
        clearInterval(heartbeat);
        for (const signal of signals) signal.removeEventListener("abort", abort);
        try {
          sink.close();
        } catch {
          // already closed by the client
        }
      }
    },
    cancel() {
      controller.abort();
    },
  });
  return new Response(stream, {
    headers: { "content-type": "text/event-stream", "cache-control": "no-cache", "x-accel-buffering": "no" },
  });
}
