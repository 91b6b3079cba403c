import { Elysia } from "elysia";
import { AUTHED, errorResponses, GpuInventoryRecord } from "../../contract/engine";

/**
 * GpuRouteDeps are what the GPU route needs: the inventory with its holders, which the
 * services' coordinator answers (it knows which service holds what).
 */
export interface GpuRouteDeps {
  services: { gpuInventory(): GpuInventoryRecord };
}

/** gpuRoutes serves the GPU inventory. */
export function gpuRoutes(deps: GpuRouteDeps) {
  return new Elysia({ name: "gpus" }).get("/api/gpus", () => deps.services.gpuInventory(), {
    response: { 200: GpuInventoryRecord, ...errorResponses(...AUTHED) },
    detail: { tags: ["gpus"], summary: "GPU inventory (detected by nvidia-smi, or declared) and which service holds what" },
  });
}
