// `qwen36 serve -tp 2` (two ranks as threads on the CPU backend, the built-in model) against
// the same server without tensor parallelism: greedy completions and chats, one at a time and
// four at once (continuous batching across the ranks), must be the same text token for token,
// and the streamed deltas must assemble to it.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './serve.mjs';

const servers = {};
const clients = {};

before(async () => {
  const args = ['--parallel', '4', '-c', '1024', '-t', '1'];
  [servers.one, servers.tp] = await Promise.all([startServer({ args }), startServer({ args: [...args, '-tp', '2'] })]);
  for (const k of ['one', 'tp'])
    clients[k] = new OpenAI({ apiKey: 'none', baseURL: `${servers[k].url}/v1`, timeout: 60000, maxRetries: 0 });
});
after(async () => {
  await Promise.all(Object.values(servers).map((s) => s.stop()));
});

const prompts = ['def fibonacci(n):', 'import numpy as np\n', 'class Stack:\n    def __init__(self):', '# sort a list\n'];
const complete = (c, prompt) =>
  c.completions.create({ model: 'qwen36-default', prompt, max_tokens: 24, temperature: 0 }).then((r) => r.choices[0].text);

describe('serve -tp 2', { timeout: 240000 }, () => {
  test('the log names the tensor-parallel ranks', () => {
    assert.match(servers.tp.log(), /tensor parallel: 2 ranks/);
  });

  test('greedy completions equal one rank, one at a time and four at once', async () => {
    const want = [];
    for (const p of prompts) want.push(await complete(clients.one, p));
    assert.ok(want.some((t) => t.length > 0), 'the reference server generated nothing');
    for (let i = 0; i < prompts.length; ++i) assert.equal(await complete(clients.tp, prompts[i]), want[i], prompts[i]);
    assert.deepEqual(await Promise.all(prompts.map((p) => complete(clients.tp, p))), want);
  });

  test('streamed chat equals one rank', async () => {
    const req = { model: 'qwen36-default', temperature: 0, max_tokens: 16, messages: [{ role: 'user', content: 'Write a loop.' }] };
    const want = (await clients.one.chat.completions.create(req)).choices[0].message.content;
    let got = '';
    for await (const ch of await clients.tp.chat.completions.create({ ...req, stream: true }))
      got += ch.choices[0]?.delta?.content ?? '';
    assert.equal(got, want);
  });
});
