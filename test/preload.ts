/**
 * Preloaded by `bun test` (bunfig.toml): an afterAll here runs once, after every test file of the
 * run, where the shared directories of test/run-dirs.ts are removed.
 */
import { afterAll } from "bun:test";
import { removeRunDirs } from "./run-dirs";

afterAll(removeRunDirs);
