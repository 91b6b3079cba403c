/**
 * Package scheduler runs services: a pure placement plan (which pending services start now,
 * with which GPUs), one ServiceRunner per service (launch through the prestart hooks, stop,
 * exit and retry), and the exit rules in one file (exit.ts). ServiceManager, the services'
 * coordinator, decides when; the scheduler does.
 */
export { describeExit, type ExitFacts, type ExitPlan, planExit } from "./exit";
export { type HookHost, type Launch, type ManagedDatabase, PREPARE_HOOKS, PRESTART_HOOKS, userEnv } from "./hooks";
export { Placement, type PlacementContext } from "./placement";
export { gpuRequestOf, type Holding, type LaunchPlan, type PendingService, planLaunches, type TokenCaps } from "./plan";
export { RETRY_SOON_MS, type RunnerContext, type RunnerHost, ServiceRunner } from "./runner";
export { ExitSettler, type SettleContext } from "./settle";
