// Feeds the SSE byte streams written by sdk_streams_test.cc through the official
// SDKs' own stream machinery, with no network (a fake `fetch` replays the bytes,
// cut into chunks three ways: whole, one byte at a time, seeded random sizes):
//   openai             client.chat.completions.stream() -> ChatCompletionStream
//                      client.responses.stream()        -> ResponseStream (+ the SDK's
//                      accumulateResponse over the delta events alone)
//   @anthropic-ai/sdk  client.messages.stream()         -> MessageStream
// Each must finish without error and reconstruct the expected message: content,
// reasoning (Chat: `reasoning_content` deltas; Responses: reasoning item;
// Messages: thinking block), tool calls with parsed arguments, finish reason.
//
//   node check_sdk_streams.mjs DIR     (DIR/manifest.json lists the streams)
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { accumulateResponse } from "openai/lib/responses/ResponseAccumulator";

const dir = process.argv[2];
if (!dir) {
    console.error("usage: check_sdk_streams.mjs DIR");
    process.exit(2);
}
const manifest = JSON.parse(fs.readFileSync(path.join(dir, "manifest.json"), "utf8"));

// Deterministic PRNG (mulberry32) for the random chunking.
function rng(seed) {
    return () => {
        seed |= 0;
        seed = (seed + 0x6d2b79f5) | 0;
        let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
        t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
}

function chunk(bytes, mode, seed) {
    if (mode === "whole") return [bytes];
    const out = [];
    const next = rng(seed);
    for (let i = 0; i < bytes.length;) {
        const n = mode === "bytes" ? 1 : 1 + Math.floor(next() * 24);
        out.push(bytes.subarray(i, i + n));
        i += n;
    }
    return out;
}

// A fetch that answers every request with `bytes` as an SSE body.
function replayFetch(bytes, mode, seed) {
    return async (_url, _init) => {
        const pieces = chunk(bytes, mode, seed);
        const body = new ReadableStream({
            start(controller) {
                for (const p of pieces) controller.enqueue(p);
                controller.close();
            },
        });
        return new Response(body, {
            status: 200,
            headers: { "content-type": "text/event-stream", "x-request-id": "req_test" },
        });
    };
}

const clientOptions = (fetch) => ({
    apiKey: "test-key",
    baseURL: "http://127.0.0.1:9/v1",
    fetch,
    maxRetries: 0,
    timeout: 10000,
});

function strictTools(expect) {
    const names = [...new Set(expect.tool_calls.map((c) => c.name))];
    return names.map((name) => ({
        type: "function",
        function: { name, strict: true, parameters: { type: "object", properties: {} } },
    }));
}

async function checkChat(bytes, expect, mode, seed) {
    const client = new OpenAI(clientOptions(replayFetch(bytes, mode, seed)));
    const tools = strictTools(expect);
    const stream = client.chat.completions.stream({
        model: "deepseek-test",
        messages: [{ role: "user", content: "hi" }],
        stream_options: { include_usage: true },
        ...(tools.length ? { tools } : {}),
    });
    let reasoning = "";
    const parsedDone = [];
    stream.on("tool_calls.function.arguments.done", (e) => parsedDone.push(e));
    for await (const c of stream) {
        for (const ch of c.choices) reasoning += ch.delta?.reasoning_content ?? "";
    }
    const final = await stream.finalChatCompletion();
    const choice = final.choices[0];
    assert.equal(final.choices.length, 1);
    assert.equal(choice.message.role, "assistant");
    assert.equal(choice.message.content ?? "", expect.content);
    assert.equal(reasoning, expect.reasoning);
    assert.equal(choice.finish_reason, expect.finish);
    const calls = choice.message.tool_calls ?? [];
    assert.equal(calls.length, expect.tool_calls.length);
    calls.forEach((c, i) => {
        assert.equal(c.type, "function");
        assert.ok(c.id, "tool call id");
        assert.equal(c.function.name, expect.tool_calls[i].name);
        assert.deepEqual(JSON.parse(c.function.arguments), expect.tool_calls[i].arguments);
        assert.deepEqual(c.function.parsed_arguments, expect.tool_calls[i].arguments);
    });
    assert.equal(parsedDone.length, expect.tool_calls.length);
    parsedDone.forEach((e, i) =>
        assert.deepEqual(e.parsed_arguments, expect.tool_calls[i].arguments));
    assert.ok(final.usage && final.usage.completion_tokens > 0, "usage chunk");
}

const joinText = (parts) => (parts ?? []).map((p) => p.text).join("");

// The parts of a Responses output list we compare.
function responsesView(output) {
    return output.map((it) => {
        if (it.type === "reasoning" || it.type === "message") {
            return { type: it.type, text: joinText(it.content) };
        }
        if (it.type === "function_call") {
            return { type: it.type, name: it.name, call_id: it.call_id, arguments: it.arguments };
        }
        return { type: it.type };
    });
}

const kDoneEvents = new Set([
    "response.output_item.done", "response.output_text.done", "response.reasoning_text.done",
    "response.function_call_arguments.done", "response.content_part.done",
    "response.completed", "response.incomplete", "response.failed",
]);

async function checkResponses(bytes, expect, mode, seed) {
    const client = new OpenAI(clientOptions(replayFetch(bytes, mode, seed)));
    const stream = client.responses.stream({ model: "deepseek-test", input: "hi" });
    const events = [];
    for await (const e of stream) events.push(e);
    const final = await stream.finalResponse();
    assert.equal(final.status, expect.finish === "length" ? "incomplete" : "completed");
    const items = final.output;
    const reasoningItems = items.filter((it) => it.type === "reasoning");
    assert.equal(reasoningItems.map((it) => joinText(it.content)).join(""), expect.reasoning);
    assert.equal(final.output_text, expect.content);
    const calls = items.filter((it) => it.type === "function_call");
    assert.equal(calls.length, expect.tool_calls.length);
    calls.forEach((c, i) => {
        assert.ok(c.call_id, "call_id");
        assert.equal(c.name, expect.tool_calls[i].name);
        assert.deepEqual(JSON.parse(c.arguments), expect.tool_calls[i].arguments);
    });
    // Order: reasoning, message, calls (as our adapters emit them).
    const order = items.map((it) => it.type);
    assert.deepEqual(order, [...order].sort((a, b) => rank(a) - rank(b)));
    // The SDK's accumulator over the incremental events alone (no *.done
    // replacements, no final response) must build the same output.
    let snapshot;
    for (const e of events) {
        if (!kDoneEvents.has(e.type)) snapshot = accumulateResponse(e, snapshot);
    }
    assert.deepEqual(responsesView(snapshot.output), responsesView(items));
    const seqs = events.map((e) => e.sequence_number);
    assert.deepEqual(seqs, seqs.map((_, i) => i));
}

function rank(type) {
    const ranks = { reasoning: 0, thinking: 0, message: 1, text: 1, function_call: 2, tool_use: 2 };
    return ranks[type] ?? 9;
}

async function checkMessages(bytes, expect, mode, seed) {
    const client = new Anthropic({
        ...clientOptions(replayFetch(bytes, mode, seed)),
        baseURL: "http://127.0.0.1:9",
    });
    const stream = client.messages.stream({
        model: "deepseek-test",
        max_tokens: 1024,
        messages: [{ role: "user", content: "hi" }],
    });
    let errors = 0;
    stream.on("error", () => errors++);
    const final = await stream.finalMessage();
    assert.equal(errors, 0);
    assert.equal(final.role, "assistant");
    const stop = { stop: "end_turn", tool_calls: "tool_use", length: "max_tokens" }[expect.finish];
    assert.equal(final.stop_reason, stop);
    const blocks = final.content;
    const types = blocks.map((b) => b.type);
    assert.deepEqual(types, [...types].sort((a, b) => rank(a) - rank(b)));
    const join = (type, key) => blocks.filter((b) => b.type === type).map((b) => b[key]).join("");
    assert.equal(join("thinking", "thinking"), expect.reasoning);
    assert.equal(join("text", "text"), expect.content);
    const uses = blocks.filter((b) => b.type === "tool_use");
    assert.equal(uses.length, expect.tool_calls.length);
    uses.forEach((u, i) => {
        assert.ok(u.id, "tool_use id");
        assert.equal(u.name, expect.tool_calls[i].name);
        assert.deepEqual(u.input, expect.tool_calls[i].arguments);
    });
    assert.ok(final.usage.output_tokens > 0, "usage.output_tokens");
}

const checks = { chat: checkChat, responses: checkResponses, messages: checkMessages };
let failures = 0;
let runs = 0;
for (const entry of manifest) {
    for (const [api, file] of Object.entries(entry.streams)) {
        const bytes = new Uint8Array(fs.readFileSync(path.join(dir, file)));
        for (const [mode, seed] of [["whole", 0], ["bytes", 0], ["random", 1], ["random", 2]]) {
            runs++;
            try {
                await checks[api](bytes, entry.expect, mode, seed);
            } catch (e) {
                failures++;
                const where = `${entry.name} ${api} chunking=${mode}/${seed}`;
                console.error(`FAIL ${where}: ${e.stack ?? e}`);
            }
        }
    }
}
console.error(`sdk streams: ${runs - failures}/${runs} passed (${manifest.length} scenarios)`);
process.exit(failures ? 1 : 0);
