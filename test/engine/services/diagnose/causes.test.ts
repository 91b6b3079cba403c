import { describe, expect, test } from "bun:test";
import type { LogLine } from "../../../../src/contract/engine";
import {
  causeRule,
  findLogCause,
  KEY_LINE_MAX,
  KEY_SCAN_LINES,
  LOG_CAUSES,
  type LogCause,
  portsInArgs,
  redactor,
} from "../../../../src/engine/services/diagnose";
import { portsIn } from "../../../../src/engine/services/diagnose/causes";

/** output turns a block of text into log lines of one stream, as the shim records them. */
function output(text: string, stream = "stderr"): LogLine[] {
  return text
    .replace(/^\n/, "")
    .split("\n")
    .map((line, index) => ({ ts: `2025-06-01T10:00:${String(index % 60).padStart(2, "0")}.000000000Z`, stream, line }));
}

const PY_HTTP_SERVER_PORT = `
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "<frozen runpy>", line 88, in _run_code
  File "/usr/lib/python3.11/http/server.py", line 1313, in <module>
    test(
  File "/usr/lib/python3.11/http/server.py", line 1260, in test
    with ServerClass(addr, HandlerClass) as httpd:
         ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/usr/lib/python3.11/socketserver.py", line 456, in __init__
    self.server_bind()
  File "/usr/lib/python3.11/http/server.py", line 1307, in server_bind
    return super().server_bind()
           ^^^^^^^^^^^^^^^^^^^^^
  File "/usr/lib/python3.11/http/server.py", line 136, in server_bind
    socketserver.TCPServer.server_bind(self)
  File "/usr/lib/python3.11/socketserver.py", line 472, in server_bind
    self.socket.bind(self.server_address)
OSError: [Errno 98] Address already in use`;

const PY_SCRIPT_PORT = `
Traceback (most recent call last):
  File "/srv/app/serve.py", line 9, in <module>
    sock.bind(("127.0.0.1", 8000))
OSError: [Errno 98] Address already in use`;

const NODE_PORT = `
node:events:502
      throw er; // Unhandled 'error' event
      ^

Error: listen EADDRINUSE: address already in use :::43571
    at Server.setupListenHandle [as _listen2] (node:net:1908:16)
    at listenInCluster (node:net:1965:12)
    at Server.listen (node:net:2067:7)
    at Object.<anonymous> (/srv/app/index.js:4:8)
Emitted 'error' event on Server instance at:
    at emitErrorNT (node:net:1944:8)
    at process.processTicksAndRejections (node:internal/process/task_queues:82:21) {
  code: 'EADDRINUSE',
  errno: -98,
  syscall: 'listen',
  address: '::',
  port: 43571
}

Node.js v20.20.2`;

const BUN_PORT = `
1 | const a = Bun.serve({ port: 0, fetch: () => new Response() });
2 | Bun.serve({ port: a.port, fetch: () => new Response() });
        ^
error: Failed to start server. Is port 34565 in use?
 syscall: "listen",
   errno: 0,
    code: "EADDRINUSE"

      at /srv/app/index.ts:2:5

Bun v1.2.5 (Linux x64)`;

const UVICORN_PORT = `
INFO:     Started server process [48213]
INFO:     Waiting for application startup.
INFO:     Application startup complete.
ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use
INFO:     Waiting for application shutdown.
INFO:     Application shutdown complete.`;

const GO_PORT = "2025/06/01 10:00:00 listen tcp :8080: bind: address already in use";

const PY_MODULE = `
Traceback (most recent call last):
  File "<string>", line 1, in <module>
ModuleNotFoundError: No module named 'nonexistent_mod'`;

const PY_MODULE_NESTED = `
Traceback (most recent call last):
  File "/srv/app/main.py", line 3, in <module>
    import cv2.dnn
ModuleNotFoundError: No module named 'cv2'`;

const PY_IMPORT_NAME = `
Traceback (most recent call last):
  File "/srv/app/main.py", line 1, in <module>
    from transformers import LlamaForCausalLM
ImportError: cannot import name 'LlamaForCausalLM' from 'transformers' (/usr/lib/python3/dist-packages/transformers/__init__.py)`;

const NODE_MODULE = `
node:internal/modules/cjs/loader:1228
  throw err;
  ^

Error: Cannot find module 'express'
Require stack:
- /srv/app/index.js
    at Module._resolveFilename (node:internal/modules/cjs/loader:1225:15)
    at Module._load (node:internal/modules/cjs/loader:1051:27)
    at Object.<anonymous> (/srv/app/index.js:1:17) {
  code: 'MODULE_NOT_FOUND',
  requireStack: [ '/srv/app/index.js' ]
}

Node.js v20.20.2`;

const NODE_ESM_PACKAGE = `
node:internal/errors:496
    ErrorCaptureStackTrace(err);
    ^

Error [ERR_MODULE_NOT_FOUND]: Cannot find package 'fastify' imported from /srv/app/server.mjs
    at new NodeError (node:internal/errors:405:5)
    at packageResolve (node:internal/modules/esm/resolve:916:9) {
  code: 'ERR_MODULE_NOT_FOUND'
}`;

const NODE_ENTRY = `
node:internal/modules/cjs/loader:1228
  throw err;
  ^

Error: Cannot find module '/srv/app/server.js'
    at Module._resolveFilename (node:internal/modules/cjs/loader:1225:15)
    at node:internal/main/run_main_module:28:49 {
  code: 'MODULE_NOT_FOUND',
  requireStack: []
}`;

const PY_FILE = `
Loading weights...
Traceback (most recent call last):
  File "/srv/app/load.py", line 4, in <module>
    with open("/models/llama/weights.bin", "rb") as f:
         ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
FileNotFoundError: [Errno 2] No such file or directory: '/models/llama/weights.bin'`;

const NODE_FILE = `
node:fs:573
  return binding.open(
                 ^

Error: ENOENT: no such file or directory, open 'config/settings.json'
    at Object.openSync (node:fs:573:18)
    at Object.readFileSync (node:fs:452:35) {
  errno: -2,
  code: 'ENOENT',
  syscall: 'open',
  path: 'config/settings.json'
}`;

const PY_SCRIPT_MISSING = "/usr/bin/python3: can't open file '/srv/app/mian.py': [Errno 2] No such file or directory";

const CUDA_DRIVER = `
Traceback (most recent call last):
  File "/srv/app/train.py", line 12, in <module>
    model.to("cuda")
  File "/usr/lib/python3/dist-packages/torch/cuda/__init__.py", line 314, in _lazy_init
    torch._C._cuda_init()
RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please update your GPU driver by downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx`;

const CUDA_NO_DEVICE = `
Traceback (most recent call last):
  File "/srv/app/serve.py", line 3, in <module>
    torch.zeros(1).cuda()
RuntimeError: No CUDA GPUs are available`;

const LIBCUDA = `
Traceback (most recent call last):
  File "/srv/app/main.py", line 1, in <module>
    import tensorflow as tf
ImportError: libcuda.so.1: cannot open shared object file: No such file or directory`;

const HF_REPO = `
huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. (Request ID: Root=1-6650f0a1-3b2c)

Repository Not Found for url: https://huggingface.co/meta-llama/Llama-3-8B-Instructt/resolve/main/config.json.
Please make sure you specified the correct \`repo_id\` and \`repo_type\`.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/srv/app/serve.py", line 5, in <module>
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3-8B-Instructt")
OSError: meta-llama/Llama-3-8B-Instructt is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'
If this is a private repository, make sure to pass a token having permission to this repo either by logging in with \`huggingface-cli login\` or by passing \`token=<your_token>\``;

const HF_VALIDATION =
  "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/models/llama/'. Use `repo_type` argument if needed.";

const HF_OFFLINE = `
urllib3.exceptions.NameResolutionError: <urllib3.connection.HTTPSConnection object at 0x7f0c>: Failed to resolve 'huggingface.co' ([Errno -3] Temporary failure in name resolution)

The above exception was the direct cause of the following exception:

requests.exceptions.ConnectionError: (MaxRetryError("HTTPSConnectionPool(host='huggingface.co', port=443): Max retries exceeded with url: /gpt2/resolve/main/config.json (Caused by NameResolutionError(\\"<urllib3.connection.HTTPSConnection object at 0x7f0c>: Failed to resolve 'huggingface.co' ([Errno -3] Temporary failure in name resolution)\\"))"), '(Request ID: 5d1b)')

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/srv/app/serve.py", line 4, in <module>
    tok = AutoTokenizer.from_pretrained("gpt2")
OSError: We couldn't connect to 'https://huggingface.co' to load this file, couldn't find it in the cached files and it looks like gpt2 is not the path to a directory containing a file named config.json.
Checkout your internet connection or see how to run the library in offline mode at 'https://huggingface.co/docs/transformers/installation#offline-mode'.`;

const UNREACHABLE =
  "urllib3.exceptions.MaxRetryError: HTTPSConnectionPool(host='huggingface.co', port=443): Max retries exceeded with url: /api/models/gpt2 (Caused by NewConnectionError('<urllib3.connection.HTTPSConnection object at 0x7f2e>: Failed to establish a new connection: [Errno 101] Network is unreachable'))";

const PG_REFUSED = `
Traceback (most recent call last):
  File "/srv/app/db.py", line 3, in <module>
    conn = psycopg2.connect(os.environ["DATABASE_URL"])
psycopg2.OperationalError: connection to server at "127.0.0.1", port 5432 failed: Connection refused
	Is the server running on that host and accepting TCP/IP connections?`;

const NODE_REFUSED = `
Error: connect ECONNREFUSED 127.0.0.1:6379
    at TCPConnectWrap.afterConnect [as oncomplete] (node:net:1555:16) {
  errno: -111,
  code: 'ECONNREFUSED',
  syscall: 'connect',
  address: '127.0.0.1',
  port: 6379
}`;

const GO_PANIC = `
panic: runtime error: index out of range [5] with length 3

goroutine 1 [running]:
main.main()
	/srv/app/main.go:8 +0x1d
exit status 2`;

describe("findLogCause over real output", () => {
  test.each([
    {
      name: "python http.server",
      text: PY_HTTP_SERVER_PORT,
      cls: "port_in_use",
      key: "OSError: [Errno 98] Address already in use",
      port: null,
    },
    { name: "python script", text: PY_SCRIPT_PORT, cls: "port_in_use", key: "OSError: [Errno 98] Address already in use", port: 8000 },
    {
      name: "node listen",
      text: NODE_PORT,
      cls: "port_in_use",
      key: "Error: listen EADDRINUSE: address already in use :::43571",
      port: 43571,
    },
    { name: "bun serve", text: BUN_PORT, cls: "port_in_use", key: "error: Failed to start server. Is port 34565 in use?", port: 34565 },
    { name: "uvicorn", text: UVICORN_PORT, cls: "port_in_use", key: UVICORN_PORT.split("\n")[4], port: 8000 },
    { name: "go", text: GO_PORT, cls: "port_in_use", key: GO_PORT, port: 8080 },
  ])("a port clash: $name", ({ text, cls, key, port }) => {
    const cause = findLogCause(output(text));
    expect(cause).toMatchObject({ class: cls, remediation: "free_port", key_line: key, port, stream: "stderr" });
  });

  test.each([
    {
      name: "python -c import",
      text: PY_MODULE,
      cls: "module_not_found",
      code: "install_module",
      subject: "nonexistent_mod",
      key: "ModuleNotFoundError: No module named 'nonexistent_mod'",
    },
    {
      name: "python submodule",
      text: PY_MODULE_NESTED,
      cls: "module_not_found",
      code: "install_module",
      subject: "cv2",
      key: "ModuleNotFoundError: No module named 'cv2'",
    },
    {
      name: "python import name",
      text: PY_IMPORT_NAME,
      cls: "module_not_found",
      code: "install_module",
      subject: "LlamaForCausalLM",
      key: PY_IMPORT_NAME.split("\n")[4],
    },
    {
      name: "node require",
      text: NODE_MODULE,
      cls: "module_not_found",
      code: "install_module",
      subject: "express",
      key: "Error: Cannot find module 'express'",
    },
    {
      name: "node esm",
      text: NODE_ESM_PACKAGE,
      cls: "module_not_found",
      code: "install_module",
      subject: "fastify",
      key: NODE_ESM_PACKAGE.split("\n")[5],
    },
    {
      name: "node entry script",
      text: NODE_ENTRY,
      cls: "file_not_found",
      code: "provide_file",
      subject: "/srv/app/server.js",
      key: "Error: Cannot find module '/srv/app/server.js'",
    },
    {
      name: "python open",
      text: PY_FILE,
      cls: "file_not_found",
      code: "provide_file",
      subject: "/models/llama/weights.bin",
      key: "FileNotFoundError: [Errno 2] No such file or directory: '/models/llama/weights.bin'",
    },
    {
      name: "node open",
      text: NODE_FILE,
      cls: "file_not_found",
      code: "provide_file",
      subject: "config/settings.json",
      key: "Error: ENOENT: no such file or directory, open 'config/settings.json'",
    },
    {
      name: "python script path",
      text: PY_SCRIPT_MISSING,
      cls: "file_not_found",
      code: "provide_file",
      subject: "/srv/app/mian.py",
      key: PY_SCRIPT_MISSING,
    },
    {
      name: "bare file name",
      text: "about to fail: cannot open model.bin",
      cls: "file_not_found",
      code: "provide_file",
      subject: "model.bin",
      key: null,
    },
    {
      name: "crasher",
      text: "boom: cannot open model file",
      cls: "file_not_found",
      code: "provide_file",
      subject: null,
      key: "boom: cannot open model file",
    },
    {
      name: "driver too old",
      text: CUDA_DRIVER,
      cls: "cuda_unavailable",
      code: "check_cuda",
      subject: null,
      key: CUDA_DRIVER.split("\n")[6],
    },
    {
      name: "no CUDA GPUs",
      text: CUDA_NO_DEVICE,
      cls: "cuda_unavailable",
      code: "check_cuda",
      subject: null,
      key: "RuntimeError: No CUDA GPUs are available",
    },
    {
      name: "nvidia-smi",
      text: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.",
      cls: "cuda_unavailable",
      code: "check_cuda",
      subject: null,
      key: null,
    },
    {
      name: "insufficient driver",
      text: "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version",
      cls: "cuda_unavailable",
      code: "check_cuda",
      subject: null,
      key: null,
    },
    {
      name: "no kernel image",
      text: "RuntimeError: CUDA error: no kernel image is available for execution on the device",
      cls: "cuda_unavailable",
      code: "check_cuda",
      subject: null,
      key: null,
    },
    {
      name: "libcuda, not a missing file",
      text: LIBCUDA,
      cls: "cuda_unavailable",
      code: "check_cuda",
      subject: "libcuda.so.1",
      key: LIBCUDA.split("\n")[4],
    },
    {
      name: "libGL",
      text: "ImportError: libGL.so.1: cannot open shared object file: No such file or directory",
      cls: "missing_library",
      code: "install_library",
      subject: "libGL.so.1",
      key: null,
    },
    {
      name: "hf repository",
      text: HF_REPO,
      cls: "model_not_found",
      code: "fix_model",
      subject: "meta-llama/Llama-3-8B-Instructt",
      key: "OSError: meta-llama/Llama-3-8B-Instructt is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'",
    },
    { name: "hf validation", text: HF_VALIDATION, cls: "model_not_found", code: "fix_model", subject: null, key: null },
    {
      name: "gguf",
      text: "gguf_init_from_file: failed to open '/models/llama-3-8b.Q4_K_M.gguf': 'No such file or directory'",
      cls: "model_not_found",
      code: "fix_model",
      subject: "/models/llama-3-8b.Q4_K_M.gguf",
      key: null,
    },
    {
      name: "hf offline",
      text: HF_OFFLINE,
      cls: "network_unreachable",
      code: "check_network",
      subject: "huggingface.co",
      key: HF_OFFLINE.split("\n")[12],
    },
    { name: "unreachable", text: UNREACHABLE, cls: "network_unreachable", code: "check_network", subject: "huggingface.co", key: null },
    {
      name: "curl",
      text: "curl: (6) Could not resolve host: huggingface.co",
      cls: "network_unreachable",
      code: "check_network",
      subject: "huggingface.co",
      key: null,
    },
    {
      name: "postgres refused",
      text: PG_REFUSED,
      cls: "connection_refused",
      code: "start_dependency",
      subject: "127.0.0.1:5432",
      key: PG_REFUSED.split("\n")[4],
    },
    {
      name: "node refused",
      text: NODE_REFUSED,
      cls: "connection_refused",
      code: "start_dependency",
      subject: "127.0.0.1:6379",
      key: "Error: connect ECONNREFUSED 127.0.0.1:6379",
    },
  ])("$name → $cls", ({ text, cls, code, subject, key }) => {
    const cause = findLogCause(output(text)) as LogCause;
    expect(cause).not.toBeNull();
    expect(cause.class).toBe(cls);
    expect(cause.remediation).toBe(code);
    if (subject !== null) expect(cause.subject).toBe(subject);
    expect(cause.key_line).toBe(key ?? text.trim());
    // Every class's row renders a summary and a detail.
    const rule = causeRule(cause);
    expect(rule?.summary(cause, "svc").length).toBeGreaterThan(0);
    expect(
      rule?.detail({ name: "svc", cause, declaredPort: null, gpus: 0, gpuMemoryMb: 0, cwd: "/srv/app", user: null }).length,
    ).toBeGreaterThan(0);
  });

  test("a line no row knows is still the key line: a panic, the last exception, an error: line", () => {
    expect(findLogCause(output(GO_PANIC))).toMatchObject({
      class: null,
      remediation: null,
      key_line: "panic: runtime error: index out of range [5] with length 3",
    });
    const chained = output(`
Traceback (most recent call last):
  File "/srv/app/a.py", line 2, in <module>
    config["model"]
KeyError: 'model'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/srv/app/a.py", line 4, in <module>
    raise SystemExit("no model configured")
ValueError: no model configured`);
    expect(findLogCause(chained)?.key_line).toBe("ValueError: no model configured");
    expect(findLogCause(output("starting\nerror: config key 'workers' must be a number\nbye"))?.key_line).toBe(
      "error: config key 'workers' must be a number",
    );
  });

  test("output with nothing that reads as an error has no key line", () => {
    expect(findLogCause(output("crashing"))).toBeNull();
    expect(findLogCause(output("boom", "stderr"))).toBeNull();
    expect(findLogCause([])).toBeNull();
  });

  test("a GPU out-of-memory line is not CUDA being unavailable (the GPU signatures report it)", () => {
    const cause = findLogCause(output("RuntimeError: CUDA error: out of memory"));
    expect(cause?.class).toBeNull();
    expect(cause?.key_line).toBe("RuntimeError: CUDA error: out of memory");
    expect(findLogCause(output("RuntimeError: CUDA error: device-side assert triggered"))?.class).toBeNull();
  });

  test("stderr is read before stdout, and an early warning does not outrank the exception that ended the run", () => {
    const lines = [
      ...output("Warning: could not open /etc/app/extra.conf, using defaults", "stdout"),
      ...output("Traceback (most recent call last):\n  File \"/srv/app/a.py\", line 2, in <module>\nKeyError: 'model'"),
    ];
    expect(findLogCause(lines)).toMatchObject({ class: null, key_line: "KeyError: 'model'", stream: "stderr" });
    const sameStream = output(
      "Warning: could not open /etc/app/extra.conf, using defaults\nTraceback (most recent call last):\nKeyError: 'model'",
    );
    expect(findLogCause(sameStream)).toMatchObject({ class: null, key_line: "KeyError: 'model'" });
    // A recognised cause on stdout beats a bare error: line on stderr.
    const both = [...output("error: giving up"), ...output("OSError: [Errno 98] Address already in use", "stdout")];
    expect(findLogCause(both)).toMatchObject({ class: "port_in_use", stream: "stdout" });
    // Between equals, stderr.
    const equal = [...output("Error: from stdout", "stdout"), ...output("Error: from stderr")];
    expect(findLogCause(equal)?.key_line).toBe("Error: from stderr");
  });

  test("only the last KEY_SCAN_LINES lines and KEY_SCAN_BYTES are read", () => {
    const noise = Array.from({ length: KEY_SCAN_LINES }, (_, index) => `step ${index} ok`).join("\n");
    expect(findLogCause(output(`OSError: [Errno 98] Address already in use\n${noise}`))).toBeNull();
    expect(findLogCause(output(`OSError: [Errno 98] Address already in use\n${noise.split("\n").slice(1).join("\n")}`))?.class).toBe(
      "port_in_use",
    );
    const wide = Array.from({ length: 20 }, () => "x".repeat(4000)).join("\n");
    expect(findLogCause(output(`ModuleNotFoundError: No module named 'a'\n${wide}`))).toBeNull();
  });

  test("a long key line is cut to KEY_LINE_MAX with its match in view; colour codes are dropped", () => {
    const long = `ERROR ${"padding ".repeat(80)}OSError: [Errno 98] Address already in use ${"tail ".repeat(100)}`;
    const cause = findLogCause(output(long)) as LogCause;
    expect(cause.key_line.length).toBeLessThanOrEqual(KEY_LINE_MAX);
    expect(cause.key_line).toContain("Address already in use");
    expect(findLogCause(output("\x1b[31mError: boom\x1b[0m"))?.key_line).toBe("Error: boom");
  });

  test("secrets are redacted from the key line and the subject before it is cut", () => {
    const redact = redactor(["hunter2-secret", ""]);
    const cause = findLogCause(
      output("psycopg2.OperationalError: connection to postgres://app:pw-in-url@db:5432/app failed: password hunter2-secret rejected"),
      redact,
    ) as LogCause;
    expect(cause.key_line).not.toContain("hunter2-secret");
    expect(cause.key_line).not.toContain("pw-in-url");
    expect(cause.key_line).toContain("postgres://app:***@db:5432/app");
    const file = findLogCause(
      output("FileNotFoundError: [Errno 2] No such file or directory: '/data/hunter2-secret.key'"),
      redact,
    ) as LogCause;
    expect(file.subject).toBe("/data/***.key");
  });
});

describe("the table", () => {
  test("every row has a class, a remediation code and patterns; (class, code) pairs name one behaviour", () => {
    for (const rule of LOG_CAUSES) {
      expect(rule.class).toMatch(/^[a-z_]+$/);
      expect(rule.remediation).toMatch(/^[a-z_]+$/);
      expect(rule.patterns.length).toBeGreaterThan(0);
    }
  });

  test("remediations that change a setting print the command", () => {
    const base = { name: "web2", declaredPort: null, gpus: 0, gpuMemoryMb: 0, cwd: "/srv/app", user: null };
    const cause = (fields: Partial<LogCause>): LogCause => ({
      class: null,
      remediation: null,
      key_line: "",
      stream: "stderr",
      subject: null,
      port: null,
      holder: null,
      free_port: null,
      ...fields,
    });
    const port = causeRule({ class: "port_in_use", remediation: "free_port" });
    const held = cause({
      class: "port_in_use",
      port: 8000,
      free_port: 8001,
      holder: { pid: 42, command: "python3 -m http.server 8000", service: "web1", engine: false, user: "eng-web1" },
    });
    expect(port?.summary(held, "web2")).toBe("port 8000 is already in use: the engine service web1 holds it (pid 42)");
    expect(port?.detail({ ...base, cause: held })).toContain("`engine services stop web1`");
    const own = cause({ ...held, holder: { pid: 42, command: null, service: "web2", engine: false, user: "eng-web2" } });
    expect(port?.summary(own, "web2")).toBe("port 8000 is already in use: an earlier process of this service still holds it (pid 42)");
    expect(port?.detail({ ...base, cause: own })).toContain("`engine services restart web2`");
    expect(port?.detail({ ...base, declaredPort: 8000, cause: held })).toContain("`engine services update web2 --port 8001`");
    const outside = cause({
      class: "port_in_use",
      port: 8000,
      holder: { pid: 99, command: "nginx: master process", service: null, engine: false, user: "root" },
    });
    expect(port?.detail({ ...base, cause: outside })).toContain("pid 99 (nginx: master process), a process outside the engine");
    const cuda = causeRule({ class: "cuda_unavailable", remediation: "check_cuda" });
    expect(cuda?.detail({ ...base, cause: cause({ class: "cuda_unavailable" }) })).toContain("`engine services update web2 --gpus 1`");
    const model = causeRule({ class: "model_not_found", remediation: "fix_model" });
    expect(model?.detail({ ...base, cause: cause({ class: "model_not_found", subject: "org/name" }) })).toContain(
      "`engine services update web2 --secret HF_TOKEN=<token>`",
    );
    const module = causeRule({ class: "module_not_found", remediation: "install_module" });
    expect(module?.detail({ ...base, cause: cause({ subject: "cv2", key_line: "ModuleNotFoundError: No module named 'cv2'" }) })).toContain(
      "`python3 -m pip install opencv-python`",
    );
    expect(module?.detail({ ...base, cause: cause({ subject: "express", key_line: "Error: Cannot find module 'express'" }) })).toContain(
      "`npm install express`",
    );
  });
});

describe("ports in text and in a command line", () => {
  test.each([
    ["Error: listen EADDRINUSE: address already in use :::3000", [3000]],
    ["listen tcp 127.0.0.1:8080: bind: address already in use", [8080]],
    ["listen tcp :8080: bind: address already in use", [8080]],
    ["ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use", [8000]],
    ["Port 5000 is in use by another program.", [5000]],
    ["  port: 43571", [43571]],
    ["OSError: [Errno 98] Address already in use", []],
    ["2025/06/01 10:00:00 started at 10:00:00", []],
    ['  File "/srv/app/a.py", line 9, in <module>', []],
  ])("%s", (text, ports) => {
    expect(portsIn(text)).toEqual(ports);
  });

  test("portsInArgs reads bare numbers, --port=N and host:port", () => {
    expect(portsInArgs(["python3", "-m", "http.server", "--bind", "127.0.0.1", "8000"])).toEqual([8000]);
    expect(portsInArgs(["/bin/sh", "-c", "uvicorn app:app --port=9000 --host 0.0.0.0"])).toEqual([9000]);
    expect(portsInArgs(["gunicorn", "-b", "0.0.0.0:7000", "app:app"])).toEqual([7000]);
    expect(portsInArgs(["sleep", "3"])).toEqual([]);
  });
});
