/** Clock is the source of time for modules, so tests can move it. */
export interface Clock {
  now(): Date;
}

export const systemClock: Clock = { now: () => new Date() };

/** iso formats a date as the API's date-time strings are written: RFC 3339, UTC, milliseconds. */
export function iso(date: Date): string {
  return date.toISOString();
}
