import { afterAll, describe, expect, test } from "bun:test";
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { systemUnits } from "../../../src/engine/metrics/procfs";
import { tempDir } from "../../helpers";

const dir = tempDir("engine-auxv-");
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** auxvFile writes an auxiliary vector of (key, value) pairs as the kernel lays it out on a 64-bit little-endian machine. */
function auxvFile(name: string, pairs: [number, number][]): string {
  const buffer = Buffer.alloc(pairs.length * 16);
  pairs.forEach(([key, value], index) => {
    buffer.writeBigUInt64LE(BigInt(key), index * 16);
    buffer.writeBigUInt64LE(BigInt(value), index * 16 + 8);
  });
  const path = join(dir, name);
  writeFileSync(path, buffer);
  return path;
}

const getconf = (name: string) => Number(Bun.spawnSync(["getconf", name]).stdout.toString().trim());

describe("systemUnits", () => {
  test("reads this process's tick rate and page size as getconf answers them", () => {
    expect(systemUnits()).toEqual({ ticksPerSecond: getconf("CLK_TCK"), pageBytes: getconf("PAGESIZE") });
  });

  test("takes AT_CLKTCK and AT_PAGESZ from the vector, up to AT_NULL", () => {
    // AT_PHDR (3) first, then AT_PAGESZ (6), AT_CLKTCK (17), AT_NULL, and a pair after it that must be ignored.
    const path = auxvFile("auxv", [
      [3, 0x400040],
      [6, 16384],
      [17, 250],
      [0, 0],
      [17, 1000],
    ]);
    expect(systemUnits(path)).toEqual({ ticksPerSecond: 250, pageBytes: 16384 });
  });

  test("falls back to 100 and 4096 without the file, or without the keys", () => {
    expect(systemUnits(join(dir, "missing"))).toEqual({ ticksPerSecond: 100, pageBytes: 4096 });
    expect(systemUnits(auxvFile("empty", []))).toEqual({ ticksPerSecond: 100, pageBytes: 4096 });
    expect(systemUnits(auxvFile("other", [[3, 1]]))).toEqual({ ticksPerSecond: 100, pageBytes: 4096 });
  });
});
