import { describe, expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { constantTimeEqual, digestSecret, generateToken, SecretBox } from "../../src/lib/crypto";
import { createLogger } from "../../src/lib/logger";
import { eventually, tempDir } from "../helpers";

describe("crypto", () => {
  test("tokens are prefixed, 256-bit and unique", () => {
    const tokens = new Set(Array.from({ length: 100 }, generateToken));
    expect(tokens.size).toBe(100);
    for (const token of tokens) expect(token).toMatch(/^eng_[A-Za-z0-9_-]{43}$/);
  });

  test("digests are SHA-256 hex; comparison is exact", () => {
    expect(digestSecret("abc")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    expect(constantTimeEqual("abc", "abc")).toBe(true);
    expect(constantTimeEqual("abc", "abd")).toBe(false);
    expect(constantTimeEqual("abc", "abcd")).toBe(false);
  });

  test("SecretBox round-trips and detects tampering or the wrong context", () => {
    const box = new SecretBox(randomBytes(32));
    const sealed = box.seal("hunter2", "ctx");
    expect(sealed).not.toContain("hunter2");
    expect(box.open(sealed, "ctx")).toBe("hunter2");
    expect(() => box.open(sealed, "other")).toThrow();
    const parts = sealed.split(".");
    parts[3] = Buffer.from("tampered").toString("base64url");
    expect(() => box.open(parts.join("."), "ctx")).toThrow();
    expect(() => new SecretBox(randomBytes(32)).open(sealed, "ctx")).toThrow();
  });
});

describe("logger", () => {
  test("redacts every secret field before it reaches the file", async () => {
    const dir = tempDir();
    try {
      const { log, flush } = createLogger({ level: "info", dataDir: dir, stdout: false });
      log.info(
        { token: "T1", password: "P1", body: { token: "T2", secret: "S1" }, headers: { authorization: "Bearer T3" }, admin_token: "A1" },
        "secrets inside",
      );
      flush();
      const text = await eventually(() => {
        const content = readFileSync(join(dir, "engine.log"), "utf8");
        return content.includes("secrets inside") ? content : "";
      });
      for (const secret of ["T1", "P1", "T2", "S1", "Bearer T3", "A1"]) expect(text).not.toContain(`"${secret}"`);
      expect(text).toContain("[redacted]");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
