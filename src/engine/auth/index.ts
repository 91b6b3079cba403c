export { ADMIN_TOKEN_FILE, bootstrapAdminToken, readAdminTokenFile } from "./bootstrap";
export { ACCESS_ROLES, type Access, ROUTE_ACCESS, roleMay } from "./policy";
export { assertServiceInScope, inScope, LINK_PRINCIPAL, LOCAL_PRINCIPAL, type Principal, type RequestContext } from "./principal";
export { type TokenRouteDeps, tokenRoutes } from "./routes";
export { TokenStore } from "./tokens";
