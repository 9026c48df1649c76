// Starts `qwen36 serve` on 127.0.0.1 with a free port and the built-in tiny RANDOM model
// (tiny-dense, seed 36: the same model tests/server/http_test.cpp serves), waits for
// /health, and kills it at the end. Every wait is bounded.
//
//   QWEN36_BIN        the built qwen36 binary (ctest passes it)
//   QWEN36_TOKENIZER  tokenizer directory (default: <repo>/.models/qwen3-tokenizer from
//                     scripts/fetch-tokenizer.sh)
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, '..', '..', '..');
export const tokenizerDir = process.env.QWEN36_TOKENIZER || path.join(repoRoot, '.models', 'qwen3-tokenizer');
export const bin = process.env.QWEN36_BIN || path.join(repoRoot, 'build', 'cpu', 'src', 'cli', 'qwen36');

// Why a test cannot run here, or null.
export function missing() {
  if (!existsSync(bin)) return `no qwen36 binary at ${bin} (set QWEN36_BIN)`;
  if (!existsSync(path.join(tokenizerDir, 'tokenizer.json')))
    return `no Qwen3 tokenizer at ${tokenizerDir} (run scripts/fetch-tokenizer.sh)`;
  return null;
}

const servers = new Set();
// A test file that dies early still takes its servers with it.
for (const ev of ['exit', 'SIGINT', 'SIGTERM']) {
  process.on(ev, () => {
    for (const s of servers) s.kill('SIGKILL');
    if (ev !== 'exit') process.exit(1);
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Returns { url, port, apiKey, proc, log(), stop() }. args: extra `qwen36 serve` flags.
export async function startServer({ args = [], apiKey = '', timeoutMs = 60000 } = {}) {
  const why = missing();
  if (why) throw new Error(why);
  const argv = ['serve', '--host', '127.0.0.1', '--port', '0', '--tokenizer', tokenizerDir, ...args];
  if (apiKey) argv.push('--api-key', apiKey);
  const env = { ...process.env };
  for (const k of Object.keys(env)) if (k.startsWith('QWEN36_') && k !== 'QWEN36_TOKENIZER') delete env[k];
  const proc = spawn(bin, argv, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  servers.add(proc);
  let out = '';
  let exited = null;
  proc.stdout.on('data', (d) => (out += d));
  proc.stderr.on('data', (d) => (out += d));
  proc.on('exit', (code, sig) => {
    exited = { code, sig };
    servers.delete(proc);
  });
  const stop = async () => {
    if (exited) return exited;
    proc.kill('SIGTERM');
    for (let i = 0; i < 100 && !exited; ++i) await sleep(50);
    if (!exited) {
      proc.kill('SIGKILL');
      for (let i = 0; i < 100 && !exited; ++i) await sleep(50);
    }
    return exited;
  };
  const deadline = Date.now() + timeoutMs;
  let port = 0;
  try {
    while (!port) {
      if (exited) throw new Error(`qwen36 serve exited (${JSON.stringify(exited)}):\n${out}`);
      if (Date.now() > deadline) throw new Error(`qwen36 serve did not report its port:\n${out}`);
      const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) port = Number(m[1]);
      else await sleep(20);
    }
    const url = `http://127.0.0.1:${port}`;
    for (;;) {
      if (exited) throw new Error(`qwen36 serve exited (${JSON.stringify(exited)}):\n${out}`);
      if (Date.now() > deadline) throw new Error(`qwen36 serve was not ready in ${timeoutMs} ms:\n${out}`);
      const r = await fetch(`${url}/health`, { signal: AbortSignal.timeout(2000) }).catch(() => null);
      if (r && r.status === 200) break;
      await sleep(50);
    }
    return { url, port, apiKey, proc, log: () => out, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}
