// End-to-end tests of `dsinfer serve` on loopback with the official clients.
// usage: node e2e.mjs <dsinfer binary> <source dir>
// The synthetic model writes random text: we assert well-formedness, event order,
// usage counts and error shapes, never content.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import net from 'node:net';
import path from 'node:path';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { createRequire } from 'node:module';
import { withTimeout, makeTinyModel, startServer as startServerWith, runTests } from './harness.mjs';

const [bin, srcDir] = process.argv.slice(2);
const loadSeconds = Number(process.env.DSINFER_SERVER_LOAD_S ?? 10);
const loadClients = Number(process.env.DSINFER_SERVER_LOAD_CLIENTS ?? 32);
const tmp = mkdtempSync(path.join(tmpdir(), 'dsinfer-serve-'));
const children = [];
process.on('exit', () => {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
  rmSync(tmp, { recursive: true, force: true });
});

function log(...a) { console.log('[e2e]', ...a); }

function startServer(overrides) {
  return startServerWith(bin, { '--model': modelDir, '--port': '0', '--threads': '1',
    '--max-body-bytes': '65536', '--header-timeout-ms': '1000', '--default-max-tokens': '16',
    '--max-concurrent': '400', '--drain-grace-ms': '3000', ...overrides }, children);
}

async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const get = (name) => {
    const m = text.match(new RegExp(`^${name} ([0-9.e+-]+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  return { used: get('dsinfer_kv_blocks_used'), running: get('dsinfer_requests_running'),
           inFlight: get('dsinfer_requests_in_flight'), text };
}

async function waitForBaseline(base, what) {
  const deadline = Date.now() + 30000;
  let m;
  while (Date.now() < deadline) {
    m = await metrics(base);
    if (m.used === 0 && m.running === 0 && m.inFlight === 0) return m;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${what}: KV not back to baseline: used=${m.used} running=${m.running} in_flight=${m.inFlight}`);
}

// DSINFER_E2E_ONLY=substring runs only the tests whose name contains it (server_load_test).
const only = process.env.DSINFER_E2E_ONLY;
const tests = [];
function test(name, fn) { if (!only || name.includes(only)) tests.push({ name, fn }); }

// ---- setup: a tiny model in a temp dir ----
const modelDir = path.join(tmp, 'tiny');
makeTinyModel(bin, srcDir, modelDir);
const main = await startServer({});
const { base, model } = main;
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0 });
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'weather',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];

test('models, health, ready', async () => {
  const list = await openai.models.list();
  assert.equal(list.data[0].id, model);
  assert.equal((await fetch(`${base}/health`)).status, 200);
  assert.equal((await fetch(`${base}/ready`)).status, 200);
});

test('chat non-stream with logprobs, usage, seed', async () => {
  const req = { model, messages, max_tokens: 8, seed: 7, temperature: 1, logprobs: true, top_logprobs: 2 };
  const r = await openai.chat.completions.create(req);
  assert.equal(r.object, 'chat.completion');
  const c = r.choices[0];
  assert.equal(typeof c.message.content, 'string');
  assert.ok(['length', 'stop'].includes(c.finish_reason));
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(c.logprobs.content.length, r.usage.completion_tokens);
  for (const t of c.logprobs.content) assert.equal(t.top_logprobs.length, 2);
  const again = await openai.chat.completions.create(req);
  assert.equal(again.choices[0].message.content, c.message.content, 'same seed, same text');
});

test('chat stream: role first, usage chunk, [DONE]', async () => {
  const stream = await openai.chat.completions.create({ model, messages, max_tokens: 12, stream: true,
    stream_options: { include_usage: true } });
  const chunks = [];
  for await (const ch of stream) chunks.push(ch);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const fin = chunks.filter((c) => c.choices.length && c.choices[0].finish_reason);
  assert.equal(fin.length, 1);
  const usage = chunks.at(-1).usage;
  assert.ok(usage && usage.completion_tokens >= 1 && usage.completion_tokens <= 12);
});

test('chat stream helper with tools (shape) and reasoning on', async () => {
  const runner = openai.chat.completions.stream({ model, messages, tools, max_tokens: 10,
    reasoning_effort: 'high', thinking: { type: 'enabled' } });
  const done = await runner.finalChatCompletion();
  const c = done.choices[0];
  assert.ok(['length', 'stop', 'tool_calls'].includes(c.finish_reason));
  for (const tc of c.message.tool_calls ?? []) JSON.parse(tc.function.arguments);
});

test('completions stream and not', async () => {
  const r = await openai.completions.create({ model, prompt: 'Once upon a time', max_tokens: 5, logprobs: 1 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].logprobs.tokens.length, r.usage.completion_tokens);
  const s = await openai.completions.create({ model, prompt: 'Once', max_tokens: 5, stream: true });
  let n = 0; let finish = null;
  for await (const ch of s) { n++; if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason; }
  assert.ok(n >= 1 && finish);
});

test('responses: create and streaming helper', async () => {
  const r = await openai.responses.create({ model, input: 'Hello', max_output_tokens: 8 });
  assert.equal(r.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(r.status));
  const events = [];
  const stream = openai.responses.stream({ model, input: 'Hello', max_output_tokens: 8 });
  stream.on('event', (e) => events.push(e.type));
  const final = await stream.finalResponse();
  assert.equal(events[0], 'response.created');
  assert.ok(['response.completed', 'response.incomplete'].includes(events.at(-1)));
  assert.ok(final.usage.output_tokens >= 1);
});

test('messages: stream with thinking, tools', async () => {
  const stream = anthropic.messages.stream({ model, max_tokens: 12, messages,
    thinking: { type: 'enabled', budget_tokens: 8 },
    tools: [{ name: 'get_weather', description: 'weather',
      input_schema: { type: 'object', properties: { city: { type: 'string' } } } }] });
  const types = [];
  stream.on('streamEvent', (e) => types.push(e.type));
  const msg = await stream.finalMessage();
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.ok(['max_tokens', 'end_turn', 'tool_use'].includes(msg.stop_reason));
  assert.ok(msg.usage.output_tokens >= 1 && msg.usage.output_tokens <= 12);
  const plain = await anthropic.messages.create({ model, max_tokens: 5, messages });
  assert.equal(plain.type, 'message');
});

// Structured output (issue 7): ajv (draft 2020-12) from tests/grammar/node_modules when
// installed, else a hand check of the schema's fields.
function schemaValidator(schema) {
  try {
    const require = createRequire(path.join(srcDir, 'tests/grammar/package.json'));
    const Ajv2020 = require('ajv/dist/2020').default;
    const addFormats = require('ajv-formats');
    const ajv = new Ajv2020({ strict: false });
    addFormats(ajv);
    const v = ajv.compile(schema);
    return (x) => { assert.ok(v(x), JSON.stringify(v.errors) + ' ' + JSON.stringify(x)); };
  } catch (e) {
    if (e.code !== 'MODULE_NOT_FOUND') throw e;
    log('ajv not installed under tests/grammar: checking fields by hand');
    return (x) => {
      assert.equal(typeof x, 'object');
      for (const k of schema.required ?? []) assert.ok(k in x, `missing ${k}`);
      for (const [k, s] of Object.entries(schema.properties ?? {})) {
        if (!(k in x)) continue;
        const t = s.type === 'integer' ? 'number' : s.type;
        if (t) assert.equal(typeof x[k], t, k);
        if (s.enum) assert.ok(s.enum.includes(x[k]), k);
      }
    };
  }
}

test('structured output: response_format json_schema / json_object, text.format, bad schema 400', async () => {
  const schema = { type: 'object', properties: {
    city: { type: 'string', maxLength: 12 },
    temp_c: { type: 'integer', minimum: -50, maximum: 60 },
    sky: { enum: ['sun', 'rain', 'snow'] },
    windy: { type: 'boolean' } }, required: ['city', 'temp_c', 'sky'], additionalProperties: false };
  const validate = schemaValidator(schema);
  for (const seed of [1, 2, 3]) {
    const r = await openai.chat.completions.create({ model, messages, max_tokens: 120, seed, temperature: 1,
      response_format: { type: 'json_schema', json_schema: { name: 'weather', schema, strict: true } } });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', c.message.content);
    validate(JSON.parse(c.message.content));
  }
  // Streamed: the concatenated deltas are the JSON.
  const stream = await openai.chat.completions.create({ model, messages, max_tokens: 120, seed: 4,
    stream: true, response_format: { type: 'json_schema', json_schema: { name: 'weather', schema } } });
  let text = '';
  for await (const ch of stream) text += ch.choices[0]?.delta?.content ?? '';
  validate(JSON.parse(text));
  // json_object: any JSON object (bounded by max_tokens, so only the shape when it finished).
  const o = await openai.chat.completions.create({ model, messages, max_tokens: 200, seed: 5,
    response_format: { type: 'json_object' } });
  if (o.choices[0].finish_reason === 'stop') {
    const v = JSON.parse(o.choices[0].message.content);
    assert.equal(typeof v, 'object');
    assert.ok(v !== null && !Array.isArray(v));
  } else {
    assert.ok(o.choices[0].message.content.startsWith('{'));
  }
  // Responses text.format.
  const resp = await openai.responses.create({ model, input: 'Weather?', max_output_tokens: 120,
    text: { format: { type: 'json_schema', name: 'weather', schema, strict: true } } });
  assert.equal(resp.status, 'completed');
  validate(JSON.parse(resp.output_text));
  // guided_regex extension (vLLM-style top-level field).
  const g = await openai.chat.completions.create({ model, messages, max_tokens: 30, seed: 6,
    guided_regex: '(yes|no), [0-9]{2}' });
  assert.match(g.choices[0].message.content, /^(yes|no), [0-9]{2}$/);
  // Unsupported keyword / invalid schema / invalid regex: 400 BadRequestError naming it.
  const bad = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', unevaluatedProperties: false } } } }, /unevaluatedProperties/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'frog' } } } }, /frog/],
    [{ guided_regex: '(a' }, /guided_regex/],
  ];
  for (const [extra, says] of bad) {
    await assert.rejects(openai.chat.completions.create({ model, messages, max_tokens: 5, ...extra }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 &&
        e.error?.type === 'invalid_request_error' && says.test(e.message));
  }
  await assert.rejects(openai.responses.create({ model, input: 'x', max_output_tokens: 5,
    text: { format: { type: 'json_schema', name: 'x', schema: { type: 'object', $dynamicRef: '#x' } } } }),
    (e) => e instanceof OpenAI.BadRequestError && /dynamicRef/.test(e.message));
});

test('structured output: tool_choice required / named -> DSML tool calls matching the schema', async () => {
  const params = { type: 'object', properties: {
    city: { type: 'string', maxLength: 10 }, days: { type: 'integer', minimum: 1, maximum: 7 },
    unit: { enum: ['c', 'f'] } }, required: ['city', 'days'], additionalProperties: false };
  const validate = schemaValidator(params);
  const wtools = [{ type: 'function', function: { name: 'get_weather', parameters: params } },
    { type: 'function', function: { name: 'get_time', parameters: { type: 'object',
      properties: { zone: { type: 'string', maxLength: 8 } }, required: ['zone'] } } }];
  for (const [tool_choice, parallel_tool_calls, seed] of [
    [{ type: 'function', function: { name: 'get_weather' } }, undefined, 1],
    ['required', false, 2]]) {
    const r = await openai.chat.completions.create({ model, messages, tools: wtools, tool_choice,
      parallel_tool_calls, max_tokens: 200, seed, temperature: 1 });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
    assert.equal(c.message.tool_calls.length, 1);
    const call = c.message.tool_calls[0].function;
    const args = JSON.parse(call.arguments);
    if (call.name === 'get_weather') validate(args);
    else assert.equal(typeof args.zone, 'string');
  }
});

test('malformed requests get the right 4xx and the server keeps serving', async () => {
  const post = (p, body, headers = {}) => fetch(`${base}${p}`, { method: 'POST',
    headers: { 'content-type': 'application/json', ...headers }, body });
  let r = await post('/v1/chat/completions', '{not json');
  assert.equal(r.status, 400);
  assert.ok((await r.json()).error.message);
  r = await post('/v1/chat/completions', JSON.stringify({ model, messages: 'nope' }));
  assert.equal(r.status, 400);
  r = await post('/v1/chat/completions', JSON.stringify({ model, messages, max_tokens: 'x' }));
  assert.equal(r.status, 400);
  r = await post('/v1/chat/completions', JSON.stringify({ model: 'no-such-model', messages }));
  assert.equal(r.status, 404);
  r = await post('/v1/messages', JSON.stringify({ model, messages: [] , max_tokens: 4 }));
  assert.equal(r.status, 400);
  const body = await r.json();
  assert.equal(body.type, 'error');
  r = await post('/v1/messages', JSON.stringify({ model, max_tokens: 4,
    messages: [{ role: 'user', content: 'x'.repeat(100000) }] }));
  assert.equal(r.status, 413);
  assert.equal((await r.json()).type, 'error');
  r = await post('/v1/chat/completions', JSON.stringify({ model, messages, max_tokens: 1000000 }));
  assert.equal(r.status, 400);
  r = await post('/v1/nothing', '{}');
  assert.equal(r.status, 404);
  // Unknown top-level fields: OpenAI's and Anthropic's wording and shapes.
  r = await post('/v1/chat/completions', JSON.stringify({ model, messages, max_tokens: 2, foo: 1 }));
  assert.equal(r.status, 400);
  let e = (await r.json()).error;
  assert.equal(e.message, 'Unrecognized request argument supplied: foo');
  assert.equal(e.type, 'invalid_request_error');
  r = await post('/v1/responses', JSON.stringify({ model, input: 'x', max_tokens: 2 }));
  assert.equal(r.status, 400);
  assert.equal((await r.json()).error.message, 'Unrecognized request argument supplied: max_tokens');
  r = await post('/v1/messages', JSON.stringify({ model, messages, max_tokens: 2, foo: 1 }));
  assert.equal(r.status, 400);
  e = await r.json();
  assert.equal(e.type, 'error');
  assert.equal(e.error.type, 'invalid_request_error');
  assert.equal(e.error.message, 'foo: Extra inputs are not permitted');
  await assert.rejects(openai.chat.completions.create({ model: 'nope', messages }), (e) => e.status === 404);
  assert.equal((await fetch(`${base}/health`)).status, 200);
  const ok = await openai.chat.completions.create({ model, messages, max_tokens: 2 });
  assert.ok(ok.choices.length === 1);
});

// Issue 22 D1: ~19,000 nested `[` used to overflow the stack (the body parsed, the
// copies and dumps recursed). Each place is a 400 naming the field; the server lives on.
test('20,000-level nesting in every place is a 400 and the server keeps serving', async () => {
  const post = (p, body) => fetch(`${base}${p}`, { method: 'POST',
    headers: { 'content-type': 'application/json' }, body });
  const d = '['.repeat(20000) + ']'.repeat(20000);
  const user = '[{"role":"user","content":"hi"}]';
  const cases = [
    ['/v1/chat/completions', 'tools[0].function.parameters.x', `{"model":"${model}","messages":${user},` +
      `"tools":[{"type":"function","function":{"name":"f","parameters":{"x":${d}}}}]}`],
    ['/v1/chat/completions', 'messages[1].tool_calls[0].function.arguments.x',
      `{"model":"${model}","messages":[{"role":"user","content":"hi"},{"role":"assistant",` +
      `"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":` +
      `${JSON.stringify(`{"x":${d}}`)}}}]}]}`],
    ['/v1/chat/completions', 'response_format.json_schema.schema.x', `{"model":"${model}","messages":${user},` +
      `"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"x":${d}}}}}`],
    ['/v1/responses', 'text.format.schema.x', `{"model":"${model}","input":"hi",` +
      `"text":{"format":{"type":"json_schema","name":"s","schema":{"x":${d}}}}}`],
    ['/v1/responses', 'input[1].arguments.x', `{"model":"${model}","input":[{"role":"user","content":"hi"},` +
      `{"type":"function_call","call_id":"c","name":"f","arguments":${JSON.stringify(`{"x":${d}}`)}}]}`],
    ['/v1/messages', 'tools[0].input_schema.x', `{"model":"${model}","max_tokens":4,"messages":${user},` +
      `"tools":[{"name":"f","input_schema":{"x":${d}}}]}`],
    ['/v1/messages', 'messages[1].content[0].input.x', `{"model":"${model}","max_tokens":4,"messages":` +
      `[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"c",` +
      `"name":"f","input":{"x":${d}}}]}]}`],
    ['/v1/completions', 'prompt', `{"model":"${model}","prompt":${d}}`],
  ];
  for (const [route, field, body] of cases) {
    const r = await post(route, body);
    assert.equal(r.status, 400, `${route} ${field}`);
    const j = await r.json();
    if (route === '/v1/messages') assert.equal(j.type, 'error');
    assert.equal(j.error.message, `${field}: JSON nested deeper than 128 levels`);
  }
  assert.equal((await fetch(`${base}/health`)).status, 200);
  const ok = await openai.chat.completions.create({ model, messages, max_tokens: 2 });
  assert.ok(ok.choices.length === 1);
});

test('a body over 64 MiB gets 413 and the connection closed before it is read', async () => {
  const declared = 100 * 1024 * 1024;
  const res = await withTimeout(new Promise((resolve) => {
    let reply = '';
    let sent = 0;
    const s = net.connect(Number(new URL(base).port), '127.0.0.1', () => {
      s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
              `Content-Length: ${declared}\r\n\r\n`);
      const chunk = Buffer.alloc(1 << 20, 0x20);
      const pump = () => {
        while (sent < declared && !s.destroyed) {
          sent += chunk.length;
          if (!s.write(chunk)) { s.once('drain', pump); return; }
        }
      };
      pump();
    });
    s.on('data', (d) => { reply += d; });
    s.on('close', () => resolve({ reply, sent }));
    s.on('error', () => {});
  }), 30000, '413 close');
  // The server answers 413 and closes after a bounded drain; when the client is still
  // sending then, the close is a TCP reset and the kernel may drop the unread 413 (seen
  // once on a busy machine). So: a reply, if any, is the 413; either way the body was
  // never read in full and the server keeps serving.
  if (res.reply !== '') {
    assert.match(res.reply, /^HTTP\/1\.1 413/);
    assert.match(res.reply, /Connection: close/i);
  }
  assert.ok(res.sent < declared, `client sent ${res.sent} of ${declared} bytes before the close`);
  assert.equal((await fetch(`${base}/health`)).status, 200);
});

test('slow-loris header is cut off by the header timeout: 408, then close', async () => {
  let reply = '';
  const closed = await withTimeout(new Promise((resolve) => {
    const s = net.connect(Number(new URL(base).port), '127.0.0.1', () => {
      s.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n');
    });
    s.on('data', (d) => { reply += d.toString('latin1'); });
    s.on('close', () => resolve(true));
    s.on('error', () => resolve(true));
  }), 5000, 'slow loris close');
  assert.ok(closed);
  assert.match(reply, /^HTTP\/1\.1 408 /);
  assert.match(reply, /request head did not arrive within 1000 ms/);
});

test('100 clients disconnect mid-stream: KV back to baseline', async () => {
  await waitForBaseline(base, 'before');
  const runs = [];
  for (let i = 0; i < 100; i++) {
    runs.push((async () => {
      const ac = new AbortController();
      const stream = await openai.chat.completions.create({ model, messages, max_tokens: 2000,
        stream: true }, { signal: ac.signal });
      try {
        for await (const ch of stream) { if (ch.choices[0]?.delta?.content !== undefined) { ac.abort(); } }
      } catch (e) { if (e.name !== 'AbortError' && !(e instanceof OpenAI.APIUserAbortError)) throw e; }
    })());
  }
  await withTimeout(Promise.all(runs), 120000, '100 streams');
  const m = await waitForBaseline(base, 'after disconnects');
  const disconnects = Number(m.text.match(/^dsinfer_client_disconnects_total (\d+)/m)[1]);
  assert.ok(disconnects >= 90, `disconnects=${disconnects}`);
});

test(`bounded load: ${loadClients} streaming clients for ${loadSeconds}s`, async () => {
  const end = Date.now() + loadSeconds * 1000;
  const gaps = [];
  let requests = 0;
  const client = async () => {
    while (Date.now() < end) {
      const stream = await openai.chat.completions.create({ model, messages, max_tokens: 16, stream: true });
      let last = 0;
      for await (const ch of stream) {
        const now = performance.now();
        if (last && ch.choices[0]?.delta?.content) gaps.push(now - last);
        if (ch.choices[0]?.delta?.content) last = now;
      }
      requests++;
    }
  };
  // The guard only catches a hang: the tail (the last loadClients requests, started just
  // before the end) takes minutes on a slow or busy 2-core machine.
  await withTimeout(Promise.all(Array.from({ length: loadClients }, client)), (loadSeconds + 480) * 1000, 'load');
  gaps.sort((a, b) => a - b);
  const p = (q) => gaps[Math.min(gaps.length - 1, Math.floor(q * gaps.length))] ?? 0;
  log(`load: ${requests} requests, inter-token ms p50=${p(0.5).toFixed(1)} p90=${p(0.9).toFixed(1)} p99=${p(0.99).toFixed(1)}`);
  assert.ok(requests >= loadClients);
  await waitForBaseline(base, 'after load');
});

// Issue 14 part 2: per-key salts (--api-keys-file KEY:SALT) keep tenants' prefixes
// apart; the same key hits its own; cache_salt / traffic_class / timeout_ms in each API.
test('api keys with salts: no shared prefix across keys, hits within one', async () => {
  const keysFile = path.join(tmp, 'keys.txt');
  writeFileSync(keysFile, '# tenants\nkey-a:tenant-a\nkey-b:tenant-b\n');
  const s = await startServer({ '--api-keys-file': keysFile });
  const long = [{ role: 'user', content: 'the quick brown fox jumps over the lazy dog '.repeat(40) }];
  const cached = async (key) => {
    const c = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: key, maxRetries: 0 });
    const r = await c.chat.completions.create({ model: s.model, messages: long, max_tokens: 2 });
    return r.usage.prompt_tokens_details.cached_tokens;
  };
  assert.equal(await cached('key-a'), 0);
  assert.equal(await cached('key-b'), 0);
  assert.ok(await cached('key-a') >= 128);
  assert.ok(await cached('key-b') >= 128);
  // The serving controls are accepted by each API, and bad values are 400s in its shape.
  const post = (p, body) => fetch(`${s.base}${p}`, { method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer key-a' },
    body: JSON.stringify(body) });
  const controls = { cache_salt: 'x', traffic_class: 'agent', timeout_ms: 60000 };
  const bodies = {
    '/v1/chat/completions': { model: s.model, messages, max_tokens: 2 },
    '/v1/completions': { model: s.model, prompt: 'Hi', max_tokens: 2 },
    '/v1/responses': { model: s.model, input: 'Hi', max_output_tokens: 2 },
    '/v1/messages': { model: s.model, messages, max_tokens: 2 },
  };
  for (const [route, body] of Object.entries(bodies)) {
    let r = await post(route, { ...body, ...controls });
    assert.equal(r.status, 200, `${route}: ${await r.clone().text()}`);
    await r.text();
    r = await post(route, { ...body, traffic_class: 'batch' });
    assert.equal(r.status, 400);
    const j = await r.json();
    if (route === '/v1/messages') assert.equal(j.type, 'error');
    assert.ok(j.error.message.startsWith('traffic_class: '), j.error.message);
  }
  s.child.kill('SIGTERM');
});

test('api key, 429 with Retry-After, SIGTERM drain exits 0', async () => {
  const s = await startServer({ '--api-key': 'sekrit', '--max-concurrent': '2' });
  const post = (headers, body) => fetch(`${s.base}/v1/chat/completions`, { method: 'POST',
    headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  let r = await post({}, { model: s.model, messages });
  assert.equal(r.status, 401);
  r = await fetch(`${s.base}/v1/messages`, { method: 'POST', headers: { 'x-api-key': 'wrong' }, body: '{}' });
  assert.equal(r.status, 401);
  assert.equal((await r.json()).error.type, 'authentication_error');
  const ok = new Anthropic({ baseURL: s.base, apiKey: 'sekrit', maxRetries: 0 });
  await ok.messages.create({ model: s.model, max_tokens: 2, messages });
  // Two long streams hold both slots; the third gets 429.
  const long = [0, 1].map(() => post({ authorization: 'Bearer sekrit' },
    { model: s.model, messages, max_tokens: 3000, stream: true }));
  const held = await Promise.all(long);
  for (const h of held) assert.equal(h.status, 200);
  r = await post({ authorization: 'Bearer sekrit' }, { model: s.model, messages, max_tokens: 2 });
  assert.equal(r.status, 429);
  assert.ok(r.headers.get('retry-after'));
  // SIGTERM while both stream: /ready turns 503, the process exits 0 after the grace.
  const exited = new Promise((resolve) => s.child.on('exit', (code) => resolve(code)));
  s.child.kill('SIGTERM');
  const drained = held.map(async (h) => { try { await h.text(); } catch { /* cut at grace end */ } });
  const code = await withTimeout(exited, 20000, 'drain exit');
  await Promise.all(drained);
  assert.equal(code, 0);
});

await runTests(tests, log, main);
