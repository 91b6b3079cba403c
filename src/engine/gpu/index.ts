/**
 * Package gpu knows the host's GPUs (inventory), decides which service gets which of them
 * (placement), and recognises GPU out-of-memory and permission failures in service logs
 * (signatures).
 */
export {
  applyMigInstances,
  DECLARED_GPU_DEFAULT_MB,
  DECLARED_GPU_MAX_COUNT,
  deviceLabel,
  type GpuDevice,
  GpuInventory,
  type GpuInventoryLog,
  type GpuInventoryOptions,
  type GpuListing,
  type GpuParse,
  type GpuSnapshot,
  type MigInstance,
  migProfileMemoryMb,
  NVIDIA_SMI_LIST,
  NVIDIA_SMI_QUERY,
  parseDeclaredGpus,
  parseNvidiaSmiCsv,
  parseNvidiaSmiList,
  shortUuid,
} from "./inventory";
export {
  checkPossible,
  describeAllocation,
  type GpuAllocation,
  type GpuEnvironment,
  type GpuRequest,
  type PlacementPlan,
  planPlacement,
  queueOrder,
  type WaitingRequest,
} from "./placement";
export { type GpuRouteDeps, gpuRoutes } from "./routes";
export {
  findGpuOom,
  findPermissionDenied,
  GPU_OOM_SIGNATURES,
  type LogMatch,
  type LogSignature,
  PERMISSION_SIGNATURES,
} from "./signatures";
export {
  type ComputeApp,
  type GpuReading,
  type GpuTelemetry,
  NVIDIA_SMI_COMPUTE_APPS,
  NVIDIA_SMI_TELEMETRY,
  parseComputeApps,
  parseTelemetryCsv,
  readGpuTelemetry,
} from "./telemetry";
