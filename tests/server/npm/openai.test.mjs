// The official `openai` npm client against `qwen36 serve` (tiny random model, loopback):
// chat JSON and streaming, tools, errors (400 / 401 as APIError), the models list.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import path from 'node:path';
import { startServer } from './serve.mjs';

const KEY = 'sk-qwen36-test';
let server;
let client;

before(async () => {
  server = await startServer({ apiKey: KEY, args: ['--parallel', '4', '-c', '1024'] });
  client = new OpenAI({ apiKey: KEY, baseURL: `${server.url}/v1`, timeout: 30000, maxRetries: 0 });
});
after(async () => {
  if (server) await server.stop();
});

const greedy = { model: 'qwen36-default', temperature: 0, max_tokens: 12 };
const toolHistory = (messages, content) => [
  ...messages,
  {
    role: 'assistant',
    content,
    tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }],
  },
  { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 21}' },
];
const hello = [{ role: 'user', content: 'Say hello in three words.' }];

describe('openai client', { timeout: 120000 }, () => {
  test('models list', async () => {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m);
    assert.equal(ids.length, 1);
    assert.equal(ids[0].id, 'qwen36-default');
    assert.equal(ids[0].object, 'model');
    assert.equal(typeof ids[0].owned_by, 'string');
  });

  test('chat, non-streaming', async () => {
    const r = await client.chat.completions.create({ ...greedy, messages: hello });
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.model, 'qwen36-default');
    assert.equal(r.choices.length, 1);
    const c = r.choices[0];
    assert.equal(c.index, 0);
    assert.equal(c.message.role, 'assistant');
    assert.ok(['stop', 'length'].includes(c.finish_reason), c.finish_reason);
    assert.ok(r.usage.prompt_tokens > 0);
    assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 12);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    // Greedy is deterministic.
    const again = await client.chat.completions.create({ ...greedy, messages: hello });
    assert.deepEqual(again.choices[0].message, c.message);
  });

  test('chat, streaming: deltas assemble to the non-streaming answer', async () => {
    const whole = await client.chat.completions.create({ ...greedy, messages: hello });
    const stream = await client.chat.completions.create({
      ...greedy,
      messages: hello,
      stream: true,
      stream_options: { include_usage: true },
    });
    let content = '';
    let reasoning = '';
    let finish = null;
    let usage = null;
    let chunks = 0;
    let role = null;
    for await (const ch of stream) {
      ++chunks;
      assert.equal(ch.object, 'chat.completion.chunk');
      assert.match(ch.id, /^chatcmpl-/);
      if (ch.usage) usage = ch.usage;
      if (!ch.choices.length) continue;
      const d = ch.choices[0].delta;
      if (d.role) role = d.role;
      if (d.content) content += d.content;
      if (d.reasoning_content) reasoning += d.reasoning_content;
      if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
    }
    assert.ok(chunks >= 3, `${chunks} chunks`);
    assert.equal(role, 'assistant');
    assert.equal(finish, whole.choices[0].finish_reason);
    assert.equal(content, whole.choices[0].message.content ?? '');
    assert.equal(reasoning, whole.choices[0].message.reasoning_content ?? '');
    assert.deepEqual(usage, whole.usage);
  });

  test('chat, streaming with the helper API (stream())', async () => {
    const s = client.chat.completions.stream({ ...greedy, messages: hello, max_tokens: 6 });
    const final = await s.finalChatCompletion();
    assert.equal(final.choices[0].message.role, 'assistant');
    assert.ok(['stop', 'length'].includes(final.choices[0].finish_reason));
  });

  test('tools: accepted; the answer has the chat schema (and tool_calls shape if any)', async () => {
    const tools = [
      {
        type: 'function',
        function: {
          name: 'get_weather',
          description: 'Current weather of a city',
          parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
        },
      },
    ];
    const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
    for (const tool_choice of ['auto', 'none', 'required']) {
      const r = await client.chat.completions.create({ ...greedy, messages, tools, tool_choice, parallel_tool_calls: true });
      const c = r.choices[0];
      assert.equal(c.message.role, 'assistant');
      assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason), c.finish_reason);
      if (c.message.tool_calls && c.message.tool_calls.length) {
        assert.equal(c.finish_reason, 'tool_calls');
        for (const t of c.message.tool_calls) {
          assert.equal(t.type, 'function');
          assert.equal(typeof t.id, 'string');
          assert.equal(typeof t.function.name, 'string');
          JSON.parse(t.function.arguments);
        }
      }
    }
    // A history with a tool call and its result renders and runs.
    const r = await client.chat.completions.create({ ...greedy, tools, messages: toolHistory(messages, '') });
    assert.ok(r.usage.prompt_tokens > 40);
    // Streaming with tools too.
    let finish = null;
    for await (const ch of await client.chat.completions.create({ ...greedy, messages, tools, stream: true }))
      if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
    assert.ok(['stop', 'length', 'tool_calls'].includes(finish), finish);
  });

  // The SDK's own shape for an assistant turn that only calls tools is content: null.
  // Today the Qwen3 template's `'</think>' in message.content` fails on it (400); the server
  // should pass null as "" (src/server/openai.cpp template_messages).
  test('tool-call history with content: null', async () => {
    const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: {} } } }];
    const r = await client.chat.completions.create({
      ...greedy, tools, messages: toolHistory([{ role: 'user', content: 'Weather in Paris?' }], null),
    });
    assert.equal(r.choices.length, 1);
  });

  test('structured output: response_format json_schema and json_object', async () => {
    const schema = {
      type: 'object',
      properties: { city: { type: 'string' }, temp_c: { type: 'integer' }, sky: { enum: ['clear', 'cloudy'] } },
      required: ['city', 'temp_c', 'sky'],
      additionalProperties: false,
    };
    const r = await client.chat.completions.create({
      ...greedy, max_tokens: 400, messages: hello, chat_template_kwargs: { enable_thinking: false },
      response_format: { type: 'json_schema', json_schema: { name: 'weather', strict: true, schema } },
    });
    const c = r.choices[0];
    if (c.finish_reason === 'stop') {  // a random model may spend max_tokens inside the free string
      const doc = JSON.parse(c.message.content);
      assert.deepEqual(Object.keys(doc), ['city', 'temp_c', 'sky']);
      assert.ok(Number.isInteger(doc.temp_c) && ['clear', 'cloudy'].includes(doc.sky), c.message.content);
    } else {
      assert.equal(c.finish_reason, 'length');
      assert.match(c.message.content, /^\s?\{/);
    }
    const o = await client.chat.completions.create({
      ...greedy, max_tokens: 8, messages: hello, chat_template_kwargs: { enable_thinking: false },
      response_format: { type: 'json_object' },
    });
    assert.match(o.choices[0].message.content, /^\s?\{/);
    await assert.rejects(
      client.chat.completions.create({
        ...greedy, messages: hello,
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'integer', multipleOf: 3 } } },
      }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'response_format' && /multipleOf/.test(e.message),
    );
  });

  test('n = 3: three choices, indexed, usage over all', async () => {
    const r = await client.chat.completions.create({ ...greedy, temperature: 1, seed: 3, n: 3, messages: hello });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    let streamed = 0;
    for await (const ch of await client.chat.completions.create({ ...greedy, n: 2, messages: hello, stream: true }))
      for (const c of ch.choices) streamed |= 1 << c.index;
    assert.equal(streamed, 3);
  });

  test('responses API: text, its event stream, input items, tools, text.format, errors', async () => {
    const base = { model: 'qwen36-default', max_output_tokens: 12, temperature: 1, seed: 5, reasoning: { effort: 'none' } };
    const r = await client.responses.create({ ...base, input: 'Say hello.', instructions: 'Be brief.' });
    assert.equal(r.object, 'response');
    assert.match(r.id, /^resp_/);
    assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
    assert.ok(r.output_text.length > 0);  // the SDK joins the message items' output_text parts
    assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0 && r.usage.output_tokens <= 12);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);

    const events = [];
    for await (const ev of await client.responses.create({ ...base, input: 'Say hello.', instructions: 'Be brief.', stream: true }))
      events.push(ev);
    assert.equal(events[0].type, 'response.created');
    assert.ok(['response.completed', 'response.incomplete'].includes(events.at(-1).type));
    events.forEach((ev, i) => assert.equal(ev.sequence_number, i));
    const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
    assert.equal(text, r.output_text, 'the deltas are the non-streamed answer (same seed)');
    assert.deepEqual(events.at(-1).response.output.map((o) => o.type), r.output.map((o) => o.type));

    const tools = [{ type: 'function', name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } }];
    const h = await client.responses.create({
      ...base, tools,
      input: [
        { role: 'user', content: 'Weather in Paris?' },
        { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
        { type: 'function_call_output', call_id: 'call_1', output: '{"temp_c": 21}' },
      ],
    });
    assert.equal(h.object, 'response');
    const forced = await client.responses.create({ ...base, tools, input: 'Weather?', tool_choice: { type: 'function', name: 'get_weather' }, max_output_tokens: 40 });
    for (const o of forced.output) if (o.type === 'function_call') assert.equal(o.name, 'get_weather');

    const schema = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false };
    const j = await client.responses.create({ ...base, input: 'status', max_output_tokens: 40, text: { format: { type: 'json_schema', name: 's', schema, strict: true } } });
    if (j.status === 'completed') assert.deepEqual(Object.keys(JSON.parse(j.output_text)), ['ok']);

    await assert.rejects(client.responses.create({ ...base, input: 'x', previous_response_id: 'resp_1' }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id');
    await assert.rejects(client.responses.create({ ...base, input: 'x', tools: [{ type: 'web_search' }] }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools');
  });

  test('legacy completions', async () => {
    const r = await client.completions.create({ model: 'qwen36-default', prompt: 'Once upon a time', max_tokens: 5, temperature: 0 });
    assert.equal(r.object, 'text_completion');
    assert.equal(typeof r.choices[0].text, 'string');
    assert.equal(r.usage.completion_tokens, 5);
  });

  test('bad parameters: APIError 400 with an OpenAI error body', async () => {
    const bad = [
      { temperature: -1 },
      { temperature: 'hot' },
      { max_tokens: -5 },
      { top_p: 7 },
      { n: 17 },
      { messages: [] },
      { messages: [{ role: 'wizard', content: 'x' }] },
      { stop: 5 },
      { logprobs: false, top_logprobs: 3 },
      { no_such_field: 1 },
    ];
    for (const extra of bad) {
      await assert.rejects(
        client.chat.completions.create({ ...greedy, messages: hello, ...extra }),
        (e) => {
          assert.ok(e instanceof OpenAI.APIError, `${JSON.stringify(extra)}: ${e}`);
          assert.ok(e instanceof OpenAI.BadRequestError);
          assert.equal(e.status, 400, JSON.stringify(extra));
          assert.equal(typeof e.error.message, 'string');
          assert.ok(e.error.message.length > 0);
          return true;
        },
      );
    }
    // A prompt longer than the context.
    await assert.rejects(
      client.chat.completions.create({ ...greedy, messages: [{ role: 'user', content: 'word '.repeat(3000) }] }),
      (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded',
    );
    // The server is still up.
    const ok = await client.chat.completions.create({ ...greedy, messages: hello, max_tokens: 2 });
    assert.equal(ok.choices.length, 1);
  });

  test('wrong API key: APIError 401', async () => {
    const wrong = new OpenAI({ apiKey: 'sk-wrong', baseURL: `${server.url}/v1`, timeout: 10000, maxRetries: 0 });
    for (const call of [() => wrong.models.list(), () => wrong.chat.completions.create({ ...greedy, messages: hello })]) {
      await assert.rejects(call(), (e) => {
        assert.ok(e instanceof OpenAI.AuthenticationError, String(e));
        assert.equal(e.status, 401);
        assert.equal(e.code, 'invalid_api_key');
        return true;
      });
    }
    const health = await fetch(`${server.url}/health`);
    assert.equal(health.status, 200);  // /health stays public
  });

  test('unknown route: APIError 404', async () => {
    await assert.rejects(client.get('/no/such/route'), (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  });
});

// serve --prefix-cache-file: the checkpoints of a shared system prompt, written at shutdown, let
// a restarted server resume it on its first request (cached_tokens), with the same greedy answer.
describe('prefix-cache checkpoints across a restart', { timeout: 120000 }, () => {
  test('written at SIGTERM, read at start', async () => {
    const { mkdtempSync, existsSync: exists, rmSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const dir = mkdtempSync(path.join(tmpdir(), 'qwen36-ckpt-'));
    const file = path.join(dir, 'checkpoints.bin');
    const args = ['--parallel', '1', '-c', '1024', '--snapshot-interval', '16', '--prefix-cache-file', file];
    const system = 'You are a careful assistant. '.repeat(12);
    const ask = async (srv, question) => {
      const c = new OpenAI({ apiKey: 'none', baseURL: `${srv.url}/v1`, timeout: 30000, maxRetries: 0 });
      return c.chat.completions.create({ ...greedy, messages: [{ role: 'system', content: system }, { role: 'user', content: question }] });
    };
    try {
      const first = await startServer({ args });
      const a = await ask(first, 'First question?');
      const b = await ask(first, 'Second question?');  // from the first one's checkpoints
      assert.ok(b.usage.prompt_tokens_details.cached_tokens >= 16, JSON.stringify(b.usage));
      const exit = await first.stop();
      assert.equal(exit.code, 0, first.log());
      assert.ok(exists(file), `no ${file} after shutdown:\n${first.log()}`);
      const second = await startServer({ args });
      try {
        // Its first request resumes from the file's checkpoints (b's own ones among them).
        const again = await ask(second, 'Second question?');
        assert.ok(again.usage.prompt_tokens_details.cached_tokens >= b.usage.prompt_tokens_details.cached_tokens,
          `${JSON.stringify(again.usage)}\n${second.log()}`);
        assert.equal(again.choices[0].message.content, b.choices[0].message.content);
        assert.ok(a.usage.prompt_tokens > 0);
      } finally {
        await second.stop();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
