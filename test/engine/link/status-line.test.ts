import { expect, test } from "bun:test";
import { describeTunnel } from "../../../cli/commands/link";

const base = {
  since: "2026-03-01T12:00:00.000Z",
  url: "wss://cloud.example/link/tunnel",
  connected_at: null,
  last_error: null,
  last_error_at: null,
  next_attempt_at: null,
  failures: 0,
};

test.each([
  [{ ...base, state: "connected" as const, connected_at: "2026-03-01T12:00:01.000Z" }, "connected since 2026-03-01T12:00:01.000Z"],
  [
    {
      ...base,
      state: "disconnected" as const,
      last_error: "the console went away (restarting or stopping)",
      next_attempt_at: "2026-03-01T12:00:04.000Z",
      failures: 2,
    },
    "disconnected since 2026-03-01T12:00:00.000Z: the console went away (restarting or stopping); next attempt at 2026-03-01T12:00:04.000Z",
  ],
  [{ ...base, state: "connecting" as const }, "connecting"],
  [
    { state: "unknown" as const, reason: "the engine is not running" },
    "unknown: the engine is not running (the tunnel is kept by `engine serve`)",
  ],
])("engine link status says the tunnel is: %#", (tunnel, line) => {
  expect(describeTunnel(tunnel)).toBe(line);
});
