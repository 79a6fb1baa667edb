#!/usr/bin/env bash
# bench/slow_source.sh — the seed's loader experiment on the CPU backend:
# one job, run with dataloader_num_workers 0 and then with L loaders, its
# data source made slow with profiler.simulate_data_delay_ms (every batch
# sleeps DELAY ms before it is built, as if read from slow storage). Prints
# per run the tokens/s, step time and data-wait share of the last logged
# windows and the input_bound verdict, then the throughput ratio, and one
# machine-parsable BENCH line.
#
#   bench/slow_source.sh [BUILD_DIR] [DELAY_MS] [LOADERS...]
#     defaults: build 50 "2 8"
# Needs curl and jq (scripts/setup installs them) and ../shared/data or
# /usr/share/common-licenses for the corpus. Leaves nothing running; its
# state lives in a temp dir that is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
delay=${2:-50}
shift $(( $# >= 2 ? 2 : $# ))
loaders=("$@")
[ ${#loaders[@]} -gt 0 ] || loaders=(2 8)
BIN=$build/bertd
[ -x "$BIN" ] || { echo "slow_source: $BIN not built" >&2; exit 1; }

tmp=$(mktemp -d /tmp/bertd-slow-source.XXXXXX)
mkdir -p "$tmp/data"
if [ -f ../shared/data/tinyshakespeare.txt ]; then
  head -c 400000 ../shared/data/tinyshakespeare.txt > "$tmp/data/corpus.txt"
else
  cat /usr/share/common-licenses/* | head -c 400000 > "$tmp/data/corpus.txt"
fi
"$BIN" --config /dev/null --state-dir "$tmp" --data-roots "$tmp/data" --devices cpu --cpu-slots 2 \
       --port 0 >>"$tmp/bertd.log" 2>&1 &
pid=$!
cleanup() { kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
for _ in $(seq 100); do [ -s "$tmp/bertd.addr" ] && break; sleep 0.1; done
[ -s "$tmp/bertd.addr" ] || { tail "$tmp/bertd.log"; echo "slow_source: bertd did not start" >&2; exit 1; }
URL=$(cat "$tmp/bertd.addr")
TOKEN=$(cat "$tmp/token")
api() { curl -sS -H "Authorization: Bearer $TOKEN" "$@"; }

api -H 'Content-Type: application/json' -X POST "$URL/v1/datasets" \
    -d '{"name":"d","source":"corpus.txt","vocab":{"train":{"vocab_size":1000}}}' >/dev/null
while case "$(api "$URL/v1/datasets/d" | jq -r .state)" in queued|preparing) true;; *) false;; esac; do sleep 0.2; done
[ "$(api "$URL/v1/datasets/d" | jq -r .state)" = ready ] || { echo "slow_source: dataset failed" >&2; exit 1; }

# bert-tiny (2 layers, hidden 128): tens of ms of compute per step; 2 CPU slots
# give the one worker one thread (OpenMP on a busy box suffers most from more)
run() { # $1 loaders -> prints "tokens_per_s step_ms wait_share status"
  local spec id j
  spec="{\"dataset\":\"d\",\"model\":{\"preset\":\"bert-tiny\"},
    \"training_args\":{\"per_device_train_batch_size\":16,\"max_seq_length\":64,\"max_steps\":100,
      \"logging_steps\":10,\"save_steps\":100000,\"dataloader_num_workers\":$1,\"seed\":1},
    \"profiler\":{\"simulate_data_delay_ms\":$delay}}"
  id=$(api -H 'Content-Type: application/json' -X POST "$URL/v1/jobs" -d "$spec" | jq -r .id)
  while :; do
    j=$(api "$URL/v1/jobs/$id")
    case "$(echo "$j" | jq -r .state)" in completed) break ;; failed|canceled)
      echo "slow_source: job $id: $(echo "$j" | jq -r .failure_reason)" >&2; exit 1 ;; esac
    sleep 0.5
  done
  # the last 6 windows (60 steps): past start-up, the ring full
  api "$URL/v1/jobs/$id/metrics" | jq -r '.metrics[-6:] |
    [(map(.tokens_per_s) | add / length), (map(.step_time_ms) | add / length),
     ((map(.phases_ms.data_wait) | add) / (map(.step_time_ms) | add))] | @tsv' |
    tr '\n' '\t'
  api "$URL/v1/jobs/$id/diagnosis" | jq -r '.rules[] | select(.rule == "input_bound") | .status'
}

echo "bert-tiny, batch 16 x 64, 1 worker, simulated source delay ${delay} ms per batch"
printf "%-8s %12s %10s %11s %12s %10s\n" loaders tokens/s step_ms data_wait input_bound vs_0
read -r tps0 st0 w0 s0 < <(run 0)
pct() { awk -v x="$1" 'BEGIN { printf "%.1f", 100 * x }'; }
printf "%-8s %12.0f %10.1f %10s%% %12s %9.2fx\n" 0 "$tps0" "$st0" "$(pct "$w0")" "$s0" 1
line="BENCH slow_source delay_ms=$delay tps_0=$(printf %.0f "$tps0") wait_0=$(awk -v x="$w0" 'BEGIN { printf "%.3f", x }')"
for l in "${loaders[@]}"; do
  read -r tps st w s < <(run "$l")
  r=$(awk -v a="$tps" -v b="$tps0" 'BEGIN { printf "%.4f", a / b }')
  printf "%-8s %12.0f %10.1f %10s%% %12s %9.2fx\n" "$l" "$tps" "$st" "$(pct "$w")" "$s" "$r"
  line="$line tps_$l=$(printf %.0f "$tps") wait_$l=$(awk -v x="$w" 'BEGIN { printf "%.3f", x }') ratio_$l=$(printf %.2f "$r")"
done
echo "$line"
