export { bundleUiAssets, type UiAssets, uiAssets } from "./assets";
export { uiRoutes } from "./routes";
export {
  CSRF_HEADER,
  LOGIN_CODE_TTL_MS,
  SESSION_COOKIE,
  SESSION_TTL_MS,
  sameOrigin,
  type UiSession,
  UiSessions,
} from "./sessions";
