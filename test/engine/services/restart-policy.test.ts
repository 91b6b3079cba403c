import { describe, expect, test } from "bun:test";
import {
  BACKOFF_CAP_S,
  backoffDelayMs,
  decideAfterExit,
  EMPTY_RESTART_STATE,
  type RestartPolicy,
  type RestartState,
  restartsInWindow,
  startsAgainSoon,
} from "../../../src/engine/services/restart-policy";

const T0 = Date.parse("2026-11-21T10:00:00.000Z");
const policy: RestartPolicy = { policy: "always", max_restarts: 3, window_seconds: 60, backoff_s: 2 };
const midJitter = () => 0.5;

describe("decideAfterExit", () => {
  test.each([
    ["batch", "on-failure", true, "settle", "completed"],
    ["batch", "always", true, "settle", "completed"],
    ["batch", "on-failure", false, "restart", null],
    ["batch", "never", false, "settle", "failed"],
    ["service", "always", true, "restart", null],
    ["service", "always", false, "restart", null],
    ["service", "on-failure", true, "settle", "completed"],
    ["service", "on-failure", false, "restart", null],
    ["service", "never", false, "settle", "failed"],
  ] as const)("%s under %s, succeeded %s → %s %s", (kind, name, succeeded, action, status) => {
    const decision = decideAfterExit(kind, { ...policy, policy: name }, EMPTY_RESTART_STATE, succeeded, T0, midJitter);
    expect(decision.action).toBe(action);
    if (decision.action === "settle") expect(decision.status).toBe(status as "completed" | "failed");
  });

  test("at most max_restarts within the window, then failed with the budget spent", () => {
    let state: RestartState = EMPTY_RESTART_STATE;
    for (let i = 0; i < 3; i++) {
      const decision = decideAfterExit("service", policy, state, false, T0 + i * 1000, midJitter);
      expect(decision.action).toBe("restart");
      state = decision.state;
    }
    expect(state.restarts.length).toBe(3);
    const spent = decideAfterExit("service", policy, state, false, T0 + 3000, midJitter);
    expect(spent).toMatchObject({ action: "settle", status: "failed", budgetSpent: true });
  });

  test("the window slides: failures older than window_seconds are forgotten", () => {
    const state: RestartState = {
      ...EMPTY_RESTART_STATE,
      restarts: [new Date(T0).toISOString(), new Date(T0 + 10_000).toISOString(), new Date(T0 + 20_000).toISOString()],
    };
    // 61 s after the first failure only two remain in the window, so one more restart is allowed
    const later = T0 + 61_000;
    expect(restartsInWindow(policy, state, later).length).toBe(2);
    const decision = decideAfterExit("service", policy, state, false, later, midJitter);
    expect(decision.action).toBe("restart");
    expect(decision.state.restarts.length).toBe(3);
    expect(decision.state.restarts[0]).toBe(new Date(T0 + 10_000).toISOString());
  });

  test("next_retry_at and backoff_s describe the chosen delay", () => {
    const decision = decideAfterExit("service", policy, EMPTY_RESTART_STATE, false, T0, midJitter);
    if (decision.action !== "restart") throw new Error("expected a restart");
    expect(decision.delayMs).toBe(2000);
    expect(decision.state.backoff_s).toBe(2);
    expect(decision.state.next_retry_at).toBe(new Date(T0 + 2000).toISOString());
    expect(decision.state.last_exit_at).toBe(new Date(T0).toISOString());
  });
});

describe("backoffDelayMs", () => {
  test("doubles per restart in the window, capped, with ±10 % jitter", () => {
    expect([0, 1, 2, 3].map((attempt) => backoffDelayMs(2, attempt, midJitter))).toEqual([2000, 4000, 8000, 16000]);
    expect(backoffDelayMs(2, 30, midJitter)).toBe(BACKOFF_CAP_S * 1000);
    expect(backoffDelayMs(2, 0, () => 0)).toBe(1800);
    expect(backoffDelayMs(2, 0, () => 1)).toBe(2200);
    expect(backoffDelayMs(0, 5, midJitter)).toBe(0);
    // a backoff above the cap is honoured as given
    expect(backoffDelayMs(600, 3, midJitter)).toBe(600_000);
  });
});

describe("startsAgainSoon (the shim prepares the next run's directory)", () => {
  const restarted: RestartState = { ...EMPTY_RESTART_STATE, restarts: ["2026-11-21T09:59:00.000Z"] };
  test.each([
    ["service", "always", EMPTY_RESTART_STATE, true],
    ["model", "on-failure", EMPTY_RESTART_STATE, true],
    ["database", "always", EMPTY_RESTART_STATE, true],
    ["service", "never", restarted, false],
    ["batch", "on-failure", EMPTY_RESTART_STATE, false],
    ["batch", "always", EMPTY_RESTART_STATE, false],
    ["batch", "on-failure", restarted, true],
    ["batch", "never", restarted, false],
  ] as const)("%s under %s", (kind, name, state, expected) => {
    expect(startsAgainSoon(kind, { ...policy, policy: name }, state)).toBe(expected);
  });
});
