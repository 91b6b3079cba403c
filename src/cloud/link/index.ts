/**
 * The link module enrolls machines by link code (claim) and by device link (RFC 8628:
 * request, poll). Device approvals, the console's side of the device link, are in
 * src/cloud/approvals; pre-authorized keys in src/cloud/keys.
 */
export { DEFAULT_CADENCE, PollCadence, type PollCadenceOptions } from "./cadence";
export { DEFAULT_LINK_CODE_LIFETIME_S, LINK_CODE_PREFIX, LinkCodes, linkCodeDigest, normalizeLinkCode } from "./codes";
export { DEVICE_LIFETIME_MS, DeviceLinks, type DeviceState, USER_CODE_ATTEMPTS } from "./device";
export { type LinkOptions, linkRoutes, USER_CODE_KEY_PURPOSE, userCodeDigester } from "./routes";
export { formatUserCode, newUserCode, normalizeUserCode, USER_CODE_ALPHABET, USER_CODE_LENGTH, UserCodeDigester } from "./user-code";
