import type { Role } from "../../contract/engine";

/**
 * Access is what a route demands:
 * - `public`: no credential (the contract, the docs page, the health check);
 * - `read`: any valid token (admin, submitter, readonly);
 * - `write`: admin or submitter; the handler also checks the token's service scope and caps;
 * - `admin`: admin only.
 */
export type Access = "public" | "read" | "write" | "admin";

export const ACCESS_ROLES: Record<Exclude<Access, "public">, readonly Role[]> = {
  read: ["admin", "submitter", "readonly"],
  write: ["admin", "submitter"],
  admin: ["admin"],
};

/**
 * ROUTE_ACCESS is the role × route matrix, keyed by `METHOD /path/:param` exactly as the
 * router names routes. Every route must have an entry: the API refuses to start with one
 * missing (see api/index.ts), so no route can be left open by accident. docs/roles.md
 * mirrors this table and a test checks the two agree.
 */
export const ROUTE_ACCESS: Readonly<Record<string, Access>> = {
  "GET /api/health": "public",
  "GET /api/ready": "public",
  "GET /api/openapi.json": "public",
  "GET /api/docs": "public",
  "GET /api/tokens": "read",
  "POST /api/tokens": "admin",
  "DELETE /api/tokens/:id": "admin",
  "GET /api/app-templates": "read",
  "GET /api/app-templates/:template_id": "read",
  "GET /api/proxy/status": "read",
  "GET /api/services/:ident/diagnose": "read",
  "POST /api/services": "write",
  "GET /api/services": "read",
  "GET /api/services/:ident": "read",
  "PATCH /api/services/:ident": "write",
  "GET /api/services/:ident/connection": "admin",
  "POST /api/services/:ident/:action": "write",
  "DELETE /api/services/:name": "write",
  "GET /api/services/:ident/logs": "read",
  "GET /api/gpus": "read",
  "GET /api/stats": "read",

  // The Prometheus scrape (outside /api and its contract) and the UI's history: any role (decisions 330, 331).
  "GET /metrics": "read",
  "GET /api/metrics/history": "read",
  "POST /api/services/:ident/domains": "write",
  "DELETE /api/services/:name/domains/:domain": "write",
  "POST /api/databases/:name/restore": "write",
  "POST /api/daemon/restart": "admin",
  "POST /api/daemon/upgrade": "admin",
  "PUT /api/link/vcs-token": "admin",
  "GET /api/link/status": "read",
  // The web UI (src/engine/ui): its page and files are public; it then calls the routes above
  // with its session cookie. Signing in checks the token itself; a session is read or ended
  // with its own cookie, which the handler checks (ending it needs the CSRF token); login
  // links are minted by admins.
  "GET /": "public",
  "GET /ui/app.js": "public",
  "GET /ui/app.css": "public",
  "GET /ui/login": "public",
  "POST /ui/session": "public",
  "GET /ui/session": "public",
  "DELETE /ui/session": "public",
  "POST /api/ui/login-links": "admin",
};

export function roleMay(role: Role, access: Access): boolean {
  return access === "public" || ACCESS_ROLES[access].includes(role);
}
