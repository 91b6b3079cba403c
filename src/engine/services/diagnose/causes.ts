import type { LogLine } from "../../../contract/engine";

/**
 * Causes reads the last run's output for the line that matters, the key line, and names the
 * common failures it recognises. LOG_CAUSES is the one table of them: pattern → class,
 * remediation code, the cause's summary and the remediation's detail. The table's order is the
 * precedence when a run's output matches several rows. Everything here is pure: the manager
 * reads the log, finds who holds a port and redacts secrets; Diagnosis renders the detail.
 */

/** KEY_SCAN_LINES and KEY_SCAN_BYTES bound how much of a run's output is read for its key line. */
export const KEY_SCAN_LINES = 200;
export const KEY_SCAN_BYTES = 64 * 1024;
/** KEY_LINE_MAX is the longest key line Diagnosis carries; a longer one is cut around its match. */
export const KEY_LINE_MAX = 300;
/** SCAN_LINE_MAX is how much of one very long line the patterns look at. */
const SCAN_LINE_MAX = 4096;

/** PortHolder is who listened on a clashing port when the run ended. */
export interface PortHolder {
  /** pid is null when a listener exists but the engine may not see its process. */
  pid: number | null;
  command: string | null;
  /** service is the engine service whose run the process belongs to; null for an outside process. */
  service: string | null;
  /** engine is true when the holder is the engine daemon itself (its API or proxy). */
  engine: boolean;
  /** user is the owner of the listening socket, by name where /etc/passwd has it. */
  user: string | null;
}

/**
 * LogCause is what the engine read in a run's output: the key line, the class it recognised
 * (null: a key line but no known class) and the facts its remediation needs. It is stored
 * with the service's forensics, so Diagnosis shows what was true when the run ended.
 */
export interface LogCause {
  class: string | null;
  remediation: string | null;
  key_line: string;
  stream: string;
  /** subject is what the line names: a path, a module, a model, a host; null when it names none. */
  subject: string | null;
  /** port is the clashing port (port_in_use) or the refused one (connection_refused), when known. */
  port: number | null;
  holder: PortHolder | null;
  /** free_port is a port nothing listened on when the run ended, offered for `--port`. */
  free_port: number | null;
}

/** RemediationContext is what a remediation's detail may use besides the cause. */
export interface RemediationContext {
  name: string;
  cause: LogCause;
  /** declaredPort is the service's own `port` setting. */
  declaredPort: number | null;
  gpus: number;
  gpuMemoryMb: number;
  cwd: string;
  user: string | null;
}

/** CauseRule is one row of the table. */
export interface CauseRule {
  class: string;
  remediation: string;
  patterns: readonly RegExp[];
  /** summary says the cause in words, for Diagnosis error.message; `name` is the service's. */
  summary(cause: LogCause, name: string): string;
  /** detail says what to do, with the command to run where a setting is to change. */
  detail(context: RemediationContext): string;
}

const quoted = (text: string) => `\`${text}\``;
const update = (name: string, flags: string) => quoted(`engine services update ${name} ${flags}`);

/** PIP_NAMES maps import names to the pip package that provides them, where the two differ. */
const PIP_NAMES: Record<string, string> = {
  cv2: "opencv-python",
  yaml: "pyyaml",
  PIL: "pillow",
  sklearn: "scikit-learn",
  bs4: "beautifulsoup4",
  dotenv: "python-dotenv",
  dateutil: "python-dateutil",
  jwt: "PyJWT",
  Crypto: "pycryptodome",
  attr: "attrs",
  fitz: "pymupdf",
  docx: "python-docx",
  serial: "pyserial",
  google: "protobuf",
};

function describeHolder(holder: PortHolder | null, name: string): string {
  if (!holder) return "";
  if (holder.engine) return "the engine itself listens on it (its API or proxy)";
  const process = holder.pid === null ? "" : ` (pid ${holder.pid})`;
  if (holder.service === name) return `an earlier process of this service still holds it${process}`;
  if (holder.service) return `the engine service ${holder.service} holds it${process}`;
  if (holder.pid === null) return `a process of user ${holder.user ?? "unknown"} the engine may not inspect holds it`;
  return `a process outside the engine holds it (pid ${holder.pid}${holder.command ? `: ${holder.command}` : ""})`;
}

function portInUseDetail({ name, cause, declaredPort }: RemediationContext): string {
  const { port, holder, free_port: freePort } = cause;
  const move =
    port !== null && declaredPort === port && freePort !== null
      ? `or give this service another port (it gets it in $PORT): ${update(name, `--port ${freePort}`)}`
      : "or make this service bind another port (its command or its configuration)";
  if (port === null)
    return `It tries to bind a port another process holds; its output does not say which. Find the holder (${quoted("ss -ltnp")}) and stop it, ${move}.`;
  if (!holder)
    return `Port ${port} was in use when it started; nothing listens on it now. Start it again: ${quoted(`engine services start ${name}`)}.`;
  if (holder.engine) return `Port ${port} is the engine's own (its API or proxy). Make this service bind another port.`;
  if (holder.service === name)
    return `Port ${port} is held by an earlier process of this service${holder.pid ? ` (pid ${holder.pid})` : ""} that outlived its run: restart the service (${quoted(`engine services restart ${name}`)}) or end that process.`;
  if (holder.service)
    return `Port ${port} is held by the engine service ${holder.service}${holder.pid ? ` (pid ${holder.pid})` : ""}. Stop it (${quoted(`engine services stop ${holder.service}`)}), ${move}.`;
  if (holder.pid !== null)
    return `Port ${port} is held by pid ${holder.pid}${holder.command ? ` (${holder.command})` : ""}, a process outside the engine. Stop it (${quoted(`kill ${holder.pid}`)}), ${move}.`;
  return `Port ${port} is held by a process of user ${holder.user ?? "unknown"} the engine may not inspect (${quoted("sudo ss -ltnp")} names it). Stop it, ${move}.`;
}

/**
 * LOG_CAUSES is the table of recognised failures, most specific first: that order decides
 * when a run's output matches several rows. A pattern's first capture group, when it has one,
 * is the cause's subject. GPU out-of-memory is not here: the GPU signatures find it, and it
 * keeps its own class (gpu_oom) ahead of every row.
 */
export const LOG_CAUSES: readonly CauseRule[] = [
  {
    class: "cuda_unavailable",
    remediation: "check_cuda",
    patterns: [
      /CUDA driver version is insufficient for CUDA runtime version/i,
      /no CUDA-capable device is detected/i,
      /No CUDA GPUs are available/i,
      /NVIDIA-SMI has failed/i,
      /Found no NVIDIA driver on your system/i,
      /The NVIDIA driver on your system is too old/i,
      /Driver\/library version mismatch/i,
      /Torch not compiled with CUDA enabled/i,
      /CUDA_ERROR_NO_DEVICE|CUDA_ERROR_NOT_INITIALIZED|cudaErrorNoDevice|cudaErrorInsufficientDriver/,
      /(libcuda\.so[.\d]*|libcudart\.so[.\d]*|libcublas\w*\.so[.\d]*|libnvidia-ml\.so[.\d]*|libcudnn\w*\.so[.\d]*): cannot open shared object file/,
      // Any other CUDA error but out of memory, which the GPU signatures report as gpu_oom.
      /CUDA error: (?!out of memory|device-side assert|an illegal memory access)/i,
    ],
    summary: () => "CUDA is not usable: no GPU is visible to it, or its CUDA runtime does not match the driver",
    detail: ({ name, gpus, gpuMemoryMb }) =>
      gpus === 0 && gpuMemoryMb === 0
        ? `The service holds no GPU, so the engine hides every GPU from it (CUDA_VISIBLE_DEVICES is empty). Give it one: ${update(name, "--gpus 1")}.`
        : `Check the host's driver (${quoted("nvidia-smi")}) and that the CUDA runtime the workload ships (e.g. its torch or CUDA build) is not newer than the driver supports; ${quoted("engine gpus")} shows what the engine sees.`,
  },
  {
    class: "port_in_use",
    remediation: "free_port",
    patterns: [
      /\bEADDRINUSE\b/,
      /address already in use/i,
      /Is port (\d+) in use\?/i,
      /Port (\d+) is in use by another program/i,
      /port (\d+) is already (?:in use|allocated)/i,
    ],
    summary: (cause, name) => {
      const port = cause.port === null ? "the port it binds" : `port ${cause.port}`;
      const holder = describeHolder(cause.holder, name);
      return `${port} is already in use${holder ? `: ${holder}` : ""}`;
    },
    detail: portInUseDetail,
  },
  {
    class: "connection_refused",
    remediation: "start_dependency",
    patterns: [/\bECONNREFUSED\b/, /Connection refused/i],
    summary: (cause) => `nothing accepted its connection${cause.subject ? ` to ${cause.subject}` : ""} (connection refused)`,
    detail: ({ name, cause }) =>
      `Nothing listened at ${cause.subject ?? "the address it connects to"}. Start that service first, or bind this one to it so it waits until it is ready: ${update(name, "--bind <service>")}; check the host and port it uses.`,
  },
  {
    class: "network_unreachable",
    remediation: "check_network",
    patterns: [
      /We couldn't connect to '([^']+)'/,
      /Network is unreachable/i,
      /Temporary failure in name resolution/i,
      /Name or service not known/i,
      /getaddrinfo (?:ENOTFOUND|EAI_AGAIN)\s*(\S+)?/,
      /\b(?:ENETUNREACH|EHOSTUNREACH|EAI_AGAIN)\b/,
      /Max retries exceeded with url/,
      /Failed to establish a new connection/,
      /Could not resolve host:?\s*(\S+)?/i,
      /lookup (\S+?)(?: on \S+)?: no such host/,
      /ConnectionError\b.*huggingface\.co/,
      /LocalEntryNotFoundError/,
    ],
    summary: (cause) => `it could not reach ${cause.subject ?? "the network"}`,
    detail: ({ name, cause }) => {
      const huggingFace = cause.subject?.includes("huggingface.co") || /huggingface|LocalEntryNotFound/i.test(cause.key_line);
      const offline = huggingFace
        ? ` Once the model is in its cache (HF_HOME), it can start offline: ${update(name, "--env HF_HUB_OFFLINE=1")}.`
        : "";
      return `This host could not reach ${cause.subject ?? "the network"} (DNS or route). Check the network and any proxy it needs (HTTPS_PROXY), e.g. ${quoted(`curl -sI https://${cause.subject ?? "huggingface.co"}`)}, or download what it fetches ahead of time.${offline}`;
    },
  },
  {
    class: "model_not_found",
    remediation: "fix_model",
    patterns: [
      /['"]?([\w.\-/]+?)['"]? is not a local folder and is not a valid model identifier/,
      /Repository Not Found for url: (\S+)/i,
      /RepositoryNotFoundError/,
      /HFValidationError:? (.*)/,
      /GatedRepoError|Access to model (\S+) is restricted/,
      /(\S+) does not appear to have a file named/,
      /no file named (\S+) found in directory (\S+)/i,
      /(\S+\.safetensors)\S* (?:not found|does not exist)/i,
      /safetensors.*(?:not found|No such file)/i,
      /EntryNotFoundError/,
      /gguf_init_from_file: failed to open '?([^':]+)'?/,
      /error loading model: .*(?:failed to open|No such file)/i,
      /model ['"]([^'"]+)['"] not found, try pulling it first/,
    ],
    summary: (cause) => `the model or its weights were not found${cause.subject ? `: ${cause.subject}` : ""}`,
    detail: ({ name, cause }) =>
      `Check the model's name (${cause.subject ? `${quoted(cause.subject)}, ` : ""}case-sensitive, as org/name) or its path (a folder with config.json and the weights, readable by the service's user), and that the repository is public or the service has a token: ${update(name, "--secret HF_TOKEN=<token>")}.`,
  },
  {
    class: "missing_library",
    remediation: "install_library",
    patterns: [/error while loading shared libraries: ([^:\s]+)/, /([\w.+-]+\.so[.\d]*): cannot open shared object file/],
    summary: (cause) => `a shared library is missing${cause.subject ? `: ${cause.subject}` : ""}`,
    detail: ({ cause }) =>
      `Install the system package that provides ${cause.subject ?? "the library"} on this host or in the image the service runs (e.g. ${quoted(`apt-file search ${cause.subject ?? "<library>"}`)} names it), then start the service again.`,
  },
  {
    // Node names a missing entry script "Cannot find module '/app/server.js'": a file, not a package.
    class: "file_not_found",
    remediation: "provide_file",
    patterns: [/Cannot find module ['"]((?:\/|\.\.?\/)[^'"]+)['"]/],
    summary: (cause) => fileSummary(cause),
    detail: fileDetail,
  },
  {
    class: "module_not_found",
    remediation: "install_module",
    patterns: [
      /No module named '([^']+)'/,
      /ImportError: No module named ([\w.]+)/,
      /ImportError: cannot import name '([^']+)'/,
      /Cannot find (?:module|package) ['"]([^'"]+)['"]/,
      /cannot find package "([^"]+)"/,
      /no required module provides package (\S+)/,
      /\bImportError\b/,
      /\bERR_MODULE_NOT_FOUND\b/,
    ],
    summary: (cause) => `a module it imports is not installed${cause.subject ? `: ${cause.subject}` : ""}`,
    detail: ({ cause }) => {
      const subject = cause.subject;
      if (!subject)
        return "Install what it imports where the service runs, or add it to the build (requirements.txt, package.json), and redeploy.";
      if (/No module named|ImportError/.test(cause.key_line)) {
        const top = subject.split(".")[0] ?? subject;
        const pip = PIP_NAMES[top] ?? top;
        if (/cannot import name/.test(cause.key_line))
          return `The installed package lacks ${quoted(subject)}: a version mismatch. Pin the version it needs in requirements.txt (or ${quoted("pip install -U <package>")}) and redeploy.`;
        return `Install ${quoted(pip)} for the Python the service runs (${quoted(`python3 -m pip install ${pip}`)}), or add ${pip} to requirements.txt so the build installs it, and redeploy.`;
      }
      if (/cannot find package|no required module/.test(cause.key_line))
        return `Add ${quoted(subject)} to go.mod (${quoted(`go get ${subject}`)}) and redeploy.`;
      return `Install ${quoted(subject)} (${quoted(`npm install ${subject}`)}) and add it to package.json so the build installs it, then redeploy.`;
    },
  },
  {
    class: "file_not_found",
    remediation: "provide_file",
    patterns: [
      /No such file or directory:? '([^']+)'/,
      /can't open file '([^']+)'/,
      /ENOENT: no such file or directory, \w+ '([^']+)'/,
      /open (\S+): no such file or directory/,
      /\bENOENT\b/,
      /No such file or directory/i,
      /\b(?:cannot|can't|could not|couldn't|unable to|failed to) open\b/i,
      /\bFileNotFoundError\b/,
    ],
    summary: (cause) => fileSummary(cause),
    detail: fileDetail,
  },
];

function fileSummary(cause: LogCause): string {
  return `it could not open a file${cause.subject ? `: ${cause.subject}` : ""}`;
}

function fileDetail({ cause, cwd, user }: RemediationContext): string {
  const path = cause.subject;
  const who = user ? ` by its user ${user}` : "";
  if (!path) return `Check that the file it opens exists and is readable${who}; a relative path is relative to its cwd, ${cwd}.`;
  if (path.startsWith("/")) return `Make ${path} exist and readable${who}, or point the service at the right path.`;
  return `${path} is relative to the service's cwd, ${cwd}: put it there, use an absolute path, or set the cwd (${quoted("--cwd <dir>")} at deploy or update).`;
}

/** causeRule returns the table's row for a class and remediation code, or null. */
export function causeRule(cause: Pick<LogCause, "class" | "remediation">): CauseRule | null {
  return LOG_CAUSES.find((rule) => rule.class === cause.class && rule.remediation === cause.remediation) ?? null;
}

/**
 * KEY_LINE_PATTERNS recognise a line worth showing even when no row names its class, each
 * with a weight: a program's final word (an exception line, panic, FATAL) outweighs an
 * "error:" line, which outweighs a bare errno name.
 */
const KEY_LINE_PATTERNS: readonly { weight: number; pattern: RegExp }[] = [
  // "ValueError: x", "requests.exceptions.ConnectionError: ...", "java.lang.IllegalStateException", Node's "Error: x".
  { weight: 3, pattern: /^\s*(?:[\w$]+\.)*[\w$]*(?:Error|Exception|Exit)(?:\s*\[\w+\])?(?::|$)/ },
  { weight: 3, pattern: /^panic: |\bFATAL\b|\bfatal:|\bFatal error\b|level=(?:fatal|panic)\b|\bCRITICAL\b/ },
  { weight: 2, pattern: /\b(?:Error|error|ERROR)(?::|\]|\s*\|)|\bERROR\b|level=error\b|\bE\d{4} / },
  {
    weight: 1,
    pattern:
      /\bE(?:ADDRINUSE|ADDRNOTAVAIL|NOENT|CONNREFUSED|CONNRESET|ACCES|PERM|NOSPC|TIMEDOUT|HOSTUNREACH|NETUNREACH|NOTFOUND|AI_AGAIN|MFILE|ROFS|PIPE)\b/,
  },
];

const ANSI = /\x1b\[[0-9;?]*[A-Za-z]/g;

function weightOf(line: string): number {
  let best = 0;
  for (const { weight, pattern } of KEY_LINE_PATTERNS) if (weight > best && pattern.test(line)) best = weight;
  return best;
}

interface Match {
  rule: CauseRule;
  index: number;
  subject: string | null;
  matchAt: number;
}

function matchRule(rule: CauseRule, line: string, index: number): Match | null {
  for (const pattern of rule.patterns) {
    const found = pattern.exec(line);
    if (found) return { rule, index, subject: found[1]?.trim() || null, matchAt: found.index };
  }
  return null;
}

function firstRuleOf(line: string, index: number): Match | null {
  for (const rule of LOG_CAUSES) {
    const match = matchRule(rule, line, index);
    if (match) return match;
  }
  return null;
}

/**
 * bestRuleIn returns the highest row of the table any line matches and, among that row's
 * lines, the weightiest (the last of equals): Node's "Error: listen EADDRINUSE" rather than
 * the "code: 'EADDRINUSE'" its error object prints after it.
 */
function bestRuleIn(lines: readonly string[], from: number, to: number, minWeight = 0): Match | null {
  for (const rule of LOG_CAUSES) {
    let best: Match | null = null;
    let bestWeight = -1;
    for (let index = from; index <= to; index++) {
      const line = lines[index] ?? "";
      const match = matchRule(rule, line, index);
      if (!match) continue;
      const weight = weightOf(line);
      if (weight < minWeight) continue;
      if (weight >= bestWeight) {
        best = match;
        bestWeight = weight;
      }
    }
    if (best) return best;
  }
  return null;
}

interface StreamResult {
  line: string;
  index: number;
  match: Match | null;
  /** final is true when the line is the stream's final word: an exception, panic or FATAL line. */
  final: boolean;
}

/**
 * readStream finds one stream's key line. Its final word, the last of its weightiest lines,
 * is taken first: classified by its own row if it has one, else by a row matched in the
 * error lines just before it (a chained traceback's earlier exceptions), else shown as it is. Only a stream without such a
 * final word is searched whole, so an early warning ("could not open ~/.cache, using
 * defaults") does not outrank the exception that ended the run.
 */
function readStream(lines: readonly string[]): StreamResult | null {
  let finalIndex = -1;
  let finalWeight = 0;
  for (let index = 0; index < lines.length; index++) {
    const weight = weightOf(lines[index] ?? "");
    if (weight > 0 && weight >= finalWeight) {
      finalIndex = index;
      finalWeight = weight;
    }
  }
  if (finalIndex >= 0 && finalWeight === 3) {
    const line = lines[finalIndex] ?? "";
    const own = firstRuleOf(line, finalIndex);
    if (own) return { line, index: finalIndex, match: own, final: true };
    const near = bestRuleIn(lines, Math.max(0, finalIndex - 40), finalIndex, 2);
    if (near) return { line: lines[near.index] ?? "", index: near.index, match: near, final: true };
    return { line, index: finalIndex, match: null, final: true };
  }
  const anywhere = bestRuleIn(lines, 0, lines.length - 1);
  if (anywhere) return { line: lines[anywhere.index] ?? "", index: anywhere.index, match: anywhere, final: false };
  if (finalIndex >= 0) return { line: lines[finalIndex] ?? "", index: finalIndex, match: null, final: false };
  return null;
}

/** boundLines keeps the last KEY_SCAN_LINES lines within KEY_SCAN_BYTES, without colour codes. */
function boundLines(lines: readonly LogLine[]): LogLine[] {
  const kept: LogLine[] = [];
  let bytes = 0;
  for (let index = lines.length - 1; index >= 0 && kept.length < KEY_SCAN_LINES; index--) {
    const entry = lines[index] as LogLine;
    const text = entry.line.slice(0, SCAN_LINE_MAX).replace(ANSI, "");
    bytes += text.length + 1;
    if (bytes > KEY_SCAN_BYTES) break;
    kept.unshift({ ...entry, line: text });
  }
  return kept;
}

/** clip bounds a key line to KEY_LINE_MAX characters, keeping the part that matched in view. */
export function clip(line: string, matchAt = 0): string {
  const text = line.trim();
  if (text.length <= KEY_LINE_MAX) return text;
  if (matchAt < KEY_LINE_MAX - 80) return `${text.slice(0, KEY_LINE_MAX - 1)}…`;
  const start = Math.max(0, matchAt - 100);
  return `…${text.slice(start, start + KEY_LINE_MAX - 2)}…`;
}

/** PORT_PATTERNS find a port in a line: "port 8000", "('0.0.0.0', 8000)", "127.0.0.1:8000", ":::3000", "tcp :8080". */
const PORT_PATTERNS: readonly RegExp[] = [
  /\bport[\s=:'"]+(\d{1,5})\b/gi,
  /\(\s*['"][^'"]*['"]\s*,\s*(\d{1,5})\s*\)/g,
  /(?:\b\d{1,3}(?:\.\d{1,3}){3}|\blocalhost|\]|::|\s|^):(\d{2,5})\b/g,
];

/** portsIn returns the ports a text names, in order, without repeats. */
export function portsIn(text: string): number[] {
  const found: { at: number; port: number }[] = [];
  for (const pattern of PORT_PATTERNS) {
    for (const match of text.matchAll(pattern)) {
      const port = Number(match[1]);
      if (port >= 1 && port <= 65535) found.push({ at: match.index ?? 0, port });
    }
  }
  return [...new Set(found.sort((a, b) => a.at - b.at).map((entry) => entry.port))];
}

/** portsInArgs returns the ports a command line names: "8000", "--port=8000", "0.0.0.0:8000", "-p 8000". */
export function portsInArgs(argv: readonly string[]): number[] {
  const ports: number[] = [];
  for (const arg of argv.flatMap((part) => part.split(/\s+/))) {
    const match = /^(?:--?[\w-]*port[\w-]*=|[\w.[\]:-]*:)?(\d{2,5})$/i.exec(arg);
    const port = match ? Number(match[1]) : 0;
    if (port >= 1 && port <= 65535) ports.push(port);
  }
  return [...new Set(ports)];
}

/**
 * findLogCause reads a run's output (its last KEY_SCAN_LINES lines and KEY_SCAN_BYTES, stderr
 * before stdout) for the key line and the cause it names. A stream that is decisive, with a
 * recognised cause or ending in an exception, panic or FATAL line, wins over one with only an
 * "error:" line; between equals, stderr wins. `redact` hides secrets
 * before the line is cut to KEY_LINE_MAX. It returns null when no line is worth showing.
 * A port clash's port is looked for in the key line, then the lines around it; the manager
 * adds the command's and the settings' ports and finds who holds it.
 */
export function findLogCause(lines: readonly LogLine[], redact: (text: string) => string = (text) => text): LogCause | null {
  const bounded = boundLines(lines);
  const streams = ["stderr", "stdout"].map((stream) => {
    const texts = bounded.filter((entry) => entry.stream === stream).map((entry) => entry.line);
    return { stream, texts, result: readStream(texts) };
  });
  const chosen = streams.find((s) => s.result?.match || s.result?.final) ?? streams.find((s) => s.result !== null) ?? null;
  if (!chosen?.result) return null;
  const { result, texts, stream } = chosen;
  const match = result.match;
  let port: number | null = null;
  if (match?.rule.class === "port_in_use" || match?.rule.class === "connection_refused") {
    const around = [
      result.line,
      ...texts.slice(Math.max(0, result.index - 8), result.index),
      ...texts.slice(result.index + 1, result.index + 16),
    ];
    port = around.flatMap(portsIn)[0] ?? null;
  }
  let subject = match?.subject ? redact(match.subject).slice(0, 200) : null;
  if (match?.rule.class === "file_not_found" && !subject) subject = pathIn(redact(result.line));
  if (match?.rule.class === "connection_refused" && !subject) subject = addressIn(result.line);
  if (match?.rule.class === "network_unreachable") subject = hostOf(subject) ?? hostIn(texts, result.index);
  if (match?.rule.class === "port_in_use" && port !== null) subject = String(port);
  return {
    class: match?.rule.class ?? null,
    remediation: match?.rule.remediation ?? null,
    key_line: clip(redact(result.line), match?.matchAt ?? 0),
    stream,
    subject,
    port,
    holder: null,
    free_port: null,
  };
}

/** pathIn returns the first thing in a line that looks like a file path, or null. */
function pathIn(line: string): string | null {
  const quotedPath = /['"`]((?:\/|\.\.?\/|~\/)[^'"`]+|[^'"`\s]+\.\w{1,10})['"`]/.exec(line);
  if (quotedPath?.[1]) return quotedPath[1];
  const bare = /(?:^|\s)((?:\/|\.\.?\/|~\/)[^\s:'",]+)/.exec(line);
  if (bare?.[1]) return bare[1];
  // "cannot open model.bin": a bare file name with an extension, after "open".
  const named = /\bopen(?: file)?:?\s+([\w.-]+\.[A-Za-z]\w{0,9})\b/.exec(line);
  return named?.[1] ?? null;
}

/** addressIn returns the host:port of a refused connection, when the line names one. */
function addressIn(line: string): string | null {
  const tuple = /host='([^']+)', port=(\d+)/.exec(line) ?? /at "([^"]+)", port (\d+)/.exec(line);
  if (tuple) return `${tuple[1]}:${tuple[2]}`;
  const address = /((?:\d{1,3}(?:\.\d{1,3}){3}|localhost|\[[0-9a-f:]+\]|[\w-]+(?:\.[\w-]+)+)(?::|\s+port\s+)\d{1,5})\b/i.exec(line);
  return address?.[1] ?? null;
}

/** hostOf returns the host name in a URL or a bare host name, or null for anything else. */
function hostOf(text: string | null): string | null {
  if (!text) return null;
  const host = /^(?:https?:\/\/)?([\w-]+(?:\.[\w-]+)+)(?:[:/]|$)/i.exec(text);
  return host?.[1] ?? null;
}

/** hostIn returns the host a network failure names, from the key line or the lines before it. */
function hostIn(lines: readonly string[], index: number): string | null {
  for (let at = index; at >= Math.max(0, index - 20); at--) {
    const line = lines[at] ?? "";
    const host =
      /host='([^']+)'/.exec(line) ?? /https?:\/\/([\w.-]+\.[a-z]{2,})/i.exec(line) ?? /resolve host:?\s*([\w.-]+\.[a-z]{2,})/i.exec(line);
    if (host?.[1]) return host[1];
  }
  return null;
}

/**
 * redactor returns a function that hides secrets in a text: every given value (longest first)
 * and the password of any URL's userinfo.
 */
export function redactor(secrets: readonly string[]): (text: string) => string {
  const values = [...new Set(secrets.filter((value) => value.length > 0))].sort((a, b) => b.length - a.length);
  return (text) => {
    let result = text;
    for (const value of values) result = result.split(value).join("***");
    return result.replace(/(\b[a-z][\w+.-]*:\/\/[^\s:/@]*:)[^\s@/]+@/gi, "$1***@");
  };
}
