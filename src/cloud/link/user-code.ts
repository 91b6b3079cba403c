import { createHmac, randomInt } from "node:crypto";

/**
 * USER_CODE_ALPHABET is RFC 8628 §6.1's base-20 set: consonants only, so no word can be
 * spelled and no letter is confused with a digit. Eight of them give 20^8 ≈ 2^34.6 codes.
 */
export const USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ";
/** USER_CODE_LENGTH is the number of alphabet characters in a user code (shown as `XXXX-XXXX`). */
export const USER_CODE_LENGTH = 8;

const SHAPE = new RegExp(`^[${USER_CODE_ALPHABET}]{${USER_CODE_LENGTH}}$`);

/** newUserCode draws a user code uniformly (`randomInt` rejects bias) and returns it normalised, without the dash. */
export function newUserCode(): string {
  let code = "";
  for (let i = 0; i < USER_CODE_LENGTH; i++) code += USER_CODE_ALPHABET[randomInt(USER_CODE_ALPHABET.length)];
  return code;
}

/** formatUserCode shows a normalised user code as people type it: `XXXX-XXXX`. */
export function formatUserCode(code: string): string {
  return `${code.slice(0, 4)}-${code.slice(4)}`;
}

/**
 * normalizeUserCode turns what a person typed into the stored form: upper-case, with dashes
 * and white space removed (RFC 8628 §6.1). It answers null for anything that cannot be a
 * user code, so a malformed input is never looked up.
 */
export function normalizeUserCode(input: string): string | null {
  const code = input.toUpperCase().replace(/[-\s]/g, "");
  return SHAPE.test(code) ? code : null;
}

/**
 * UserCodeDigester keys user codes for storage with HMAC-SHA256 under a server key. A plain
 * SHA-256 would not do: a user code holds only ~34.6 bits, so anyone holding a database dump
 * could hash all 20^8 candidates in minutes and recover every live code. Without the key
 * (which never enters the database) the digests are useless to them.
 */
export class UserCodeDigester {
  readonly #key: Buffer;

  constructor(key: Buffer) {
    if (key.length < 32) throw new Error("UserCodeDigester needs a key of at least 256 bits");
    this.#key = key;
  }

  /** digest returns the hex HMAC of a normalised user code. */
  digest(normalizedCode: string): string {
    return createHmac("sha256", this.#key).update(normalizedCode, "utf8").digest("hex");
  }
}
