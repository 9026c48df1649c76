// Load test: 64 concurrent streaming clients x 3 rounds on loopback against the tiny random
// model. Every response must be complete and well framed (only "data: ..." events and
// keep-alive comments, JSON chunks of one id, a finish_reason, the usage chunk, one final
// [DONE], one chunk with logprobs per token) and, greedy, equal to the same prompt's
// single-request run: same text and same top-5 logprobs at every token. 0 lost, 0 garbled.
// Prints aggregate output tok/s and p50/p99 TTFT and inter-token latency (CPU, tiny random
// model); QWEN36_LOAD_REPORT=FILE also writes them as JSON.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { startServer } from './serve.mjs';

const CLIENTS = Number(process.env.QWEN36_LOAD_CLIENTS || 64);
const ROUNDS = Number(process.env.QWEN36_LOAD_ROUNDS || 3);
const MAX_TOKENS = 8;
const PROMPTS = 16;  // distinct prompts; client i of round r sends prompt (i + r) % PROMPTS
const words = 'alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa'.split(' ');
const prompts = Array.from({ length: PROMPTS }, (_, i) =>
  `Request ${i}: ` + Array.from({ length: 3 + ((i * 7) % 23) }, (_, k) => words[(i + k * 3) % words.length]).join(' '));

let server;
before(async () => {
  server = await startServer({ args: ['--parallel', String(CLIENTS), '-c', '256', '--max-queue', String(CLIENTS)] });
});
after(async () => {
  if (server) await server.stop();
});

// One streaming request, read raw. Returns {text, usage, ttft, gaps} or throws on any fault.
async function stream(prompt) {
  const t0 = performance.now();
  const r = await fetch(`${server.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    signal: AbortSignal.timeout(60000),
    body: JSON.stringify({
      model: 'qwen36-default',
      messages: [{ role: 'user', content: prompt }],
      stream: true,
      stream_options: { include_usage: true },
      temperature: 0,
      max_tokens: MAX_TOKENS,
      ignore_eos: true,
      // Every token then has its own chunk (also when its text is held back or empty: the
      // random model mostly repeats "\n"), and its top-5 logprobs fingerprint the numerics.
      logprobs: true,
      top_logprobs: 5,
    }),
  });
  if (r.status !== 200) throw new Error(`lost: HTTP ${r.status} ${await r.text()}`);
  if (!/^text\/event-stream/.test(r.headers.get('content-type') || '')) throw new Error('garbled: content-type');
  const dec = new TextDecoder('utf-8', { fatal: true });
  let buf = '';
  let text = '';
  let id = null;
  let usage = null;
  let finish = null;
  let done = false;
  let ttft = null;
  let last = null;
  const gaps = [];
  const lps = [];
  for await (const bytes of r.body) {
    const now = performance.now();
    buf += dec.decode(bytes, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (ev.startsWith(':')) continue;  // keep-alive comment
      if (!ev.startsWith('data: ') || ev.includes('\n')) throw new Error(`garbled: event ${JSON.stringify(ev)}`);
      if (done) throw new Error('garbled: data after [DONE]');
      const d = ev.slice(6);
      if (d === '[DONE]') {
        done = true;
        continue;
      }
      const j = JSON.parse(d);
      if (j.error) throw new Error(`lost: error event ${d}`);
      if (j.object !== 'chat.completion.chunk') throw new Error(`garbled: object ${j.object}`);
      if (id === null) id = j.id;
      else if (j.id !== id) throw new Error('garbled: chunk ids differ');
      if (ttft === null) ttft = now - t0;  // the first chunk goes out with the first token
      if (j.usage && j.choices.length && !j.choices[0].finish_reason) throw new Error('garbled: usage mid-stream');
      if (j.usage && j.choices.length === 0) {
        if (usage) throw new Error('garbled: two usage chunks');
        usage = j.usage;
        continue;
      }
      if (finish) throw new Error('garbled: chunk after finish_reason');
      const ch = j.choices[0];
      text += (ch.delta.content || '') + (ch.delta.reasoning_content || '');
      for (const lp of ch.logprobs?.content || []) {
        if (last !== null) gaps.push(now - last);
        last = now;
        lps.push(lp);
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  if (buf !== '') throw new Error(`garbled: trailing bytes ${JSON.stringify(buf)}`);
  if (!done) throw new Error('garbled: no [DONE]');
  if (finish !== 'length') throw new Error(`garbled: finish_reason ${finish}`);
  if (lps.length !== MAX_TOKENS) throw new Error(`garbled: ${lps.length} token logprobs`);
  if (!usage || usage.completion_tokens !== MAX_TOKENS || usage.total_tokens !== usage.prompt_tokens + MAX_TOKENS)
    throw new Error(`garbled: usage ${JSON.stringify(usage)}`);
  return { text, lps, usage, ttft, gaps, ms: performance.now() - t0 };
}

// Greedy tokens and text must be identical to the single run. Logprobs are compared with a
// tolerance: the CPU backend is not bitwise batch-invariant (a batch of 64 rows takes other
// matmul tiles than one row), measured differences are ~1e-5 absolute on values near -40.
const LP_TOL = 1e-3;
let maxLpDiff = 0;
function compare(got, want) {
  if (got.text !== want.text) return `text ${JSON.stringify(got.text)} != single run ${JSON.stringify(want.text)}`;
  for (let k = 0; k < want.lps.length; ++k) {
    const a = got.lps[k];
    const b = want.lps[k];
    if (a.token !== b.token || JSON.stringify(a.bytes) !== JSON.stringify(b.bytes))
      return `token ${k}: ${JSON.stringify(a.token)} != single run ${JSON.stringify(b.token)}`;
    const d = Math.abs(a.logprob - b.logprob);
    maxLpDiff = Math.max(maxLpDiff, d);
    if (!(d <= LP_TOL)) return `token ${k}: logprob ${a.logprob} vs ${b.logprob}`;
    const top = new Map(b.top_logprobs.map((t) => [t.token, t.logprob]));
    let common = 0;
    for (const t of a.top_logprobs) {
      if (!top.has(t.token)) continue;
      ++common;
      const dt = Math.abs(t.logprob - top.get(t.token));
      maxLpDiff = Math.max(maxLpDiff, dt);
      if (!(dt <= LP_TOL)) return `token ${k}: top logprob of ${JSON.stringify(t.token)} ${t.logprob} vs ${top.get(t.token)}`;
    }
    if (common < Math.min(a.top_logprobs.length, b.top_logprobs.length) - 1) return `token ${k}: top-5 sets differ`;
  }
  return null;
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] : NaN;
};

test(`load: ${CLIENTS} concurrent streams x ${ROUNDS} rounds`, { timeout: 170000 }, async () => {
  // Single-request runs: the reference greedy answers.
  const want = [];
  for (const p of prompts) want.push(await stream(p));

  let lost = 0;
  let garbled = 0;
  const faults = [];
  const ttfts = [];
  const itls = [];
  let tokens = 0;
  let wall = 0;
  const rounds = [];
  for (let round = 0; round < ROUNDS; ++round) {
    const t0 = performance.now();
    const results = await Promise.allSettled(
      Array.from({ length: CLIENTS }, (_, i) => stream(prompts[(i + round) % PROMPTS])));
    const secs = (performance.now() - t0) / 1000;
    let roundTokens = 0;
    results.forEach((res, i) => {
      const p = (i + round) % PROMPTS;
      if (res.status === 'rejected') {
        const msg = String(res.reason?.message || res.reason);
        if (msg.startsWith('garbled')) ++garbled;
        else ++lost;
        faults.push(`round ${round} client ${i}: ${msg}`);
        return;
      }
      const r = res.value;
      const diff = compare(r, want[p]);
      if (diff) {
        ++garbled;
        faults.push(`round ${round} client ${i}: ${diff}`);
        return;
      }
      roundTokens += r.usage.completion_tokens;
      ttfts.push(r.ttft);
      itls.push(...r.gaps);
    });
    tokens += roundTokens;
    wall += secs;
    rounds.push({ round, seconds: +secs.toFixed(2), tok_s: +(roundTokens / secs).toFixed(1) });
  }
  const report = {
    label: 'CPU, tiny random model (tiny-dense), loopback',
    clients: CLIENTS,
    rounds: ROUNDS,
    max_tokens: MAX_TOKENS,
    lost,
    garbled,
    output_tok_s: +(tokens / wall).toFixed(1),
    ttft_ms: { p50: +pct(ttfts, 50).toFixed(1), p99: +pct(ttfts, 99).toFixed(1) },
    max_logprob_diff_vs_single: maxLpDiff,
    itl_ms: { p50: +pct(itls, 50).toFixed(1), p99: +pct(itls, 99).toFixed(1) },
    per_round: rounds,
  };
  console.log(`# load report: ${JSON.stringify(report)}`);
  if (process.env.QWEN36_LOAD_REPORT) writeFileSync(process.env.QWEN36_LOAD_REPORT, JSON.stringify(report, null, 2) + '\n');
  assert.deepEqual(faults.slice(0, 10), []);
  assert.equal(lost, 0);
  assert.equal(garbled, 0);
  // Every slot came back.
  const m = await (await fetch(`${server.url}/metrics`)).text();
  assert.match(m, /^qwen36_requests_running 0$/m);
});
