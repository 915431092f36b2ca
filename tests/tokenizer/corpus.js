#!/usr/bin/env node
// Builds the tokenizer comparison corpus: text found on the machine (licences,
// Debian copyright files, C/C++ headers) plus generated edge cases (CJK runs,
// digit runs, emoji and ZWJ sequences, combining marks, RTL, whitespace runs,
// control characters, invalid UTF-8, special-token spellings, long pieces).
//
// Usage: node corpus.js OUT_FILE [--max-mb N]
// Output format (read by corpus_io.h and reference_encode.js), little-endian:
//   "DSTC1\n", then per document: u8 kind, u32 byte length, bytes.
//   kind 0: compared with the JavaScript reference as is;
//   kind 1: contains U+0085 or U+FEFF, where JavaScript's \s differs from
//           Oniguruma's (Rust); compared with the reference run with an
//           Oniguruma-equivalent \s (see docs/tokenizer.md).
// Deterministic for a given machine: files are taken in sorted path order and
// generated text comes from a fixed-seed generator.
"use strict";
const fs = require("fs");
const path = require("path");

const out = process.argv[2];
if (!out) {
  console.error("usage: node corpus.js OUT_FILE [--max-mb N]");
  process.exit(2);
}
const mbArg = process.argv.indexOf("--max-mb");
const maxBytes = (mbArg > 0 ? Number(process.argv[mbArg + 1]) : 6) * 1024 * 1024;

const docs = []; // {bytes: Buffer}
let total = 0;
function addBytes(buf) {
  if (buf.length === 0) return;
  docs.push(buf);
  total += buf.length;
}
function addText(s) {
  addBytes(Buffer.from(s, "utf8"));
}

// ---- Files on the machine ----
function listFiles(dir, filter, acc = []) {
  let entries;
  try {
    entries = fs.readdirSync(dir, { withFileTypes: true });
  } catch {
    return acc;
  }
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const e of entries) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) listFiles(p, filter, acc);
    else if (e.isFile() && filter(p)) acc.push(p);
  }
  return acc;
}
function addFiles(files, budget) {
  let used = 0;
  for (const f of files) {
    if (used >= budget) break;
    let buf;
    try {
      buf = fs.readFileSync(f);
    } catch {
      continue;
    }
    if (buf.length > 256 * 1024) buf = buf.subarray(0, 256 * 1024);
    addBytes(buf);
    used += buf.length;
  }
  return used;
}
const budgetFiles = maxBytes - 2.2 * 1024 * 1024; // the rest is generated
addFiles(listFiles("/usr/share/common-licenses", () => true), 0.3 * budgetFiles);
{
  const copyrights = [];
  let dirs = [];
  try {
    dirs = fs.readdirSync("/usr/share/doc").sort();
  } catch {}
  const seen = new Set();
  for (const d of dirs) {
    const p = path.join("/usr/share/doc", d, "copyright");
    try {
      const st = fs.statSync(p);
      // Many packages share one copyright text; keep one of each size.
      if (!st.isFile() || seen.has(st.size)) continue;
      seen.add(st.size);
      copyrights.push(p);
    } catch {}
  }
  addFiles(copyrights, 0.35 * budgetFiles);
}
addFiles(
  listFiles("/usr/include/c++", () => true),
  0.2 * budgetFiles
);
addFiles(
  listFiles("/usr/include", (p) => p.endsWith(".h") && !p.startsWith("/usr/include/c++")),
  Math.max(0, budgetFiles - total)
);

// ---- Generated edge cases ----
let seed = 0x9e3779b9;
function rnd() {
  // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];
const cp = (c) => String.fromCodePoint(c);
function fromRange(lo, hi) {
  return cp(lo + ri(hi - lo + 1));
}

// Blocks assigned long ago (Unicode <= 13), so every Unicode table agrees.
const blocks = [
  [0x20, 0x7e], [0xa0, 0xff], [0x100, 0x17f], [0x180, 0x24f], [0x250, 0x2af],
  [0x2b0, 0x2ff], [0x300, 0x36f], [0x370, 0x3ff], [0x400, 0x4ff], [0x531, 0x556],
  [0x5d0, 0x5ea], [0x591, 0x5c7], [0x600, 0x6ff], [0x900, 0x97f], [0xe01, 0xe5b],
  [0x10a0, 0x10ff], [0x1100, 0x11ff], [0x1e00, 0x1eff], [0x2000, 0x206f], [0x2070, 0x209c],
  [0x20a0, 0x20bf], [0x2100, 0x214f], [0x2150, 0x218b], [0x2190, 0x21ff], [0x2200, 0x22ff],
  [0x2460, 0x24ff], [0x2500, 0x257f], [0x2600, 0x26ff], [0x2700, 0x27bf], [0x3000, 0x303f],
  [0x3041, 0x3096], [0x30a0, 0x30ff], [0x3400, 0x4dbf], [0x4e00, 0x9fff], [0xac00, 0xd7a3],
  [0xf900, 0xfaff], [0xfe30, 0xfe4f], [0xff01, 0xff60], [0x1d400, 0x1d7ff],
  [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x1f680, 0x1f6c5], [0x1f900, 0x1f9ff],
  [0x20000, 0x2a6d6],
];
const cjk = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴";
const kana = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんがぎぐげござじずぜぞだぢづでどばびぶべぼぱぴぷぺぽゃゅょっー";
const katakana = "アイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンガギグゲゴザジズゼゾダヂヅデドバビブベボパピプペポャュョッー・ヴ";
const words = ["the", "tokenizer", "DeepSeek", "model", "Straße", "naïve", "café", "über",
  "résumé", "Ελληνικά", "русский", "язык", "العربية", "עברית", "हिन्दी", "ไทย", "한국어",
  "日本語", "中文", "x", "I", "a", "don't", "it's", "we'll", "HTTP", "JSON", "std::vector",
  "foo_bar", "fooBar", "--flag", "@user", "#tag", "$var", "%d", "C++", "e.g.", "3.14"];
const puncts = [",", ".", "!", "?", ";", ":", "...", "—", "–", "-", "(", ")", "[", "]", "{",
  "}", "\"", "'", "«", "»", "“", "”", "‘", "’", "。", "，", "、", "「", "」", "？", "！",
  "·", "•", "§", "¶", "©", "®", "™", "°", "±", "×", "÷", "€", "£", "¥", "¢", "$", "%",
  "&", "*", "+", "=", "<", ">", "/", "\\", "|", "^", "~", "`", "_", "@", "#"];
const spaces = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n", "\t\t", "\u00a0",
  "\u3000", "\u2003", "\u2009", "\u202f", "\u2028", "\u2029", "\v", "\f", "\r", " \r\n ",
  "\n \n", "    ", "\t \n"];
const emoji = ["😀", "😂", "🥲", "👍", "👍🏽", "❤️", "❤", "✨", "🎉", "🇺🇸", "🇯🇵", "👨‍👩‍👧‍👦",
  "👩‍💻", "🏳️‍🌈", "🧑🏿‍🚀", "1️⃣", "#️⃣", "©️", "☕", "🐍", "🦀", "🫠", "👁️‍🗨️", "⚽", "🀄"];
const marks = ["\u0301", "\u0300", "\u0308", "\u0327", "\u0323", "\u20e3", "\ufe0f", "\u064e",
  "\u0650", "\u05b7", "\u093f", "\u0e31", "\u302a", "\u3099"];
const specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
  "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
  "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜fim▁hole｜>", "<|EOT|>",
  "<｜place▁holder▁no▁42｜>", "<｜▁pad▁｜>", "<think>", "</think>", "<｜User", "｜>", "<｜"];

function digits(n) {
  let s = "";
  for (let i = 0; i < n; i++) s += String(ri(10));
  return s;
}
const otherDigits = [[0xff10, 0xff19], [0x660, 0x669], [0x966, 0x96f], [0x2160, 0x216f],
  [0xb2, 0xb3], [0x2460, 0x2473], [0x1d7ce, 0x1d7ff], [0xe50, 0xe59]];

const generators = [
  // CJK runs, kana, mixed with Latin, digits and CJK punctuation.
  () => {
    let s = "";
    const n = 1 + ri(60);
    for (let i = 0; i < n; i++) {
      const k = ri(8);
      if (k < 3) s += cjk[ri(cjk.length)];
      else if (k === 3) s += kana[ri(kana.length)];
      else if (k === 4) s += katakana[ri(katakana.length)];
      else if (k === 5) s += pick(puncts);
      else if (k === 6) s += pick(words);
      else s += digits(1 + ri(5));
    }
    return s;
  },
  // Digit runs of many lengths and kinds.
  () => {
    const n = ri(45);
    const sep = pick(["", " ", ",", ".", "-", "x", "a", "\n", "_", "e+", "/", ":"]);
    let s = digits(n) + sep + digits(ri(12));
    if (ri(3) === 0) {
      const [lo, hi] = pick(otherDigits);
      for (let i = ri(9); i > 0; i--) s += fromRange(lo, hi);
    }
    return pick(["", " ", "v", "$", "#", "abc", "十"]) + s + pick(["", "th", "%", " ", "px"]);
  },
  // Emoji, ZWJ sequences, modifiers, flags, keycaps.
  () => {
    let s = "";
    for (let i = 1 + ri(10); i > 0; i--) s += pick(emoji) + (ri(2) ? pick(spaces.slice(0, 4)) : pick(words));
    return s;
  },
  // Combining marks after letters, digits, spaces, punctuation and at the start.
  () => {
    let s = "";
    for (let i = 1 + ri(12); i > 0; i--) {
      const base = pick([pick(words), String(ri(10)), " ", pick(puncts), "", cjk[ri(cjk.length)]]);
      s += base;
      for (let k = ri(4); k > 0; k--) s += pick(marks);
    }
    return s;
  },
  // Right-to-left text with harakat/niqqud, bidi controls, Arabic digits.
  () => {
    const parts = ["مرحبا بالعالم", "السَّلَامُ عَلَيْكُمْ", "שָׁלוֹם עוֹלָם", "עברית", "١٢٣٤٥",
      "\u200f", "\u200e", "\u202b", "\u202c", "۱۲۳", "ـ", "؟", "،", "hello", "123", "(", ")"];
    let s = "";
    for (let i = 1 + ri(14); i > 0; i--) s += pick(parts) + pick(["", " ", "  ", "\n", "."]);
    return s;
  },
  // Whitespace runs of every kind, between and around words.
  () => {
    let s = "";
    for (let i = 1 + ri(16); i > 0; i--) {
      let w = "";
      for (let k = ri(4); k > 0; k--) w += pick(spaces);
      if (ri(6) === 0) w = " ".repeat(ri(70));
      s += w + (ri(4) ? pick(words) : pick(puncts));
    }
    return s + (ri(2) ? pick(spaces) : "");
  },
  // Control characters (C0, DEL, C1 except U+0085), format characters.
  () => {
    let s = "";
    for (let i = 1 + ri(12); i > 0; i--) {
      const k = ri(4);
      if (k === 0) s += cp(ri(32));
      else if (k === 1) s += cp(pick([0x7f, 0x80, 0x84, 0x86, 0x9f, 0xad, 0x200b, 0x200c, 0x200d, 0x2060, 0x61c]));
      else s += pick(words) + pick(["", " "]);
    }
    return s;
  },
  // ASCII punctuation + letters (the first rule), code-like text.
  () => {
    let s = "";
    for (let i = 1 + ri(20); i > 0; i--) {
      s += pick(puncts.slice(33)) + pick(["", "a", "abc", "Foo", "x1", "é", "ß", "日"]) + pick(["", " ", "\n", "()", "::"]);
    }
    return s;
  },
  // Random soup from long-assigned blocks.
  () => {
    let s = "";
    for (let i = 1 + ri(40); i > 0; i--) {
      const [lo, hi] = pick(blocks);
      s += fromRange(lo, hi);
    }
    return s.replace(/[\u0085\ufeff]/g, "");
  },
  // Short strings over one representative of each class the split rules test
  // (every alternation and backtracking path of the third rule).
  () => {
    const reps = ["a", "Z", "é", "ß", "Ж", "ع", "א", "ก", "한", "日", "の", "カ", "・", "ー",
      "\u0301", "\u20e3", "\ufe0f", "0", "7", "٣", "²", "Ⅻ", "１", ",", ".", "'", "-", "_",
      "(", "]", "。", "「", "¿", "+", "$", "^", "`", "|", "~", "€", "©", "😀", " ", "  ",
      "\t", "\n", "\r", "\r\n", "\v", "\u00a0", "\u3000", "\u2028", "\u0001", "\u007f",
      "\u200d", "\u200b", "\u00ad"];
    let s = "";
    for (let i = 1 + ri(24); i > 0; i--) s += pick(reps);
    return s;
  },
  // Special-token spellings inside ordinary text.
  () => {
    let s = "";
    for (let i = 1 + ri(6); i > 0; i--) s += pick(words) + pick(["", " ", "\n"]) + pick(specials);
    return s + pick(words);
  },
  // Long pieces: long words, base64, long whitespace, long CJK runs.
  () => {
    const k = ri(5);
    const n = 50 + ri(600);
    if (k === 0) return "a".repeat(n);
    if (k === 1) {
      const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
      let s = "";
      for (let i = 0; i < n; i++) s += b64[ri(b64.length)];
      return s;
    }
    if (k === 2) return pick(words) + " ".repeat(n) + pick(words);
    if (k === 3) {
      let s = "";
      for (let i = 0; i < n / 3; i++) s += cjk[ri(cjk.length)];
      return s;
    }
    return "=".repeat(n) + "\n" + "-".repeat(ri(200));
  },
];

// Documents for which JavaScript's \s differs from Oniguruma's.
function divergenceDoc() {
  const ws = pick(["\u0085", "\ufeff", "\u0085\u0085", "\ufeff\ufeff", " \u0085", "\u0085 ", "\ufeff "]);
  return pick(["", "a", "word", "1", ".", " "]) + ws + pick(["", "b", "next", "2", ",", " ", "\n"]) +
    pick(["", "\u0085", "\ufeff", " end"]);
}

// Invalid UTF-8: random bytes, truncated and overlong sequences, surrogates.
function invalidDoc() {
  const pieces = [];
  for (let i = 1 + ri(10); i > 0; i--) {
    const k = ri(7);
    if (k === 0) pieces.push(Buffer.from([ri(256)]));
    else if (k === 1) pieces.push(Buffer.from([0xe4, 0xb8])); // truncated 世
    else if (k === 2) pieces.push(Buffer.from([0xc0, 0xaf])); // overlong '/'
    else if (k === 3) pieces.push(Buffer.from([0xed, 0xa0, 0x80])); // surrogate
    else if (k === 4) pieces.push(Buffer.from([0xf4, 0x90, 0x80, 0x80])); // > U+10FFFF
    else if (k === 5) pieces.push(Buffer.from([0x80 + ri(64)])); // stray continuation
    else pieces.push(Buffer.from(pick(words) + pick(["", " "]), "utf8"));
  }
  return Buffer.concat(pieces);
}

const kinds = [];
for (let i = 0; i < docs.length; i++) kinds.push(0);
let generated = 0;
const fileBytes = total;
while (total < maxBytes || generated < 8000) {
  const g = generated % (generators.length + 2);
  let buf;
  if (g < generators.length) {
    // Several generated snippets per document, sometimes joined by newlines.
    let s = "";
    for (let k = 1 + ri(8); k > 0; k--) s += generators[ri(generators.length)]() + pick(["", "\n", " "]);
    buf = Buffer.from(s, "utf8");
  } else if (g === generators.length) {
    buf = invalidDoc();
  } else {
    buf = Buffer.from(divergenceDoc(), "utf8");
  }
  addBytes(buf);
  kinds.push(0);
  generated++;
}

// Mark documents whose (lossily decoded) text holds a divergence character.
const { lossy } = require("./reference");
for (let i = 0; i < docs.length; i++) {
  const text = lossy(docs[i]);
  if (/[\u0085\ufeff]/.test(text)) kinds[i] = 1;
}

const header = Buffer.from("DSTC1\n", "latin1");
const parts = [header];
for (let i = 0; i < docs.length; i++) {
  const h = Buffer.alloc(5);
  h.writeUInt8(kinds[i], 0);
  h.writeUInt32LE(docs[i].length, 1);
  parts.push(h, docs[i]);
}
fs.mkdirSync(path.dirname(path.resolve(out)), { recursive: true });
fs.writeFileSync(out, Buffer.concat(parts));
const numDivergent = kinds.filter((k) => k === 1).length;
console.log(
  `corpus: ${docs.length} documents, ${(total / 1048576).toFixed(2)} MiB ` +
    `(${docs.length - generated} files, ${(fileBytes / 1048576).toFixed(2)} MiB; ${generated} ` +
    `generated; ${numDivergent} with U+0085/U+FEFF) -> ${out}`
);
