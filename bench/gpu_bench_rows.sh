#!/usr/bin/env bash
# gpu_bench_rows — bench_gpu's rows as they complete, on the CPU stand-in for
# CUDA (suite cudasim; bench/meson.build builds bench_gpu against it):
#   1. bench_gpu --preset bert-tiny, both rows: as soon as the seq 128 row's
#      BENCH line is out, the program is killed (SIGKILL) while it runs the
#      seq 512 row, as a crash there would end it. The seq 128 row must be
#      out whole (status=ok and its numbers) and the program must have died
#      of the kill, i.e. still been in its second row: one fault, one row.
#   2. --seq 128 runs that row alone: exit 0, exactly one BENCH line, and no
#      device memory left behind (CUDASIM_LEAKS=fail).
# Usage: gpu_bench_rows.sh BENCH_GPU_EXE
set -u
exe=$1
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d /tmp/gpu_bench_rows.XXXXXX)
trap 'rm -rf "$dir"' EXIT
args=(--preset bert-tiny --warmup 0 --steps 1 --batch128 1 --batch512 8)

mkfifo "$dir/out"
"$exe" "${args[@]}" >"$dir/out" 2>"$dir/err" &
pid=$!
row=""
while IFS= read -r line; do
    echo "$line"
    if [[ $line == "BENCH gpu_train seq=128 "* ]]; then
        row=$line
        kill -KILL "$pid"
        break
    fi
done <"$dir/out"
wait "$pid"
rc=$?
cat "$dir/err"
[ -n "$row" ] || fail "no seq 128 BENCH line before the program ended (exit $rc)"
[ "$rc" = 137 ] || fail "bench_gpu was not running its second row when the first was out (exit $rc, want 137: killed)"
[[ $row =~ status=ok\ tok_s=[0-9]+\ step_ms=[0-9.]+\ .*mfu=[0-9.]+$ ]] || fail "the seq 128 row is not whole: $row"
echo "ok   seq 128 row out whole while seq 512 still ran; killed there (exit $rc)"

out=$(CUDASIM_LEAKS=fail "$exe" "${args[@]}" --seq 128 2>&1)
rc=$?
echo "$out"
[ "$rc" = 0 ] || fail "--seq 128: exit $rc"
[ "$(grep -c '^BENCH gpu_train ' <<<"$out")" = 1 ] || fail "--seq 128: want exactly one BENCH line"
grep -q '^BENCH gpu_train seq=128 .*status=ok' <<<"$out" || fail "--seq 128: no finished seq 128 row"
echo "ok   --seq 128: one row, nothing left on the device"
