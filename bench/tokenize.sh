#!/bin/sh
# Tokenizer throughput, side by side in one run:
#   1. single-thread WordPiece, bertd (bench/tokenize_bench.c) vs HuggingFace
#      tokenizers (bench/tokenize_hf.py, RAYON_NUM_THREADS=1), same vocab,
#      same lines; prints MB/s, the ratio, and whether the ids are identical
#      (sha256 over all ids of the file);
#   2. bertd-prepare -j 1 vs -j 2 on the corpora concatenated 3 times.
# Usage: bench/tokenize.sh [BUILD_DIR] [REPEATS]   (default: build 3)
# Corpora: /usr/share/common-licenses (concatenated; on every Debian), plus
# those of ../shared/data ($BERTD_SHARED_DATA) that are present; vocab files
# from tests/data.
# Last line: "BENCH tokenize ..." key=value pairs for scripts.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build}
reps=${2:-3}
data=${BERTD_SHARED_DATA:-$root/../shared/data}
vocabs=$root/tests/data
bench=$build/bench/tokenize_bench
prep=$build/loader/bertd-prepare
[ -x "$bench" ] && [ -x "$prep" ] || { echo "build first: ninja -C $build" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
for f in /usr/share/common-licenses/*; do
	if [ -f "$f" ] && [ ! -L "$f" ]; then cat "$f"; echo; fi
done > "$tmp/common-licenses.txt"
files="$tmp/common-licenses.txt"
for f in tinyshakespeare.txt pg2600-war-and-peace.txt wikitext2-raw-test.txt wikitext2-tokens-valid.txt; do
	if [ -f "$data/$f" ]; then files="$files $data/$f"; else echo "skipped: $f (not in $data)"; fi
done

echo "machine: $(uname -m), $(nproc) CPU(s), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "HF: tokenizers $(python3 -c 'import tokenizers; print(tokenizers.__version__)'), single thread, encode_batch; best of $reps"
printf '\n%-8s %-28s %8s %12s %10s %8s %s\n' vocab corpus MB "bertd MB/s" "HF MB/s" ratio identical
all_same=yes
for mode in uncased cased; do
	if [ $mode = uncased ]; then v=$vocabs/bert-base-uncased-vocab.txt; l=lower; else v=$vocabs/bert-base-cased-vocab.txt; l=cased; fi
	"$bench" "$v" $l "$reps" $files > "$tmp/c.$mode"
	RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false python3 "$here/tokenize_hf.py" "$v" $l "$reps" $files > "$tmp/h.$mode"
	paste -d' ' "$tmp/c.$mode" "$tmp/h.$mode" | while read -r f b _ _ cm cs _ _ _ _ hm hs; do
		same=no; [ "$cs" = "$hs" ] && same=yes
		echo "$mode $(basename "$f") $b $cm $hm $same" |
			awk '{ printf "%-8s %-28s %8.2f %12.2f %10.2f %7.1fx %s\n", $1, $2, $3 / 1e6, $4, $5, $4 / $5, $6 }'
	done
	# totals: bytes / sum of per-file times
	paste -d' ' "$tmp/c.$mode" "$tmp/h.$mode" | awk -v m=$mode '
		{ b += $2; tc += $2 / ($5 * 1e6); th += $2 / ($11 * 1e6); if ($6 != $12) bad = 1 }
		END { printf "%s %.2f %.2f %d\n", m, b / 1e6 / tc, b / 1e6 / th, bad }' >> "$tmp/tot"
done
awk '{ if ($4) bad = 1; c += $2; h += $3; n++ } END {
	printf "\nall files, mean of the two vocabs: bertd %.2f MB/s, HF %.2f MB/s, ratio %.1fx, identical ids: %s\n",
		c / n, h / n, c / h, bad ? "NO" : "yes" }' "$tmp/tot"

# bertd-prepare scaling
for i in 1 2 3; do cat $files; done > "$tmp/corpus.txt"
mb=$(stat -c %s "$tmp/corpus.txt" | awk '{ printf "%.1f", $1 / 1e6 }')
printf "\nbertd-prepare on $mb MB (corpora x3), uncased vocab, best of 2:\n"
for j in 1 2; do
	best=0
	for r in 1 2; do
		rm -rf "$tmp/ds"
		s=$("$prep" -o "$tmp/ds" --vocab "$vocabs/bert-base-uncased-vocab.txt" --lowercase -j $j "$tmp/corpus.txt" 2>/dev/null |
			sed 's/.*"mb_per_s":\([0-9.e+-]*\).*/\1/')
		best=$(echo "$s $best" | awk '{ print ($1 > $2) ? $1 : $2 }')
	done
	echo "  -j $j: $(printf '%.2f' "$best") MB/s (tokenize pass, incl. shard writing)"
	eval "prep_j$j=$best"
done
echo "$prep_j1 $prep_j2" | awk '{ printf "  -j 2 / -j 1: %.2fx\n", $2 / $1 }'
awk -v j1="$prep_j1" -v j2="$prep_j2" '{ if ($4) bad = 1; c += $2; h += $3; n++ } END {
	printf "BENCH tokenize bertd_mbps=%.2f hf_mbps=%.2f ratio=%.2f identical=%s prepare_j1_mbps=%.2f prepare_j2_mbps=%.2f\n",
		c / n, h / n, c / h, bad ? "no" : "yes", j1, j2 }' "$tmp/tot"
