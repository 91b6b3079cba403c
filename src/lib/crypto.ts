import { createCipheriv, createDecipheriv, randomBytes, timingSafeEqual } from "node:crypto";

/** TOKEN_PREFIX marks engine tokens so secret scanners and humans can recognise them. */
export const TOKEN_PREFIX = "eng_";

/** generateToken returns a new bearer secret: the prefix and 256 random bits in base64url. */
export function generateToken(): string {
  return TOKEN_PREFIX + randomBytes(32).toString("base64url");
}

/** digestSecret returns the hex SHA-256 of a secret. Secrets are stored only in this form. */
export function digestSecret(secret: string): string {
  // Bun's one-shot SHA-256 of the string's UTF-8: the same digest as node:crypto's, without a
  // Hash object and its stream machinery for each request's token.
  return Bun.SHA256.hash(secret, "hex") as string;
}

/**
 * constantTimeEqual compares two strings without leaking, through timing, where they differ
 * (OWASP ASVS 11.2.4). Strings of different lengths compare unequal after an equal-cost compare.
 */
export function constantTimeEqual(a: string, b: string): boolean {
  const left = Buffer.from(a, "utf8");
  const right = Buffer.from(b, "utf8");
  if (left.length !== right.length) {
    timingSafeEqual(left, left);
    return false;
  }
  return timingSafeEqual(left, right);
}

/** randomId returns a short, URL-safe, unguessable id with a type prefix, e.g. `tok_3fz8...`. */
export function randomId(prefix: string): string {
  return `${prefix}_${randomBytes(12).toString("base64url").replace(/[-_]/g, "x").toLowerCase()}`;
}

/**
 * SecretBox encrypts secrets that must be used again (the vcs token) with AES-256-GCM under
 * a 256-bit key kept in the data dir with mode 0600. The output is `v1.<iv>.<tag>.<ciphertext>`.
 */
export class SecretBox {
  readonly #key: Buffer;

  constructor(key: Buffer) {
    if (key.length !== 32) throw new Error("SecretBox needs a 32-byte key");
    this.#key = key;
  }

  seal(plaintext: string, associatedData = ""): string {
    const iv = randomBytes(12);
    const cipher = createCipheriv("aes-256-gcm", this.#key, iv);
    cipher.setAAD(Buffer.from(associatedData));
    const body = Buffer.concat([cipher.update(plaintext, "utf8"), cipher.final()]);
    return ["v1", iv.toString("base64url"), cipher.getAuthTag().toString("base64url"), body.toString("base64url")].join(".");
  }

  open(sealed: string, associatedData = ""): string {
    const [version, iv, tag, body] = sealed.split(".");
    if (version !== "v1" || !iv || !tag || body === undefined) throw new Error("sealed secret has an unknown format");
    const decipher = createDecipheriv("aes-256-gcm", this.#key, Buffer.from(iv, "base64url"));
    decipher.setAAD(Buffer.from(associatedData));
    decipher.setAuthTag(Buffer.from(tag, "base64url"));
    return Buffer.concat([decipher.update(Buffer.from(body, "base64url")), decipher.final()]).toString("utf8");
  }
}
