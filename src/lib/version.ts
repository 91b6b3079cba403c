import pkg from "../../package.json" with { type: "json" };

/** VERSION is the engine's release line, from package.json (bundled into the binary at build time). */
export const VERSION: string = pkg.version;
