import { expect, test } from "bun:test";
import { createHash, randomBytes } from "node:crypto";
import {
  formatUserCode,
  newUserCode,
  normalizeUserCode,
  USER_CODE_ALPHABET,
  USER_CODE_LENGTH,
  UserCodeDigester,
} from "../../../src/cloud/link";

test("the alphabet is RFC 8628's base-20 consonants and a code has eight of them", () => {
  expect(USER_CODE_ALPHABET).toBe("BCDFGHJKLMNPQRSTVWXZ");
  expect(new Set(USER_CODE_ALPHABET).size).toBe(20);
  expect(USER_CODE_LENGTH).toBe(8);
});

test("new user codes use only the alphabet, show as XXXX-XXXX, and every character occurs", () => {
  const seen = new Set<string>();
  for (let i = 0; i < 2000; i++) {
    const code = newUserCode();
    expect(code).toMatch(/^[BCDFGHJKLMNPQRSTVWXZ]{8}$/);
    expect(formatUserCode(code)).toMatch(/^[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}$/);
    for (const char of code) seen.add(char);
  }
  expect(seen.size).toBe(20);
});

test.each([
  ["BCDF-GHJK", "BCDFGHJK"],
  ["bcdf-ghjk", "BCDFGHJK"],
  ["BCDFGHJK", "BCDFGHJK"],
  ["  bcdf ghjk ", "BCDFGHJK"],
  ["B-C-D-F-G-H-J-K", "BCDFGHJK"],
  ["bcdf\tghjk", "BCDFGHJK"],
  ["BCDF-GHJ", null],
  ["BCDF-GHJKL", null],
  ["BCDF-GHJA", null],
  ["BCD1-GHJK", null],
  ["BCDF_GHJK", null],
  ["", null],
])("normalizeUserCode(%p) is %p", (input, expected) => {
  expect(normalizeUserCode(input)).toBe(expected);
});

test("user codes are keyed: the digest is not a plain SHA-256 and depends on the key", () => {
  const code = "BCDFGHJK";
  const one = new UserCodeDigester(randomBytes(32));
  const two = new UserCodeDigester(randomBytes(32));
  expect(one.digest(code)).toMatch(/^[0-9a-f]{64}$/);
  expect(one.digest(code)).toBe(one.digest(code));
  expect(one.digest(code)).not.toBe(two.digest(code));
  expect(one.digest(code)).not.toBe(createHash("sha256").update(code).digest("hex"));
  expect(() => new UserCodeDigester(randomBytes(16))).toThrow();
});
