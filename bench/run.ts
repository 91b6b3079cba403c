/** bench/run.ts runs every benchmark in turn (npm run bench). Each prints its figures next to their anchors. */
import { join } from "node:path";

const benches = [
  "api.ts",
  "restart.ts",
  "crash.ts",
  "scheduler.ts",
  "proxy.ts",
  "cloud.ts",
  "restore.ts",
  "ui.ts",
  "mcp.ts",
  "metrics.ts",
  "hosted.ts",
];
for (const bench of benches) {
  const result = Bun.spawnSync([process.execPath, join(import.meta.dir, bench), ...process.argv.slice(2)], {
    stdout: "inherit",
    stderr: "inherit",
  });
  if (result.exitCode !== 0) process.exit(result.exitCode ?? 1);
}
