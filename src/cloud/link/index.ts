import type { CloudSweep } from "../context";
import { sweepLinkCodes } from "./codes";
import { DeviceRequests } from "./requests";

/**
 * The link module enrolls machines by link code (claim) and by device link (RFC 8628:
 * request, poll). Device approvals, the console's side of the device link, are in
 * src/cloud/approvals; pre-authorized keys in src/cloud/keys.
 */
export { DEFAULT_CADENCE, PollCadence, type PollCadenceOptions } from "./cadence";
export { DEFAULT_LINK_CODE_LIFETIME_S, LINK_CODE_PREFIX, LinkCodes, linkCodeDigest, normalizeLinkCode, sweepLinkCodes } from "./codes";
export { DEVICE_LIFETIME_MS, DeviceLinks, USER_CODE_ATTEMPTS } from "./device";
export { type DeviceRequest, DeviceRequests, type DeviceState, type NewDeviceRequest } from "./requests";
export { type LinkOptions, linkRoutes, USER_CODE_KEY_PURPOSE, userCodeDigester } from "./routes";
export { formatUserCode, newUserCode, normalizeUserCode, USER_CODE_ALPHABET, USER_CODE_LENGTH, UserCodeDigester } from "./user-code";

/** KEEP_EXPIRED_MS keeps expired link rows (codes, device requests) a day for support questions, then the sweep deletes them. */
export const KEEP_EXPIRED_MS = 86_400_000;

/** sweepLinkRows is the link module's sweep: device requests and link codes a day after they expired. */
export const sweepLinkRows: CloudSweep = async (deps, now) => ({
  device_requests: await new DeviceRequests(deps.db).sweep(now - KEEP_EXPIRED_MS),
  link_codes: await sweepLinkCodes(deps.db, now - KEEP_EXPIRED_MS),
});
