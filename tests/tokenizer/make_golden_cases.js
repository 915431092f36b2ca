#!/usr/bin/env node
// Regenerates tests/cases/tokenizer/*.json, the golden cases the C++ unit test
// (src/tokenizer/tokenizer_test.cc) checks without node. Ids come from the
// JavaScript reference (reference.js); the cases in rust_vs_js.json come from the
// reference run with Oniguruma's \s (Hugging Face Rust semantics) and also record
// what the unmodified JavaScript gives.
//
// Usage: node make_golden_cases.js [OUT_DIR]   (default ../cases/tokenizer)
// Case fields: name, text (or text_hex for invalid UTF-8), special (true: added
// tokens recognised, i.e. encode_with_special), ids, and for rust_vs_js js_ids.
"use strict";
const fs = require("fs");
const path = require("path");
const ref = require("./reference");
const { encodePlain, encodeSpecial, lossy } = ref;

const outDir = process.argv[2] || path.join(__dirname, "..", "cases", "tokenizer");
const pristine = ref.pristineTokenizer();
const onig = ref.onigTokenizer();

function textCase(name, text, special = false, tok = pristine) {
  const ids = special ? encodeSpecial(tok, text) : encodePlain(tok, text);
  return { name, text, special, ids };
}
function bytesCase(name, bytes, special = false) {
  const text = lossy(Buffer.from(bytes));
  const ids = special ? encodeSpecial(pristine, text) : encodePlain(pristine, text);
  return { name, text_hex: Buffer.from(bytes).toString("hex"), special, ids };
}
function write(file, description, cases) {
  const body = { description, generated_by: "tests/tokenizer/make_golden_cases.js", cases };
  fs.mkdirSync(outDir, { recursive: true });
  fs.writeFileSync(path.join(outDir, file), JSON.stringify(body, null, 1) + "\n");
  console.log(`${file}: ${cases.length} cases`);
}

// ---- basic.json ----
write("basic.json", "Everyday text, code and the vectors quoted in docs/tokenizer.md.", [
  textCase("hello_world", "Hello, world!"),
  textCase("digits_7", "1234567"),
  textCase("pi", " 3.14159"),
  textCase("chinese", "你好，世界。"),
  textCase("japanese", "日本語のテキスト"),
  textCase("python", "def f(x):\n    return x**2\n"),
  textCase("leading_spaces", "  leading spaces"),
  textCase("emoji", "emoji 😀 test"),
  textCase("sentence", "The quick brown fox jumps over the lazy dog."),
  textCase("contractions", "I'm sure we'll see they've done it, haven't they?"),
  textCase("cpp", "template <typename T>\nstd::vector<T> f(const T& x) { return {x}; }\n"),
  textCase("json", '{"name": "dsinfer", "tokens": [1, 22, 333, 4444], "ok": true}'),
  textCase("markdown", "# Title\n\n- item *one*\n- item `two`\n\n```cpp\nint x = 0;\n```\n"),
  textCase("url", "See https://example.com/path?q=1&r=two#frag for details."),
  textCase("german", "Grüße aus Köln, Straße 12 — schön!"),
  textCase("russian", "Привет, мир! Как дела?"),
  textCase("korean", "안녕하세요 세계"),
  textCase("mixed_cjk_latin", "使用DeepSeek模型进行推理，速度很快。"),
  textCase("empty", ""),
  textCase("single_space", " "),
]);

// ---- pretokenizer.json: each rule and alternation ----
const pre = [];
for (let n = 1; n <= 13; n++) pre.push(textCase(`digits_${n}`, "1234567890123".slice(0, n)));
pre.push(textCase("digits_then_letters", "12345abc 678def"));
pre.push(textCase("fullwidth_digits", "１２３４５"));
pre.push(textCase("arabic_indic_digits", "٠١٢٣٤٥٦"));
pre.push(textCase("superscript_and_roman", "x² + y³ = Ⅻ"));
pre.push(textCase("cjk_run_long", "我们今天在这里讨论一个非常重要的问题就是如何提高推理速度"));
pre.push(textCase("kana_and_marks", "ひらがなとカタカナ・ー゛゜"));
pre.push(textCase("cjk_outside_range", "龦龧 㐀 𠀀"));
pre.push(textCase("ascii_punct_letters", "'s 't --flag @user #tag $var .method() ::std"));
pre.push(textCase("punct_runs_newlines", "Hello!!!\n\nWorld...\r\n--\n"));
pre.push(textCase("space_before_punct", "a , b . c ! d"));
pre.push(textCase("spaces_2", "a  b"));
pre.push(textCase("spaces_trailing", "a   "));
pre.push(textCase("spaces_only", "     "));
pre.push(textCase("newlines", "a\n\n\nb"));
pre.push(textCase("crlf", "line1\r\nline2\r\n"));
pre.push(textCase("space_newline_space", "a \n \n b"));
pre.push(textCase("tabs", "\tindent\t\tmore\t"));
pre.push(textCase("vertical_tab_form_feed", "a\u000bb\u000cc"));
pre.push(textCase("nbsp_ideographic_space", "a\u00a0b\u3000c\u2003d"));
pre.push(textCase("line_paragraph_sep", "a\u2028b\u2029c"));
pre.push(textCase("long_space_run", "x" + " ".repeat(100) + "y"));
pre.push(textCase("long_word", "a".repeat(300)));
pre.push(textCase("long_equals", "=".repeat(200)));
pre.push(textCase("combining_acute", "e\u0301 cafe\u0301 \u0301start"));
pre.push(textCase("combining_after_digit", "1\u0301 2\u20e3"));
pre.push(textCase("stacked_marks", "a\u0300\u0301\u0302\u0303b"));
pre.push(textCase("zwj_family", "👨‍👩‍👧‍👦"));
pre.push(textCase("skin_tone", "👍🏽 👍🏿"));
pre.push(textCase("flags", "🇺🇸🇯🇵🇫🇷"));
pre.push(textCase("keycap", "1️⃣ #️⃣"));
pre.push(textCase("variation_selector", "❤️ ❤ ☕️"));
pre.push(textCase("arabic", "السَّلَامُ عَلَيْكُمْ"));
pre.push(textCase("hebrew", "שָׁלוֹם עוֹלָם"));
pre.push(textCase("rtl_marks", "abc\u200fעברית\u200e123"));
pre.push(textCase("controls", "a\u0001b\u0002\u0003 \u007f\u0080x"));
pre.push(textCase("nul", "a\u0000b"));
pre.push(textCase("format_chars", "soft\u00adhyphen zero\u200bwidth join\u200dx"));
pre.push(textCase("symbols", "∑∫√∞ ≤≥ → ← © ® ™ € £ ¥"));
pre.push(textCase("math_alnum", "𝐀𝐁𝐂 𝟏𝟐𝟑"));
pre.push(textCase("devanagari", "नमस्ते दुनिया"));
pre.push(textCase("thai", "สวัสดีชาวโลก"));
write("pretokenizer.json", "Edge cases of the three Split rules (see internal/pretokenizer.h).", pre);

// ---- special_tokens.json ----
const specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>",
  "<｜Assistant｜>", "<|EOT|>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
  "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>",
  "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁sep｜>",
  "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜place▁holder▁no▁0｜>",
  "<｜place▁holder▁no▁799｜>"];
const sp = [];
for (const s of specials) {
  sp.push(textCase(`recognised ${s}`, `x${s}y`, true));
  sp.push(textCase(`ordinary ${s}`, `x${s}y`, false));
}
const chat =
  "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi!<｜Assistant｜>Hello.<｜end▁of▁sentence｜>" +
  "<｜User｜>Weather?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>" +
  "get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>" +
  "<｜end▁of▁sentence｜><｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>18C<｜tool▁output▁end｜>" +
  "<｜tool▁outputs▁end｜>";
sp.push(textCase("chat_recognised", chat, true));
sp.push(textCase("chat_ordinary", chat, false));
sp.push(textCase("partial_spellings", "<｜User <｜User｜ ｜>User<｜ <｜place▁holder▁no▁99999｜>", true));
sp.push(textCase("adjacent", "<｜User｜><｜User｜><｜Assistant｜>", true));
sp.push(textCase("think_is_text_in_v3", "<think>x</think>", true));
write("special_tokens.json", "Added tokens recognised (special: true) and not (injection, S-REC-2).", sp);

// ---- invalid_utf8.json: bytes repaired like from_utf8_lossy, then encoded ----
const bad = [
  ["lone_ff", [0x61, 0xff, 0x62]],
  ["truncated_3byte", [0x78, 0xe4, 0xb8]],
  ["truncated_then_ascii", [0xe4, 0xb8, 0x41]],
  ["truncated_4byte", [0xf0, 0x9f, 0x98, 0x20, 0x61]],
  ["overlong_slash", [0xc0, 0xaf, 0x61]],
  ["overlong_3byte", [0xe0, 0x80, 0xaf]],
  ["surrogate", [0xed, 0xa0, 0x80, 0x7a]],
  ["above_max", [0xf4, 0x90, 0x80, 0x80]],
  ["f5_lead", [0xf5, 0x80, 0x80, 0x80]],
  ["stray_continuations", [0x80, 0x81, 0xbf, 0x20, 0x41]],
  ["mixed", [0x48, 0x69, 0x20, 0xe4, 0xb8, 0x96, 0xe4, 0x20, 0xf0, 0x9f, 0x98, 0x80, 0xc3]],
  ["replacement_char_itself", [0xef, 0xbf, 0xbd]],
];
const inv = [];
for (const [name, bytes] of bad) {
  inv.push(bytesCase(name, bytes, false));
  inv.push(bytesCase(name + "_special", [...Buffer.from("<｜User｜>"), ...bytes], true));
}
write("invalid_utf8.json", "Invalid UTF-8 is repaired as Rust's String::from_utf8_lossy (U+FFFD " +
  "per maximal invalid subpart) before encoding; ids are the reference's on the repaired text.", inv);

// ---- rust_vs_js.json: where JavaScript's \s differs from Oniguruma's ----
const div = [];
for (const [name, text] of [
  ["space_nel_end", "a \u0085"],
  ["spaces_nel_end", "a  \u0085"],
  ["space_nel_space", "a \u0085 "],
  ["space_nel_nel", "a \u0085\u0085"],
  ["space_nel_digit", "a \u00851"],
  ["space_nel_newline", "b \u0085\n"],
  ["three_spaces_nel", "   \u0085"],
  ["two_spaces_nel_letter", "  \u0085a"],
  ["spaces_bom_end", "a  \ufeff"],
  ["three_spaces_bom", "   \ufeff"],
  ["spaces_bom_punct", "x  \ufeff,"],
]) {
  for (const special of [false, true]) {
    const c = textCase(name + (special ? "_special" : ""), text, special, onig);
    c.js_ids = special ? encodeSpecial(pristine, text) : encodePlain(pristine, text);
    if (JSON.stringify(c.ids) === JSON.stringify(c.js_ids)) {
      throw new Error(`rust_vs_js case ${name} does not diverge`);
    }
    div.push(c);
  }
}
write("rust_vs_js.json", "U+0085 is \\s for Oniguruma (Hugging Face, Rust) but not for JavaScript; " +
  "U+FEFF the reverse. ids follow Rust (reference run with Oniguruma's \\s); js_ids is what the " +
  "unmodified JavaScript reference gives.", div);
