// The official Anthropic SDK (@anthropic-ai/sdk) against `qwen36 serve`'s /v1/messages (tiny
// random model, loopback): a message and its usage, the same message streamed, tool_use /
// tool_result turns, a forced tool (its input held to the schema), count_tokens, errors (400 / 401
// as the SDK's errors), stop sequences, an assistant prefill.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startServer } from './serve.mjs';

const KEY = 'sk-qwen36-test';
let server;
let client;

before(async () => {
  server = await startServer({ apiKey: KEY, args: ['--parallel', '2', '-c', '1024'] });
  client = new Anthropic({ apiKey: KEY, baseURL: server.url, timeout: 30000, maxRetries: 0 });
});
after(async () => {
  if (server) await server.stop();
});

const base = { model: 'qwen36-default', max_tokens: 12, temperature: 0 };
const tools = [{ name: 'get_weather', description: 'Weather of a city', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];
const ask = [{ role: 'user', content: 'Weather in Paris?' }];

describe('anthropic client', { timeout: 120000 }, () => {
  test('message: shape and usage', async () => {
    const m = await client.messages.create({ ...base, system: 'Be brief.', messages: ask });
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.match(m.id, /^msg_/);
    assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason), m.stop_reason);
    assert.ok(m.usage.input_tokens > 0 && m.usage.output_tokens > 0 && m.usage.output_tokens <= 12);
    const counted = await client.messages.countTokens({ model: base.model, system: 'Be brief.', messages: ask });
    assert.equal(counted.input_tokens, m.usage.input_tokens);
  });

  test('a final assistant message is continued (prefill)', async () => {
    // Its text ends the prompt: more input tokens than the question alone, and the answer is
    // what the OpenAI route gives for the same conversation (a trailing assistant message is
    // continued there too).
    const prefilled = [...ask, { role: 'assistant', content: 'The weather in Paris is' }];
    const m = await client.messages.create({ ...base, messages: prefilled });
    const q = await client.messages.create({ ...base, messages: ask });
    assert.ok(m.usage.input_tokens > q.usage.input_tokens + 4, `${m.usage.input_tokens} vs ${q.usage.input_tokens}`);
    const r = await fetch(`${server.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ model: base.model, max_tokens: base.max_tokens, temperature: 0, messages: prefilled }),
    });
    const chat = await r.json();
    assert.equal(chat.usage.prompt_tokens, m.usage.input_tokens);
    const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    assert.equal(text, chat.choices[0].message.content ?? '');
  });

  test('a forced tool, streamed and not: the same content', async () => {
    // The call's input is held to the tool's schema: here one of two cities.
    const cities = [{ ...tools[0], input_schema: { type: 'object', properties: { city: { enum: ['Paris', 'Oslo'] } }, required: ['city'] } }];
    const req = { ...base, max_tokens: 60, tools: cities, tool_choice: { type: 'tool', name: 'get_weather' }, messages: ask };
    const m = await client.messages.create(req);
    assert.equal(m.stop_reason, 'tool_use');
    const call = m.content.find((b) => b.type === 'tool_use');
    assert.ok(call, JSON.stringify(m.content));
    assert.equal(call.name, 'get_weather');
    assert.ok(['Paris', 'Oslo'].includes(call.input.city), JSON.stringify(call.input));
    const stream = client.messages.stream(req);
    const types = [];
    stream.on('streamEvent', (e) => types.push(e.type));
    const final = await stream.finalMessage();
    assert.deepEqual(final.content, m.content);
    assert.equal(final.stop_reason, m.stop_reason);
    assert.equal(types[0], 'message_start');
    assert.equal(types.at(-1), 'message_stop');
  });

  test('tool_use and tool_result turns render and run', async () => {
    const m = await client.messages.create({
      ...base, tools,
      messages: [
        ...ask,
        { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '21 C' }, { type: 'text', text: 'And?' }] },
      ],
    });
    assert.equal(m.type, 'message');
  });

  test('errors: 400 and 401 as the SDK raises them', async () => {
    await assert.rejects(client.messages.create({ ...base, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }),
      (e) => e instanceof Anthropic.BadRequestError && e.status === 400);
    await assert.rejects(client.messages.create({ ...base, tool_choice: { type: 'sometimes' }, messages: ask }),
      (e) => e instanceof Anthropic.BadRequestError && e.error.type === 'error' &&
        e.error.error.type === 'invalid_request_error' && /tool_choice/.test(e.error.error.message));
    const wrong = new Anthropic({ apiKey: 'sk-wrong', baseURL: server.url, timeout: 10000, maxRetries: 0 });
    await assert.rejects(wrong.messages.create({ ...base, messages: ask }),
      (e) => e instanceof Anthropic.AuthenticationError && e.error.error.type === 'authentication_error');
  });

  test('a stop sequence is reported as the stop reason, streamed and not', async () => {
    // Greedy: the answer without a stop sequence, then one of its words as the stop sequence.
    const plain = await client.messages.create({ ...base, max_tokens: 24, messages: ask });
    const text = plain.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    const word = text.trim().split(/\s+/).find((w) => w.length >= 2 && text.indexOf(w) > 0);
    if (!word) return;  // a random model's answer without a usable word: nothing to stop on
    const req = { ...base, max_tokens: 24, messages: ask, stop_sequences: [word] };
    const m = await client.messages.create(req);
    assert.equal(m.stop_reason, 'stop_sequence');
    assert.equal(m.stop_sequence, word);
    const final = await client.messages.stream(req).finalMessage();
    assert.equal(final.stop_reason, 'stop_sequence');
    assert.equal(final.stop_sequence, word);
  });
});
