// The built-in chat page (`GET /` of dsinfer serve) in Debian's headless Chromium, driven
// by Playwright (playwright-core; scripts/setup.sh installs both).
// usage: node chat_page.mjs <dsinfer binary> <source dir> <artifact dir>
// The synthetic model writes random text: we assert what the page shows and what the
// server saw (streamed reply, stop = abort with KV back to baseline, tool call, JSON
// reply, wrong key), never the wording. A screenshot is saved as a test artifact.
import { mkdtempSync, mkdirSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';
import { makeTinyModel, metric, startServer, waitForBaseline } from '../server/harness.mjs';

const [bin, srcDir, artifactDir] = process.argv.slice(2);
const apiKey = 'sk-browser-test';
const tmp = mkdtempSync(path.join(tmpdir(), 'dsinfer-browser-'));
const children = [];
let browser = null;
process.on('exit', () => {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
  rmSync(tmp, { recursive: true, force: true });
});

function log(...a) { console.log('[browser]', ...a); }

// ---- setup: a tiny model, the server with an API key, the browser ----
const modelDir = path.join(tmp, 'tiny');
makeTinyModel(bin, srcDir, modelDir);
const { base } = await startServer(bin, { '--model': modelDir, '--port': '0', '--threads': '1',
  '--api-key': apiKey, '--max-tokens-limit': '4096' }, children);
log('server at', base);
const chromiumPath = process.env.DSINFER_CHROMIUM ?? '/usr/bin/chromium';
assert.ok(existsSync(chromiumPath), `${chromiumPath} missing: run scripts/setup.sh`);
browser = await chromium.launch({
  executablePath: chromiumPath, headless: true,
  // The machine has no network: keep Chromium from trying (see scripts/setup.sh).
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const page = await browser.newPage({ viewport: { width: 1200, height: 800 } });
const pageErrors = [];
page.on('pageerror', (e) => pageErrors.push(e.message));

const assistant = () => page.locator('.msg.assistant').last();
async function sendMessage(text) {
  const before = await page.locator('.msg.assistant, .msg.error').count();
  await page.fill('#input', text);
  await page.click('#send');
  await page.waitForFunction((n) => document.querySelectorAll('.msg.assistant, .msg.error').length > n, before);
}
async function waitReplyDone() {
  await assistant().locator('.stats').waitFor({ timeout: 60000 });
  return (await assistant().locator('.stats').textContent()) ?? '';
}
async function setField(selector, value) {
  await page.fill(selector, value);
  await page.dispatchEvent(selector, 'change');
}

try {
  // The page and its static files come from the binary, without the API key.
  const resp = await page.goto(base + '/');
  assert.equal(resp.status(), 200);
  assert.match(resp.headers()['content-type'], /text\/html/);
  assert.equal(await page.title(), 'dsinfer chat');
  const js = await fetch(base + '/static/app.js');
  assert.equal(js.status, 200);
  assert.match(js.headers.get('content-type'), /javascript/);

  // No key yet: the page says the key is rejected, and so does a message.
  await page.locator('#status', { hasText: '401' }).waitFor({ timeout: 10000 });
  await sendMessage('Hello?');
  await page.locator('.msg.error', { hasText: 'API key rejected' }).waitFor({ timeout: 10000 });
  log('wrong key: clear error');

  // The right key: the model id appears; a streamed reply with its statistics.
  await setField('#api-key', apiKey);
  await page.locator('#model', { hasText: 'model: tiny' }).waitFor({ timeout: 10000 });
  await setField('#max-tokens', '24');
  await setField('#seed', '7');
  await sendMessage('Tell me a story.');
  const stats = await waitReplyDone();
  assert.match(stats, /\d+ tokens · [0-9.]+ tokens\/s/);
  assert.match(stats, /\d+ prompt tokens, \d+ cached/);
  assert.ok(((await assistant().locator('.content').textContent()) ?? '').length > 0, 'reply text shown');
  log('streamed reply:', stats);

  // Reasoning on: the reasoning block is collapsible.
  await page.check('#reasoning');
  await page.dispatchEvent('#reasoning', 'change');
  await sendMessage('Think first.');
  await waitReplyDone();
  assert.equal(await assistant().locator('details.reasoning summary').textContent(), 'Reasoning');
  await page.uncheck('#reasoning');
  await page.dispatchEvent('#reasoning', 'change');
  log('reasoning shown in a collapsible block');

  // Stop mid-stream: the server aborts the generation and frees its KV.
  const disconnectsBefore = await metric(base, 'dsinfer_client_disconnects_total');
  await setField('#max-tokens', '4000');
  await page.click('#clear');
  await sendMessage('Write a very long essay.');
  await page.waitForFunction(() => {
    const c = document.querySelector('.msg.assistant:last-child .content');
    return c && c.textContent.length > 20;
  }, null, { timeout: 30000 });
  await page.click('#stop');
  assert.equal(await waitReplyDone(), 'stopped');
  await waitForBaseline(base);
  const deadline = Date.now() + 10000;
  while (await metric(base, 'dsinfer_client_disconnects_total') <= disconnectsBefore) {
    assert.ok(Date.now() < deadline, 'the server never saw the stop as a disconnect');
    await new Promise((r) => setTimeout(r, 100));
  }
  log('stop: generation aborted, KV back to baseline');

  // A tool call (tool_choice required: the grammar makes the model call the tool).
  await page.click('#clear');
  await setField('#max-tokens', '200');
  await page.click('details:has(#tools) summary');
  await setField('#tools', JSON.stringify([{ type: 'function', function: { name: 'get_weather',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'] } } }]));
  await page.selectOption('#tool-choice', 'required');
  await page.dispatchEvent('#tool-choice', 'change');
  await sendMessage('What is the weather in Paris?');
  await waitReplyDone();
  assert.equal(await assistant().locator('.tool-call .name').first().textContent(), 'get_weather');
  const argsText = (await assistant().locator('.tool-call .arguments').first().textContent()) ?? '';
  const args = JSON.parse(argsText.slice(1, -1));
  assert.equal(typeof args.city, 'string');
  log('tool call rendered:', argsText);
  await setField('#tools', '');

  // A JSON schema sets response_format: the reply is JSON that follows it.
  await page.click('#clear');
  await page.click('details:has(#schema) summary');
  await setField('#schema', JSON.stringify({ type: 'object', properties: {
    answer: { type: 'string', maxLength: 16 }, score: { type: 'integer', minimum: 0, maximum: 100 } }, required: ['answer', 'score'], additionalProperties: false }));
  await sendMessage('Answer in JSON.');
  const jsonStats = await waitReplyDone();
  assert.match(jsonStats, /finish: stop/, 'the grammar let the object close');
  const reply = JSON.parse((await assistant().locator('.content').textContent()) ?? '');
  assert.equal(typeof reply.answer, 'string');
  assert.ok(Number.isInteger(reply.score));
  log('JSON reply follows the schema');

  // A bad schema is a clear error from the server, shown in the page.
  await setField('#schema', '{"type": "object", "properties": 5}');
  await sendMessage('Again.');
  await page.locator('.msg.error', { hasText: 'HTTP 400' }).waitFor({ timeout: 10000 });
  await setField('#schema', '');

  mkdirSync(artifactDir, { recursive: true });
  const shot = path.join(artifactDir, 'chat_page.png');
  await page.screenshot({ path: shot, fullPage: true });
  log('screenshot', shot);
  assert.deepEqual(pageErrors, [], 'no script errors in the page');
  log('all passed');
} finally {
  await browser.close();
}
// The server child's pipes keep the event loop alive: exit here (the 'exit' handler kills
// the server and removes the temporary directory).
process.exit(0);
