import pkg from "../../package.json" with { type: "json" };

declare const __ENGINE_VERSION__: string | undefined;

/**
 * VERSION is the engine's release line, from package.json (bundled into the binary at build
 * time), unless the build stamped another (`bun build.ts --version X.Y.Z`).
 */
export const VERSION: string = typeof __ENGINE_VERSION__ !== "undefined" ? __ENGINE_VERSION__ : pkg.version;
