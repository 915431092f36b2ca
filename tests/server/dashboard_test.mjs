// The Grafana dashboard (deploy/grafana/dsinfer.json) against a running `dsinfer serve`:
// every metric a panel queries exists in /metrics with the type the query needs
// (histogram_quantile over *_bucket: a histogram; rate()/increase(): a counter; bare: a
// gauge), and the dashboard covers what an operator watches.
// usage: node dashboard_test.mjs <dsinfer binary> <source dir>
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import assert from 'node:assert/strict';
import { makeTinyModel, startServer } from './harness.mjs';

const [bin, srcDir] = process.argv.slice(2);
const tmp = mkdtempSync(path.join(tmpdir(), 'dsinfer-dashboard-'));
const children = [];
process.on('exit', () => {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
  rmSync(tmp, { recursive: true, force: true });
});

const dashboard = JSON.parse(readFileSync(path.join(srcDir, 'deploy/grafana/dsinfer.json'), 'utf8'));
assert.equal(dashboard.__inputs[0].name, 'DS_PROMETHEUS');

// Which metric each query reads, and as what.
const uses = new Map();  // metric name -> expected type
for (const panel of dashboard.panels) {
  assert.ok(panel.targets.length > 0, `panel '${panel.title}' has no query`);
  for (const t of panel.targets) {
    assert.equal(t.datasource.uid, '${DS_PROMETHEUS}', `panel '${panel.title}': datasource`);
    const rated = new Set([...t.expr.matchAll(/\b(?:rate|increase)\(\s*(dsinfer_\w+)/g)].map((m) => m[1]));
    for (const [name] of t.expr.matchAll(/\bdsinfer_\w+/g)) {
      let expected;
      if (name.endsWith('_bucket')) {
        assert.match(t.expr, /histogram_quantile\(/, `${name} outside histogram_quantile`);
        expected = ['histogram', name.slice(0, -'_bucket'.length)];
      } else if (rated.has(name)) {
        expected = ['counter', name];
      } else {
        expected = ['gauge', name];
      }
      uses.set(expected[1], expected[0]);
    }
  }
}

const modelDir = path.join(tmp, 'tiny');
makeTinyModel(bin, srcDir, modelDir);
const { base, model } = await startServer(bin,
  { '--model': modelDir, '--port': '0', '--threads': '1' }, children);
// One request, so the labelled counters and histograms have samples.
const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST',
  headers: { 'Content-Type': 'application/json' },
  body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, stream: true }) });
assert.equal(r.status, 200);
await r.text();
const text = await (await fetch(`${base}/metrics`)).text();
const types = new Map([...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => [m[1], m[2]]));

for (const [name, type] of uses) {
  assert.ok(types.has(name), `the dashboard queries ${name}, which /metrics does not serve`);
  assert.equal(types.get(name), type, `${name}: the dashboard reads it as a ${type}`);
  if (type === 'histogram') assert.match(text, new RegExp(`^${name}_bucket\\{le="`, 'm'));
}

// What an operator needs on one screen (issue 23): traffic, errors, latency percentiles,
// throughput, sequences, KV pool, prefix and store hits.
for (const needed of ['dsinfer_requests_total', 'dsinfer_time_to_first_token_seconds',
  'dsinfer_time_per_output_token_seconds', 'dsinfer_engine_output_tokens_total',
  'dsinfer_requests_running', 'dsinfer_kv_blocks_used', 'dsinfer_prefix_hit_tokens_total',
  'dsinfer_store_hit_tokens_total']) {
  assert.ok(uses.has(needed), `the dashboard has no panel over ${needed}`);
}
console.log(`[dashboard] ${dashboard.panels.length} panels, ${uses.size} metrics, all served with their types`);
// The server child's pipes keep the event loop alive: exit here (the 'exit' handler kills
// the server and removes the temporary directory).
process.exit(0);
