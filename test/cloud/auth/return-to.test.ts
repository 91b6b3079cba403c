import { describe, expect, test } from "bun:test";
import { normalizeReturnTo } from "../../../src/cloud/auth";
import { AppError } from "../../../src/lib/errors";
import { GOOD_RETURN_TOS, OPEN_REDIRECT_PAYLOADS } from "./return-to-cases";

describe("return_to", () => {
  test("the table holds at least twenty open-redirect payloads", () => {
    expect(OPEN_REDIRECT_PAYLOADS.length).toBeGreaterThanOrEqual(20);
  });

  test.each(OPEN_REDIRECT_PAYLOADS)("refuses %s", (_name, payload) => {
    let thrown: unknown;
    try {
      normalizeReturnTo(payload);
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(AppError);
    expect((thrown as AppError).code).toBe("invalid_return_to");
  });

  test.each(GOOD_RETURN_TOS)("accepts %p as %p", (given, normalized) => {
    expect(normalizeReturnTo(given)).toBe(normalized);
  });

  test("what it returns is itself accepted unchanged and never leaves the site", () => {
    for (const [given] of GOOD_RETURN_TOS) {
      const once = normalizeReturnTo(given);
      expect(normalizeReturnTo(once)).toBe(once);
      expect(new URL(once, "https://console.example").origin).toBe("https://console.example");
    }
  });
});
