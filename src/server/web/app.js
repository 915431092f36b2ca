// dsinfer chat page: streams /v1/chat/completions (OpenAI shape) from the server that
// served this page. Reasoning goes into a collapsible block, tool calls are rendered
// with their arguments, and every reply ends with its token rate and cached tokens.
'use strict';

const $ = (id) => document.getElementById(id);
const history = [];  // the conversation sent with every request (OpenAI messages)
let modelId = null;
let controller = null;  // AbortController of the reply being streamed

const settings = ['api-key', 'system', 'temperature', 'top-p', 'max-tokens', 'seed',
  'stop-strings', 'schema', 'tools', 'tool-choice', 'reasoning'];

function loadSettings() {
  for (const id of settings) {
    const v = localStorage.getItem('dsinfer.' + id);
    if (v === null) continue;
    const el = $(id);
    if (el.type === 'checkbox') el.checked = v === 'true'; else el.value = v;
  }
}

function saveSetting(ev) {
  const el = ev.target;
  localStorage.setItem('dsinfer.' + el.id, el.type === 'checkbox' ? String(el.checked) : el.value);
}

function headers() {
  const h = { 'Content-Type': 'application/json' };
  const key = $('api-key').value.trim();
  if (key) h.Authorization = 'Bearer ' + key;
  return h;
}

function setStatus(text) { $('status').textContent = text; }

// The server's error bodies are {"error": {"message": ...}} (OpenAI shape).
async function errorText(resp) {
  let msg = resp.statusText;
  try { msg = (await resp.json()).error.message || msg; } catch (_) { /* not JSON */ }
  if (resp.status === 401) return 'API key rejected (401): set the key the server was started with.';
  return `HTTP ${resp.status}: ${msg}`;
}

async function loadModel() {
  try {
    const resp = await fetch('/v1/models', { headers: headers() });
    if (!resp.ok) { setStatus(await errorText(resp)); return; }
    modelId = (await resp.json()).data[0].id;
    $('model').textContent = 'model: ' + modelId;
    setStatus('');
  } catch (e) {
    setStatus('server unreachable: ' + e.message);
  }
}

function addMessage(role, text) {
  const div = document.createElement('div');
  div.className = 'msg ' + role;
  div.dataset.role = role;
  if (text !== undefined) div.textContent = text;
  $('messages').appendChild(div);
  div.scrollIntoView({ block: 'end' });
  return div;
}

// Parses optional JSON settings; throws an Error naming the box on bad JSON.
function parseJsonBox(id, what) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  try { return JSON.parse(text); } catch (e) { throw new Error(`${what}: ${e.message}`); }
}

function buildRequest() {
  const req = { model: modelId, messages: [], stream: true, stream_options: { include_usage: true } };
  const system = $('system').value.trim();
  if (system) req.messages.push({ role: 'system', content: system });
  req.messages.push(...history);
  const num = (id) => ($(id).value === '' ? undefined : Number($(id).value));
  req.temperature = num('temperature');
  req.top_p = num('top-p');
  req.max_tokens = num('max-tokens');
  if (num('seed') !== undefined) req.seed = num('seed');
  const stops = $('stop-strings').value.split('\n').filter((s) => s.length > 0);
  if (stops.length) req.stop = stops;
  req.thinking = { type: $('reasoning').checked ? 'enabled' : 'disabled' };
  const schema = parseJsonBox('schema', 'JSON schema');
  if (schema !== undefined) {
    req.response_format = { type: 'json_schema', json_schema: { name: 'answer', schema, strict: true } };
  }
  const tools = parseJsonBox('tools', 'Tools');
  if (tools !== undefined) {
    req.tools = tools;
    req.tool_choice = $('tool-choice').value;
  }
  return req;
}

// One assistant reply being streamed: keeps the DOM nodes and the accumulated text.
class Reply {
  constructor() {
    this.div = addMessage('assistant');
    this.reasoning = '';
    this.content = '';
    this.toolCalls = [];  // {id, name, arguments}
    this.reasoningNode = null;
    this.contentNode = document.createElement('div');
    this.contentNode.className = 'content';
    this.div.appendChild(this.contentNode);
    this.toolsNode = document.createElement('div');
    this.div.appendChild(this.toolsNode);
  }

  onDelta(delta) {
    if (delta.reasoning_content) {
      if (!this.reasoningNode) {
        const d = document.createElement('details');
        d.className = 'reasoning';
        d.open = true;
        d.innerHTML = '<summary>Reasoning</summary><div class="text"></div>';
        this.div.insertBefore(d, this.contentNode);
        this.reasoningNode = d;
      }
      this.reasoning += delta.reasoning_content;
      this.reasoningNode.querySelector('.text').textContent = this.reasoning;
    }
    if (delta.content) {
      if (this.reasoningNode) this.reasoningNode.open = false;  // answer started
      this.content += delta.content;
      this.contentNode.textContent = this.content;
    }
    for (const tc of delta.tool_calls || []) {
      const t = this.toolCalls[tc.index] || (this.toolCalls[tc.index] = { id: '', name: '', arguments: '' });
      if (tc.id) t.id = tc.id;
      if (tc.function && tc.function.name) t.name += tc.function.name;
      if (tc.function && tc.function.arguments) t.arguments += tc.function.arguments;
    }
    if (delta.tool_calls) this.renderTools();
    this.div.scrollIntoView({ block: 'end' });
  }

  renderTools() {
    this.toolsNode.replaceChildren(...this.toolCalls.map((t) => {
      const node = document.createElement('div');
      node.className = 'tool-call';
      const name = document.createElement('span');
      name.className = 'name';
      name.textContent = t.name;
      const args = document.createElement('span');
      args.className = 'arguments';
      args.textContent = '(' + t.arguments + ')';
      node.append('tool call: ', name, args);
      return node;
    }));
  }

  finish(stats) {
    const s = document.createElement('div');
    s.className = 'stats';
    s.textContent = stats;
    this.div.appendChild(s);
  }

  message() {
    const m = { role: 'assistant', content: this.content };
    if (this.toolCalls.length) {
      m.tool_calls = this.toolCalls.map((t) => ({ id: t.id, type: 'function',
        function: { name: t.name, arguments: t.arguments } }));
    }
    return m;
  }
}

// Reads an SSE body and calls onEvent(parsed JSON) per `data:` line until [DONE].
async function readSse(body, onEvent) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).replace(/\r$/, '');
      buf = buf.slice(nl + 1);
      if (!line.startsWith('data:')) continue;
      const data = line.slice(5).trim();
      if (data === '[DONE]') return;
      onEvent(JSON.parse(data));
    }
  }
}

async function send(text) {
  let req;
  history.push({ role: 'user', content: text });
  addMessage('user', text);
  if (!modelId) await loadModel();
  if (!modelId) {
    history.pop();
    addMessage('error', $('status').textContent || 'no model');
    return;
  }
  try {
    req = buildRequest();
  } catch (e) {
    history.pop();
    addMessage('error', e.message);
    return;
  }
  controller = new AbortController();
  $('send').disabled = true;
  $('stop').disabled = false;
  const reply = new Reply();
  const start = performance.now();
  let firstTokenMs = null;
  let usage = null;
  let finish = null;
  try {
    const resp = await fetch('/v1/chat/completions', { method: 'POST', headers: headers(),
      body: JSON.stringify(req), signal: controller.signal });
    if (!resp.ok) throw new Error(await errorText(resp));
    await readSse(resp.body, (chunk) => {
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        if (firstTokenMs === null && choice.delta && Object.keys(choice.delta).some((k) => k !== 'role')) {
          firstTokenMs = performance.now() - start;
        }
        if (choice.delta) reply.onDelta(choice.delta);
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    });
    history.push(reply.message());
    reply.finish(statsLine(usage, start, firstTokenMs, finish));
  } catch (e) {
    if (e.name === 'AbortError') {
      history.push(reply.message());
      reply.finish('stopped');
    } else {
      history.pop();
      reply.div.classList.add('error');
      reply.contentNode.textContent = e.message;
    }
  } finally {
    controller = null;
    $('send').disabled = false;
    $('stop').disabled = true;
  }
}

function statsLine(usage, start, firstTokenMs, finish) {
  const parts = [];
  if (usage) {
    const decodeS = (performance.now() - start - (firstTokenMs || 0)) / 1000;
    const rate = usage.completion_tokens > 1 && decodeS > 0 ? (usage.completion_tokens - 1) / decodeS : 0;
    parts.push(`${usage.completion_tokens} tokens`, `${rate.toFixed(1)} tokens/s`);
    const cached = (usage.prompt_tokens_details || {}).cached_tokens || 0;
    parts.push(`${usage.prompt_tokens} prompt tokens, ${cached} cached`);
  }
  if (firstTokenMs !== null) parts.push(`first token ${Math.round(firstTokenMs)} ms`);
  if (finish) parts.push(`finish: ${finish}`);
  return parts.join(' · ');
}

function init() {
  loadSettings();
  for (const id of settings) $(id).addEventListener('change', saveSetting);
  $('api-key').addEventListener('change', loadModel);
  $('composer').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const text = $('input').value.trim();
    if (!text || controller) return;
    $('input').value = '';
    send(text);
  });
  $('input').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey) { ev.preventDefault(); $('composer').requestSubmit(); }
  });
  $('stop').addEventListener('click', () => { if (controller) controller.abort(); });
  $('clear').addEventListener('click', () => { history.length = 0; $('messages').replaceChildren(); });
  loadModel();
}

init();
