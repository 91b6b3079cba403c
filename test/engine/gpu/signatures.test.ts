import { describe, expect, test } from "bun:test";
import { findGpuOom, findPermissionDenied } from "../../../src/engine/gpu";

describe("findGpuOom", () => {
  test.each([
    {
      signature: "pytorch_cuda_oom",
      line:
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 3.12 GiB is free. " +
        "Including non-PyTorch memory, this process has 75.97 GiB memory in use. Of the allocated memory 74.51 GiB is allocated by PyTorch, and " +
        "843.21 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting " +
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
    },
    {
      signature: "pytorch_cuda_oom",
      line: "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.65 GiB total capacity; 20.11 GiB already allocated; 1.36 GiB free; 21.04 GiB reserved in total by PyTorch)",
    },
    {
      signature: "pytorch_cuda_oom",
      line: "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 23.64 GiB of which 301.81 MiB is free.",
    },
    {
      signature: "llama_cpp_cuda_malloc",
      line: "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 13285.50 MiB on device 0: cudaMalloc failed: out of memory",
    },
    {
      signature: "llama_cpp_buffer_alloc",
      line: "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 1: failed",
    },
    { signature: "llama_cpp_buffer_alloc", line: "alloc_tensor_range: failed to allocate CUDA0 buffer of size 1879048192" },
    { signature: "llama_cpp_buffer_alloc", line: "llama_model_load: error loading model: unable to allocate CUDA0 buffer" },
    {
      signature: "vllm_kv_cache",
      line: "ERROR 05-12 10:14:03 engine.py:366] ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.",
    },
    {
      signature: "cuda_error_oom",
      line: 'time=2025-03-02T09:41:17.512Z level=ERROR source=sched.go:455 msg="error loading llama server" error="llama runner process has terminated: CUDA error: out of memory"',
    },
    { signature: "cuda_error_oom", line: "CUDA error: out of memory" },
    {
      signature: "tensorflow_oom",
      line:
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[32,1024,1024] and type float " +
        "on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc [Op:MatMul]",
    },
    { signature: "cublas_alloc_failed", line: "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`" },
    {
      signature: "cuda_driver_oom",
      line: "2025-01-10 12:00:00.000000: E external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:1152] failed to alloc 2147483648 bytes on host: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
    },
    {
      signature: "xla_oom",
      line: "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.",
    },
  ])("$signature: $line", ({ signature, line }) => {
    expect(findGpuOom(["Loading model weights...", line, "Traceback (most recent call last):"])).toEqual({ signature, line });
  });

  test.each([
    "Out of memory: Killed process 48213 (python3) total-vm:61234820kB, anon-rss:58123456kB, file-rss:0kB, shmem-rss:0kB",
    "INFO 05-12 10:13:58 gpu_executor.py:122] # GPU blocks: 27205, # CPU blocks: 2048",
    "llama_kv_cache_init:      CUDA0 KV buffer size =  1024.00 MiB",
    'time=2025-03-02T09:41:12.003Z level=INFO source=memory.go:309 msg="offload to cuda" memory.required.full="5.4 GiB" memory.available="[23.3 GiB]"',
    "Memory usage: 70.2 GiB / 79.1 GiB (88%)",
    "INFO: setting gpu_memory_utilization=0.90 to leave room for the CUDA graphs",
    "hint: reduce the batch size if you run out of memory",
  ])("not an OOM: %s", (line) => {
    expect(findGpuOom([line])).toBeNull();
  });

  test("the first OOM line is the one reported", () => {
    const lines = [
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB.",
      "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    ];
    expect(findGpuOom(lines)).toEqual({ signature: "pytorch_cuda_oom", line: lines[0]! });
  });

  test("no lines, no match", () => {
    expect(findGpuOom([])).toBeNull();
  });
});

describe("findPermissionDenied", () => {
  test.each([
    { signature: "permission_denied", line: "PermissionError: [Errno 13] Permission denied: '/data/models/llama-3-8b'" },
    { signature: "permission_denied", line: "/usr/local/bin/docker-entrypoint.sh: line 12: /app/start.sh: Permission denied" },
    { signature: "eacces", line: "Error: EACCES: permission denied, open '/var/lib/engine/data/db.sqlite'" },
    { signature: "eperm", line: "Error: EPERM: operation not permitted, chmod '/srv/app/cache'" },
    { signature: "operation_not_permitted", line: "chown: changing ownership of '/data': Operation not permitted" },
    { signature: "operation_not_permitted", line: "mount: /mnt/models: operation not permitted." },
  ])("$signature: $line", ({ signature, line }) => {
    expect(findPermissionDenied(["starting", line])).toEqual({ signature, line });
  });

  test.each([
    "checking permissions on /data/models",
    "permission granted for user app",
    "INFO: PERMISSIONS=0644 applied to 12 files",
    "EPERMANENTLY_FAILED is not an errno",
  ])("not a refusal: %s", (line) => {
    expect(findPermissionDenied([line])).toBeNull();
  });
});
