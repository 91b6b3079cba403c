import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { writePrivateFile } from "../../lib/files";
import type { Logger } from "../../lib/logger";
import type { TokenStore } from "./tokens";

export const ADMIN_TOKEN_FILE = "admin.token";

/**
 * bootstrapAdminToken makes sure the engine can be administered over HTTP.
 *
 * With ENGINE_ADMIN_TOKEN set, that secret is registered as an admin token (once). Otherwise,
 * when no active admin token exists, a new one is made and written to `<data-dir>/admin.token`
 * with mode 0600. The log names the file, never the token.
 */
export function bootstrapAdminToken(tokens: TokenStore, dataDir: string, adminToken: string | undefined, log: Logger): void {
  const file = join(dataDir, ADMIN_TOKEN_FILE);
  if (adminToken !== undefined) {
    if (!tokens.hasDigestOf(adminToken)) {
      createNamed(tokens, "env-admin", "env", adminToken);
      log.info("registered ENGINE_ADMIN_TOKEN as an admin token");
    }
  }
  if (tokens.hasActiveAdmin()) {
    if (!existsSync(file)) log.info("an admin token exists; admin.token is absent, so the CLI uses the unix socket");
    return;
  }
  const { record, secret } = createNamed(tokens, "bootstrap-admin", "bootstrap");
  writePrivateFile(file, `${secret}\n`);
  log.info({ file, token_id: record.id }, "created the first admin token; it is in the file named here");
}

/** createNamed creates an admin token named `name`, or `name-2`, `name-3`... when an active token holds the name. */
function createNamed(tokens: TokenStore, name: string, origin: string, secret?: string) {
  for (let attempt = 1; ; attempt++) {
    try {
      return tokens.create({ name: attempt === 1 ? name : `${name}-${attempt}`, role: "admin" }, origin, secret);
    } catch (error) {
      if ((error as { code?: string }).code !== "token_name_taken" || attempt > 100) throw error;
    }
  }
}

/** readAdminTokenFile returns the token in `<data-dir>/admin.token`, or undefined when there is none. */
export function readAdminTokenFile(dataDir: string): string | undefined {
  try {
    const value = readFileSync(join(dataDir, ADMIN_TOKEN_FILE), "utf8").trim();
    return value.length > 0 ? value : undefined;
  } catch {
    return undefined;
  }
}
