/**
 * Defaults that more than one client of the local engine API applies on its side of a request,
 * kept here so the CLI and the web UI cannot drift. This file imports nothing: the web UI's
 * browser bundle takes it as it is.
 */

/**
 * DEFAULT_RESTORE_TIMEOUT_S is the restore timeout (`timeout_s` of POST
 * /api/databases/{name}/restore) that `engine restore` sends without --timeout and the web
 * UI's restore form starts with: an hour, enough for a dump of some GiB from a local file.
 */
export const DEFAULT_RESTORE_TIMEOUT_S = 3600;

/** MAX_RESTORE_TIMEOUT_S is the largest timeout_s the API accepts (RestoreRequest's maximum). */
export const MAX_RESTORE_TIMEOUT_S = 86_400;
