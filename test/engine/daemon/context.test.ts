import { describe, expect, test } from "bun:test";
import { resolveConfig } from "../../../src/engine/config";
import { EngineBus, type EngineContext, type Module, ModuleRunner } from "../../../src/engine/daemon/context";
import { systemClock } from "../../../src/lib/clock";
import { createLogger } from "../../../src/lib/logger";

function context(): EngineContext {
  const { log } = createLogger({ level: "silent", stdout: false });
  return {
    config: resolveConfig({ dataDir: "/tmp/engine-context-test" }, {}),
    log,
    clock: systemClock,
    bus: new EngineBus(),
    get store(): never {
      throw new Error("no store in this test");
    },
  };
}

/** recording makes modules that write what they do into `events`; the one named `fails` fails its start. */
function recording(events: string[], names: string[], fails?: string): Module[] {
  return names.map(
    (name) =>
      ({
        name,
        async start() {
          events.push(`start ${name}`);
          await Bun.sleep(1);
          if (name === fails) throw new Error(`${name} cannot start`);
        },
        stop() {
          events.push(`stop ${name}`);
        },
      }) satisfies Module,
  );
}

describe("ModuleRunner", () => {
  test("starts in order and stops in reverse, each once", async () => {
    const events: string[] = [];
    const runner = new ModuleRunner(context());
    await runner.start(recording(events, ["store", "services", "api"]));
    // It answers how long each stop took (a hand-over's release logs them), in the order they stopped.
    const took = await runner.stop();
    expect(Object.keys(took)).toEqual(["api", "services", "store"]);
    expect(Object.values(took).every((ms) => ms >= 0 && ms < 1000)).toBe(true);
    expect(await runner.stop()).toEqual({});
    expect(events).toEqual(["start store", "start services", "start api", "stop api", "stop services", "stop store"]);
  });

  test("a failed start stops the failing module and every one before it, and throws its error", async () => {
    const events: string[] = [];
    const runner = new ModuleRunner(context());
    const failure = await runner.start(recording(events, ["store", "services", "api", "proxy"], "api")).catch((error: Error) => error);
    expect((failure as Error).message).toBe("api cannot start");
    expect(events).toEqual(["start store", "start services", "start api", "stop api", "stop services", "stop store"]);
  });

  test("a failing stop is logged and the others still stop", async () => {
    const events: string[] = [];
    const runner = new ModuleRunner(context());
    const broken: Module = {
      name: "broken",
      start() {},
      stop() {
        throw new Error("cannot stop");
      },
    };
    await runner.start([...recording(events, ["store"]), broken, ...recording(events, ["api"])]);
    await runner.stop();
    expect(events).toEqual(["start store", "start api", "stop api", "stop store"]);
  });
});

/** provisioned makes modules that provision and start, writing both into `events`; the one named `fails` fails its provision. */
function provisioned(events: string[], names: string[], fails?: string): Module[] {
  return names.map(
    (name) =>
      ({
        name,
        async provision() {
          events.push(`provision ${name}`);
          await Bun.sleep(1);
          if (name === fails) throw new Error(`${name} cannot provision`);
        },
        start() {
          events.push(`start ${name}`);
        },
        stop() {
          events.push(`stop ${name}`);
        },
      }) satisfies Module,
  );
}

describe("ModuleRunner's provision", () => {
  test("a plain start provisions and starts each module in turn", async () => {
    const events: string[] = [];
    const runner = new ModuleRunner(context());
    await runner.start([...provisioned(events, ["store"]), ...recording(events, ["take-over"]), ...provisioned(events, ["api"])]);
    await runner.stop();
    expect(events).toEqual([
      "provision store",
      "start store",
      "start take-over",
      "provision api",
      "start api",
      "stop api",
      "stop take-over",
      "stop store",
    ]);
  });

  test("provisionFirst provisions every module before the first one starts", async () => {
    const events: string[] = [];
    const runner = new ModuleRunner(context());
    await runner.start([...provisioned(events, ["store"]), ...recording(events, ["take-over"]), ...provisioned(events, ["api"])], {
      provisionFirst: true,
    });
    await runner.stop();
    expect(events).toEqual([
      "provision store",
      "provision api",
      "start store",
      "start take-over",
      "start api",
      "stop api",
      "stop take-over",
      "stop store",
    ]);
  });

  test("a failed provision stops every module provisioned so far, none having started", async () => {
    const events: string[] = [];
    const runner = new ModuleRunner(context());
    const failure = await runner
      .start(provisioned(events, ["store", "services", "api", "proxy"], "api"), { provisionFirst: true })
      .catch((error: Error) => error);
    expect((failure as Error).message).toBe("api cannot provision");
    expect(events).toEqual(["provision store", "provision services", "provision api", "stop api", "stop services", "stop store"]);
  });

  test("a failed start after every provision stops them all in reverse", async () => {
    const events: string[] = [];
    const runner = new ModuleRunner(context());
    const failure = await runner
      .start([...provisioned(events, ["store"]), ...recording(events, ["take-over"], "take-over"), ...provisioned(events, ["api"])], {
        provisionFirst: true,
      })
      .catch((error: Error) => error);
    expect((failure as Error).message).toBe("take-over cannot start");
    expect(events).toEqual([
      "provision store",
      "provision api",
      "start store",
      "start take-over",
      "stop api",
      "stop take-over",
      "stop store",
    ]);
  });
});

describe("EngineBus", () => {
  test("get answers what was provided, find answers undefined before, and a second provide is refused", () => {
    const bus = new EngineBus();
    expect(bus.find("secretKey")).toBeUndefined();
    expect(() => bus.get("secretKey")).toThrow("secretKey is asked for before its module started");
    const key = Buffer.from("k");
    bus.provide("secretKey", key);
    expect(bus.get("secretKey")).toBe(key);
    expect(() => bus.provide("secretKey", key)).toThrow("secretKey is provided twice");
  });
});
