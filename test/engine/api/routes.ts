/**
 * SAMPLE_REQUESTS holds one well-formed request per authenticated route, and the status the
 * route answers an admin on an engine where the service named `web` does not exist.
 * Tests use it for the role matrix and the golden shapes.
 */
export interface SampleRequest {
  key: string;
  method: string;
  path: string;
  body?: unknown;
  adminStatus: number;
  /** mutates marks routes whose success changes state the matrix must not repeat (restart). */
  mutates?: boolean;
}

export function sampleRequests(tokenIdToRevoke: () => string, uniqueName: () => string): SampleRequest[] {
  const inAnHour = new Date(Date.now() + 3600_000).toISOString();
  return [
    { key: "GET /api/tokens", method: "GET", path: "/api/tokens", adminStatus: 200 },
    { key: "POST /api/tokens", method: "POST", path: "/api/tokens", body: { name: uniqueName(), role: "readonly" }, adminStatus: 201 },
    { key: "DELETE /api/tokens/:id", method: "DELETE", path: `/api/tokens/${tokenIdToRevoke()}`, adminStatus: 200 },
    { key: "GET /api/app-templates", method: "GET", path: "/api/app-templates", adminStatus: 200 },
    { key: "GET /api/app-templates/:template_id", method: "GET", path: "/api/app-templates/vllm", adminStatus: 200 },
    { key: "GET /api/proxy/status", method: "GET", path: "/api/proxy/status", adminStatus: 200 },
    { key: "GET /api/services/:ident/diagnose", method: "GET", path: "/api/services/web/diagnose", adminStatus: 404 },
    {
      key: "POST /api/services",
      method: "POST",
      path: "/api/services",
      body: { name: uniqueName(), kind: "batch", command: ["true"] },
      adminStatus: 201,
    },
    { key: "GET /api/services", method: "GET", path: "/api/services", adminStatus: 200 },
    { key: "GET /api/services/:ident", method: "GET", path: "/api/services/web", adminStatus: 404 },
    {
      key: "PATCH /api/services/:ident",
      method: "PATCH",
      path: "/api/services/web",
      body: { memory_mb: 256 },
      adminStatus: 404,
    },
    { key: "GET /api/services/:ident/connection", method: "GET", path: "/api/services/web/connection", adminStatus: 404 },
    { key: "POST /api/services/:ident/:action", method: "POST", path: "/api/services/web/stop", adminStatus: 404 },
    { key: "DELETE /api/services/:name", method: "DELETE", path: "/api/services/web", adminStatus: 404 },
    { key: "GET /api/services/:ident/logs", method: "GET", path: "/api/services/web/logs?tail=10", adminStatus: 404 },
    { key: "GET /api/gpus", method: "GET", path: "/api/gpus", adminStatus: 200 },
    { key: "GET /api/stats", method: "GET", path: "/api/stats", adminStatus: 200 },

    { key: "GET /metrics", method: "GET", path: "/metrics", adminStatus: 200 },
    { key: "GET /api/metrics/history", method: "GET", path: "/api/metrics/history", adminStatus: 200 },
    {
      key: "POST /api/services/:ident/domains",
      method: "POST",
      path: "/api/services/web/domains",
      body: { domain: "web.example.com" },
      adminStatus: 404,
    },
    {
      key: "DELETE /api/services/:name/domains/:domain",
      method: "DELETE",
      path: "/api/services/web/domains/web.example.com",
      adminStatus: 404,
    },
    {
      key: "POST /api/databases/:name/restore",
      method: "POST",
      path: "/api/databases/web/restore",
      body: { dump: "/tmp/dump.sql", timeout_s: 30 },
      adminStatus: 404,
    },
    {
      key: "POST /api/daemon/restart",
      method: "POST",
      path: "/api/daemon/restart",
      body: { drain_timeout_s: 1 },
      adminStatus: 202,
      mutates: true,
    },
    {
      // The test engine runs from source: an admin's upgrade is refused as not supported (501).
      key: "POST /api/daemon/upgrade",
      method: "POST",
      path: "/api/daemon/upgrade",
      body: { binary: "/usr/local/bin/engine-next" },
      adminStatus: 501,
    },
    {
      key: "PUT /api/link/vcs-token",
      method: "PUT",
      path: "/api/link/vcs-token",
      body: {
        installation_id: 42,
        token: "ghs_sampleSecretValue123",
        expires_at: inAnHour,
        issued_at: new Date().toISOString(),
        repos: ["acme/app"],
      },
      adminStatus: 200,
    },
    { key: "POST /api/ui/login-links", method: "POST", path: "/api/ui/login-links", adminStatus: 201 },
    { key: "GET /api/link/status", method: "GET", path: "/api/link/status", adminStatus: 200 },
  ];
}
