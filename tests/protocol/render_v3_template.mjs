// Renders the conversations of tests/cases/protocol/jinja/*.json with the V3 chat
// template (tokenizer_config.json `chat_template`) through @huggingface/jinja, the
// reference the C++ kDeepSeekV3Template encoder must equal byte for byte.
//
//   node render_v3_template.mjs TOKENIZER_CONFIG_JSON CASES_DIR OUT_JSON
//
// A case file is a JSON array of {"name", "messages" (Chat Completions messages,
// passed to the template as is), "tools"?, "add_generation_prompt"? (default true),
// "add_bos"? (default true)}. OUT_JSON gets {"<file>/<name>": rendered text, ...}.
// The template variables are the ones transformers' apply_chat_template passes:
// messages, tools, add_generation_prompt, bos_token, eos_token.
import fs from "node:fs";
import path from "node:path";
import { Template } from "@huggingface/jinja";

const [configPath, casesDir, outPath] = process.argv.slice(2);
if (!configPath || !casesDir || !outPath) {
    console.error("usage: render_v3_template.mjs TOKENIZER_CONFIG_JSON CASES_DIR OUT_JSON");
    process.exit(2);
}
const config = JSON.parse(fs.readFileSync(configPath, "utf8"));
const tokenText = (t) => (typeof t === "string" ? t : t.content);
const template = new Template(config.chat_template);

const out = {};
let failures = 0;
for (const file of fs.readdirSync(casesDir).filter((f) => f.endsWith(".json")).sort()) {
    const cases = JSON.parse(fs.readFileSync(path.join(casesDir, file), "utf8"));
    for (const c of cases) {
        const key = `${file}/${c.name}`;
        if (key in out) {
            console.error(`duplicate case ${key}`);
            failures++;
            continue;
        }
        const vars = {
            messages: c.messages,
            add_generation_prompt: c.add_generation_prompt ?? true,
            bos_token: (c.add_bos ?? true) ? tokenText(config.bos_token) : "",
            eos_token: tokenText(config.eos_token),
        };
        if (c.tools !== undefined) {
            vars.tools = c.tools;
        }
        try {
            out[key] = template.render(vars);
        } catch (e) {
            console.error(`${key}: template error: ${e.message}`);
            failures++;
        }
    }
}
fs.writeFileSync(outPath, JSON.stringify(out, null, 1));
console.error(`rendered ${Object.keys(out).length} conversations`);
process.exit(failures ? 1 : 0);
