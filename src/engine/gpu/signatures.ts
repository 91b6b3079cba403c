/** LogSignature is a named pattern that recognises one kind of failure in a log line. */
export interface LogSignature {
  signature: string;
  pattern: RegExp;
}

/** LogMatch is the first log line that matched a signature, and which signature it was. */
export interface LogMatch {
  signature: string;
  line: string;
}

/**
 * GPU_OOM_SIGNATURES are the lines that inference and training runtimes print when they run
 * out of GPU memory. They name the GPU runtime (CUDA, cuBLAS, a CUDA buffer), so the kernel's
 * "Out of memory: Killed process" and lines that merely report memory use do not match.
 */
export const GPU_OOM_SIGNATURES: readonly LogSignature[] = [
  // PyTorch: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has ..."
  { signature: "pytorch_cuda_oom", pattern: /torch\.(?:cuda\.)?OutOfMemoryError|CUDA out of memory/ },
  // Ollama and PyTorch's generic path: "CUDA error: out of memory"
  { signature: "cuda_error_oom", pattern: /CUDA error: out of memory/i },
  // llama.cpp: "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 0: cudaMalloc failed: out of memory"
  { signature: "llama_cpp_cuda_malloc", pattern: /cudaMalloc failed: out of memory/ },
  { signature: "llama_cpp_buffer_alloc", pattern: /ggml_backend_cuda_buffer_type_alloc_buffer: allocating .*failed/ },
  // llama.cpp: "alloc_tensor_range: failed to allocate CUDA0 buffer of size 1879048192"
  { signature: "llama_cpp_buffer_alloc", pattern: /(?:failed|unable) to allocate CUDA\d* buffer/ },
  // vLLM: "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` ..."
  { signature: "vllm_kv_cache", pattern: /No available memory for the cache blocks/ },
  // TensorFlow: "ResourceExhaustedError: OOM when allocating tensor with shape[...]"
  { signature: "tensorflow_oom", pattern: /OOM when allocating tensor/ },
  { signature: "cublas_alloc_failed", pattern: /CUBLAS_STATUS_ALLOC_FAILED/ },
  // The CUDA driver and runtime API names, as ONNX Runtime, TensorFlow and others print them.
  { signature: "cuda_driver_oom", pattern: /CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation/ },
  // JAX / XLA: "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes."
  { signature: "xla_oom", pattern: /RESOURCE_EXHAUSTED: Out of memory while trying to allocate/ },
];

/** PERMISSION_SIGNATURES are the lines of a process refused access to a file or an operation. */
export const PERMISSION_SIGNATURES: readonly LogSignature[] = [
  // Node and libuv put the errno name first: "Error: EACCES: permission denied, open '/data/x'".
  { signature: "eacces", pattern: /\bEACCES\b/ },
  { signature: "eperm", pattern: /\bEPERM\b/ },
  { signature: "permission_denied", pattern: /permission denied/i },
  { signature: "operation_not_permitted", pattern: /operation not permitted/i },
];

function findFirst(lines: readonly string[], signatures: readonly LogSignature[]): LogMatch | null {
  for (const line of lines) {
    for (const { signature, pattern } of signatures) {
      if (pattern.test(line)) return { signature, line };
    }
  }
  return null;
}

/**
 * findGpuOom returns the first line that says a process ran out of GPU memory, with the
 * signature that recognised it, or null. The first line is the cause; what follows is fallout.
 */
export function findGpuOom(lines: readonly string[]): LogMatch | null {
  return findFirst(lines, GPU_OOM_SIGNATURES);
}

/** findPermissionDenied returns the first line that says a process was refused a file or an operation, or null. */
export function findPermissionDenied(lines: readonly string[]): LogMatch | null {
  return findFirst(lines, PERMISSION_SIGNATURES);
}
