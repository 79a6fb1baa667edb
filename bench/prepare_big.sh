#!/bin/sh
# bertd-prepare on a big corpus of real text: peak RSS, tokens/s per thread
# and 1 -> 2 thread scaling, next to the same figures on a small corpus
# (the reference, measured in the same run with the same binary and vocab).
#   corpus: the sentences (lines) of /usr/share/common-licenses and of the
#   texts of ../shared/data that are present ($BERTD_SHARED_DATA), shuffled
#   with a seeded PRNG (Python's random, seed SEED) and concatenated, a
#   blank line (document break) every 20 lines, until SIZE bytes (one file);
#   vocab: tests/data/bert-base-uncased-vocab.txt; default shard size.
#   small: the first 16 MB of that corpus.
# Goals (docs/perf.md): peak RSS at most 1 GB at -j 2; tokens/s per thread
# on the big corpus within 20% of the small corpus's.
# Usage: bench/prepare_big.sh [BUILD_DIR] [SIZE_BYTES] [SEED]
#        (default: build 10000000000 1; WORK_DIR=... keeps the corpus there)
# Last line: "BENCH prepare_big ..." key=value pairs for scripts.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build}
size=${2:-10000000000}
seed=${3:-1}
data=${BERTD_SHARED_DATA:-$root/../shared/data}
prep=$build/loader/bertd-prepare
vocab=$root/tests/data/bert-base-uncased-vocab.txt
[ -x "$prep" ] || { echo "build first: ninja -C $build" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (Debian package time)" >&2; exit 2; }
py=/usr/bin/python3
[ -x "$py" ] || py=python3
if [ -n "${WORK_DIR:-}" ]; then
	tmp=$WORK_DIR
	mkdir -p "$tmp"
	trap 'rm -rf "$tmp"/out-*' EXIT INT TERM
else
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT INT TERM
fi

srcs=""
for f in /usr/share/common-licenses/*; do
	if [ -f "$f" ] && [ ! -L "$f" ]; then srcs="$srcs $f"; fi
done
for f in tinyshakespeare.txt pg2600-war-and-peace.txt wikitext2-raw-test.txt; do
	if [ -f "$data/$f" ]; then srcs="$srcs $data/$f"; else echo "skipped: $f (not in $data)"; fi
done

corpus=$tmp/corpus-$size-$seed.txt
if [ ! -s "$corpus" ]; then
	echo "making $corpus ($size bytes, seed $seed)"
	# shellcheck disable=SC2086
	"$py" - "$corpus" "$size" "$seed" $srcs <<'EOF'
import random, sys
out, size, seed, srcs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
lines = []
for p in srcs:
    with open(p, "rb") as f:
        lines += [l.strip() for l in f.read().split(b"\n") if l.strip()]
rng = random.Random(seed)
done = 0
with open(out, "wb", buffering=1 << 22) as f:
    while done < size:
        rng.shuffle(lines)
        buf = bytearray()
        for i, l in enumerate(lines):
            buf += l + b"\n"
            if i % 20 == 19:
                buf += b"\n"
        buf = bytes(buf[: size - done])
        f.write(buf)
        done += len(buf)
print("distinct lines: %d from %d files" % (len(lines), len(srcs)))
EOF
fi
small=$tmp/small-$seed.txt
head -c 16000000 "$corpus" > "$small"

# one run: prints "tokens seconds mb_per_s rss_kb" of bertd-prepare -j $2 on $1
run() {
	out=$tmp/out-$2-$(basename "$1")
	rm -rf "$out" "$(dirname "$out")/.$(basename "$out").partial"
	/usr/bin/time -f "%M" -o "$tmp/rss" "$prep" -o "$out" --vocab "$vocab" -j "$2" "$1" \
		> "$tmp/summary" 2> "$tmp/log" || { cat "$tmp/log" >&2; exit 1; }
	"$py" -c '
import json, sys
s = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print(s["tokens"], s["tokenize_seconds"], s["mb_per_s"], open(sys.argv[2]).read().split()[-1])' \
		"$tmp/summary" "$tmp/rss"
	rm -rf "$out"
}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
set -- $(run "$small" 1); s_tok=$1 s_sec=$2 s_mbps=$3 s_rss=$4
set -- $(run "$corpus" 1); b1_tok=$1 b1_sec=$2 b1_mbps=$3 b1_rss=$4
set -- $(run "$corpus" 2); b2_tok=$1 b2_sec=$2 b2_mbps=$3 b2_rss=$4
load1=$(cut -d' ' -f1-3 /proc/loadavg)

"$py" - "$size" "$s_tok" "$s_sec" "$s_rss" "$b1_tok" "$b1_sec" "$b1_rss" "$b2_tok" "$b2_sec" "$b2_rss" \
	"$load0" "$load1" "$(nproc)" <<'EOF'
import sys
a = sys.argv[1:]
size = int(a[0])
s_tps = int(a[1]) / float(a[2])
b1_tps = int(a[4]) / float(a[5])
b2_tps = int(a[7]) / float(a[8])
rss = [int(a[3]), int(a[6]), int(a[9])]
ratio = b1_tps / s_tps
scale = b2_tps / b1_tps
print()
print("bertd-prepare, vocab bert-base-uncased, %d online CPUs, load average %s -> %s" % (int(a[12]), a[10], a[11]))
print("%-26s %14s %12s %14s %12s" % ("run", "tokens", "seconds", "tokens/s/thr", "peak RSS MB"))
print("%-26s %14d %12.1f %14.0f %12.1f" % ("small 16 MB, -j 1 (ref)", int(a[1]), float(a[2]), s_tps, rss[0] / 1024))
print("%-26s %14d %12.1f %14.0f %12.1f" % ("big %.2f GB, -j 1" % (size / 1e9), int(a[4]), float(a[5]), b1_tps, rss[1] / 1024))
print("%-26s %14d %12.1f %14.0f %12.1f" % ("big %.2f GB, -j 2" % (size / 1e9), int(a[7]), float(a[8]), b2_tps / 2, rss[2] / 1024))
print("per-thread speed big/small (-j 1): %.2f (goal >= 0.80)   1 -> 2 threads: x%.2f   "
      "peak RSS -j 2: %.0f MB (goal <= 1024)" % (ratio, scale, rss[2] / 1024))
print("BENCH prepare_big bytes=%d small_tps=%.0f big_tps_j1=%.0f big_tps_j2_per_thread=%.0f ratio=%.3f "
      "scaling=%.3f rss_j1_kb=%d rss_j2_kb=%d" % (size, s_tps, b1_tps, b2_tps / 2, ratio, scale, rss[1], rss[2]))
EOF
