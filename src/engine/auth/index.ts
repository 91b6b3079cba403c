export { ADMIN_TOKEN_FILE, bootstrapAdminToken, readAdminTokenFile } from "./bootstrap";
export { ACCESS_ROLES, type Access, ROUTE_ACCESS, roleMay } from "./policy";
export { assertServiceInScope, LINK_PRINCIPAL, LOCAL_PRINCIPAL, type Principal } from "./principal";
export { TokenStore } from "./tokens";
