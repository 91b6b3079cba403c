import { describe } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";

/**
 * describeWhen is `describe` when nothing is missing; otherwise it says on stderr which suite
 * is skipped and why (what to install), and skips it, so that a skip is never silent.
 */
export function describeWhen(missing: string | null, suite: string): typeof describe | typeof describe.skip {
  if (missing === null) return describe;
  process.stderr.write(`skipped: ${suite}: ${missing}\n`);
  return describe.skip;
}

/** run runs a command to its end and returns its exit code and output. */
export async function run(
  argv: string[],
  env?: Record<string, string | undefined>,
): Promise<{ code: number; stdout: string; stderr: string }> {
  const child = Bun.spawn(argv, { stdin: "ignore", stdout: "pipe", stderr: "pipe", env: env ?? process.env });
  const [stdout, stderr, code] = await Promise.all([new Response(child.stdout).text(), new Response(child.stderr).text(), child.exited]);
  return { code, stdout, stderr };
}

/** opensslVerify checks `leafPem` (its first certificate) against a root file with `openssl verify`, strictly, for TLS server use. */
export async function opensslVerify(
  dir: string,
  options: { rootPath: string; intermediatePem: string; leafPem: string },
): Promise<{ code: number; stdout: string; stderr: string }> {
  const intermediatePath = join(dir, `intermediate-${crypto.randomUUID()}.pem`);
  const leafPath = join(dir, `leaf-${crypto.randomUUID()}.pem`);
  writeFileSync(intermediatePath, options.intermediatePem);
  writeFileSync(leafPath, options.leafPem);
  return run([
    "openssl",
    "verify",
    "-x509_strict",
    "-purpose",
    "sslserver",
    "-CAfile",
    options.rootPath,
    "-untrusted",
    intermediatePath,
    leafPath,
  ]);
}

/** curlThrough fetches https://<name>:<port>/ from a server on 127.0.0.1, trusting `caFile` or, without it, curl's default store. */
export async function curlThrough(name: string, port: number, caFile?: string): Promise<{ code: number; stdout: string; stderr: string }> {
  const args = ["curl", "--silent", "--show-error", "--max-time", "10", "--resolve", `${name}:${port}:127.0.0.1`];
  if (caFile) args.push("--cacert", caFile);
  args.push(`https://${name}:${port}/`);
  // Without --cacert curl must find the root on its own: drop the variables that point it elsewhere.
  const env = { ...process.env, CURL_CA_BUNDLE: undefined, SSL_CERT_FILE: undefined, SSL_CERT_DIR: undefined };
  return run(args, env);
}

/** serveTls starts a Bun HTTPS server on a free port that answers "hello <name>". */
export function serveTls(name: string, certPem: string, keyPem: string): ReturnType<typeof Bun.serve> {
  return Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    tls: { cert: certPem, key: keyPem, serverName: name },
    fetch: () => new Response(`hello ${name}`),
  });
}
