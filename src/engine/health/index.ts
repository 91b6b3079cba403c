/**
 * The health module probes services over http, tcp or a command, and watches them over time
 * with HealthMonitor, which tells its owner when a service turns healthy or unhealthy and when
 * its failures reach the threshold at which the supervisor should act.
 */
export { type HealthHooks, HealthMonitor, type HealthMonitorOptions, type HealthState } from "./monitor";
export { type ProbeOptions, runProbe } from "./probe";
export { type HealthSpec, type ProbeResult, type ProbeTarget, parseHealthShorthand, SHORTHAND_DEFAULTS } from "./spec";
