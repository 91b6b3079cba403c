import type { SecretBox } from "../../lib/crypto";
import type { VersionRow } from "./store";

/**
 * ServiceSecrets seals a version's secrets into its row and opens them again. They are sealed
 * with the service id and version as associated data, so a sealed value copied to another
 * row does not open.
 */
export class ServiceSecrets {
  constructor(private readonly box: SecretBox) {}

  /** seal is what a version row keeps of `secrets`: null when there are none. */
  seal(serviceId: string, version: number, secrets: Record<string, string>): string | null {
    return Object.keys(secrets).length > 0 ? this.box.seal(JSON.stringify(secrets), `${serviceId}:${version}`) : null;
  }

  open(version: VersionRow): Record<string, string> {
    return version.sealed_secrets ? JSON.parse(this.box.open(version.sealed_secrets, `${version.service_id}:${version.version}`)) : {};
  }
}
