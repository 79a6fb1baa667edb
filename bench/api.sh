#!/bin/sh
# Control-plane throughput, one or two bertd binaries side by
# side in one run, each on its own copy of the same seeded database:
#   GET /v1/jobs?limit=100, ?state=completed&limit=100, a cursor page,
#   GET /v1/jobs/{id}, /v1/healthz, /v1/healthz while ?limit=100 is
#   hammered by a second wrk, POST /v1/jobs (each 201 is a durable job),
#   and /v1/healthz while the list is hammered and jobs are submitted at
#   once; prints req/s, p50 and p99 of each.
# Usage: bench/api.sh BERTD [BERTD_B] [N_JOBS] [SECONDS] [CONNECTIONS]
#   (defaults: 10000 jobs, 10 s, 32 connections)
# The jobs are written by bench/api_seed (from $BUILD, default build/)
# through daemon/store*.c before the daemon starts, into a tmpfs directory.
# STATE_ROOT: where each daemon's state dir (its copy of the database) lives;
# default the same tmpfs, where fsync costs nothing: set it to a directory on
# a disk to measure durable submissions (POST) as a user would see them.
# The daemons hold their queue (schedule=false): submitted jobs stay queued.
# Then, on a second database where all N jobs are queued (a sweep behind a
# held queue: api_seed --queued), the same list, the list of ?state=queued
# /v1/healthz while that list is hammered, and the list while one job
# changes 10 times a second (list_queued_writes).
# Needs wrk (apt-get install wrk) and curl. Each bertd runs CPU-only with
# BERTD_CONFIG=/dev/null on a free port; no worker starts (the first
# database's jobs are completed, failed or canceled, none queued; the
# daemons hold their queue).
# CASES: the case names to run (space-separated; default all).
# BERTD_* variables (e.g. BERTD_API_THREADS) reach both daemons.
# Last lines: "BENCH api <label> <case> rps=... p50_ms=... p99_ms=...", the
# cases of one wrk also with cpu_ms_per_req= (the daemon's CPU time, user +
# system, per request: what the machine's other load does not move much).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${BUILD:-$root/build}
seed=$build/bench/api_seed
[ $# -ge 1 ] || { echo "usage: $0 BERTD [BERTD_B] [N_JOBS] [SECONDS] [CONNECTIONS]" >&2; exit 2; }
a=$1; shift
b=
case ${1:-} in ''|*[!0-9]*) [ $# -ge 1 ] && { b=$1; shift; } ;; esac
n=${1:-10000}
secs=${2:-10}
conns=${3:-32}
[ -x "$seed" ] || { echo "build first: ninja -C $build bench/api_seed" >&2; exit 2; }
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install -y wrk" >&2; exit 2; }
for bin in $a $b; do [ -x "$bin" ] || { echo "not an executable: $bin" >&2; exit 2; }; done
scratch=/dev/shm
[ -d "$scratch" ] && [ -w "$scratch" ] || scratch=${TMPDIR:-/tmp}
tmp=$(mktemp -d "$scratch/bertd-api-bench.XXXXXX")
pid= states=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$tmp" ${states:+"$states"}
}
trap cleanup EXIT INT TERM
state_root=${STATE_ROOT:-$tmp}
[ -d "$state_root" ] || { echo "STATE_ROOT $state_root is not a directory" >&2; exit 2; }
states=$(mktemp -d "$state_root/bertd-api-bench-state.XXXXXX")
# POST /v1/jobs: the seed's spec (its dataset "pubmed" is stored as ready)
cat >"$tmp/submit.json" <<'SPEC'
{"name": "bench-post", "dataset": "pubmed", "model": {"preset": "bert-base", "num_hidden_layers": 12}, "training_args": {"per_device_train_batch_size": 64, "learning_rate": 1e-4, "warmup_steps": 10, "max_steps": 1000, "max_seq_length": 128, "logging_steps": 10, "save_steps": 100, "dataloader_num_workers": 2}, "resources": {"gpus": 1}}
SPEC
cat >"$tmp/submit.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open(os.getenv("SUBMIT_BODY"), "r")
wrk.body = f:read("*a")
f:close()
LUA
export SUBMIT_BODY="$tmp/submit.json"

# SEED_SCHEMA: migrations to seed with (the oldest binary's schema.sql when
# the two differ, so each daemon migrates the copy itself at start).
"$seed" "$tmp/seed.db" "$n" ${SEED_SCHEMA:+"$SEED_SCHEMA"} 2>"$tmp/seed.log" >/dev/null ||
	{ tail -5 "$tmp/seed.log" >&2; exit 1; }

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wrk's --latency report -> "rps=... p50_ms=... p99_ms=..."
summarize() {
	awk '
	function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0;
	                 if (v ~ /m$/) return v * 60000; return v * 1000 }
	$1 == "50%" { p50 = ms($2) } $1 == "99%" { p99 = ms($2) }
	$1 == "Requests/sec:" { rps = $2 }
	$1 == "Non-2xx" { bad = $NF }
	$1 == "Socket" { err = $0; sub(/.*errors: /, "", err); gsub(/[ ,]+/, "_", err) }
	END { printf "rps=%s p50_ms=%.2f p99_ms=%.2f%s%s\n", rps, p50, p99,
	             bad ? " non2xx=" bad : "", err ? " errors=" err : "" }'
}

# the daemon's CPU time so far (ms: user + system, from /proc)
cpu_ms() {
	awk -v t="$(getconf CLK_TCK)" '{printf "%d\n", ($14 + $15) * 1000 / t}' "/proc/$pid/stat"
}

# one wrk run of path (extra wrk options before it) -> summarize's line
# and the daemon's CPU per request, which the machine's other load barely
# moves (latency and req/s swing with it)
measure() { # path [wrk options...]
	path=$1; shift
	c0=$(cpu_ms)
	out=$(wrk -t2 -c"$conns" -d"${secs}s" --timeout 30s --latency "$@" "$url$path")
	c1=$(cpu_ms)
	reqs=$(echo "$out" | awk '/requests in/ {print $1}')
	echo "$(echo "$out" | summarize) cpu_ms_per_req=$(awk -v c=$((c1 - c0)) -v r="${reqs:-0}" \
		'BEGIN {printf "%.3f", (r > 0 ? c / r : 0)}')"
}

want() { # case name: run it?
	case " ${CASES:-$1} " in *" $1 "*) return 0 ;; esac
	return 1
}

if want list_queued || want list_queued_state || want healthz_under_list_queued || want list_queued_writes; then
	"$seed" --queued "$tmp/seed_queued.db" "$n" ${SEED_SCHEMA:+"$SEED_SCHEMA"} 2>"$tmp/seed.log" >/dev/null ||
		{ tail -5 "$tmp/seed.log" >&2; exit 1; }
fi

start_daemon() { # label bin db: sets pid, url, auth, dir
	label=$1 bin=$2 dir=$states/$1
	mkdir -p "$dir/state"
	cp "$3" "$dir/state/bertd.db"
	port=$(free_port)
	BERTD_CONFIG=/dev/null BERTD_STATE_DIR=$dir/state BERTD_PORT=$port BERTD_SCHEDULE=false \
		"$bin" >"$dir/log" 2>&1 &
	pid=$!
	url=http://127.0.0.1:$port
	i=0
	until curl -sf "$url/v1/healthz" >/dev/null; do
		i=$((i + 1))
		[ $i -lt 300 ] && kill -0 "$pid" 2>/dev/null || { tail -5 "$dir/log" >&2; exit 1; }
		sleep 0.1
	done
	tok=$(cat "$dir/state/token")
	auth="Authorization: Bearer $tok"
}

stop_daemon() {
	kill "$pid"
	wait "$pid" 2>/dev/null || true
	pid=
}

# healthz answered while a list path is hammered: two wrk at once
healthz_under() { # case list_path
	wrk -t1 -c"$conns" -d"$((secs + 2))s" --timeout 30s -H "$auth" "$url$2" >/dev/null &
	bg=$!
	sleep 1
	r=$(wrk -t1 -c4 -d"${secs}s" --timeout 30s --latency "$url/v1/healthz" | summarize)
	wait $bg
	echo "BENCH api $label $1 $r"
}

run_one() { # label bin
	start_daemon "$1" "$2" "$tmp/seed.db"
	cursor=$(curl -sf -H "$auth" "$url/v1/jobs?limit=100" |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["next_cursor"])')
	one=$(curl -sf -H "$auth" "$url/v1/jobs?limit=1&state=completed" |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["id"])')
	for c in "list:/v1/jobs?limit=100" "list_completed:/v1/jobs?state=completed&limit=100" \
		 "list_cursor:/v1/jobs?limit=100&cursor=$cursor" "get_one:/v1/jobs/$one" \
		 "healthz:/v1/healthz"; do
		name=${c%%:*} path=${c#*:}
		want "$name" || continue
		echo "BENCH api $label $name $(measure "$path" -H "$auth")"
	done
	want healthz_under_list && healthz_under healthz_under_list "/v1/jobs?limit=100"
	# submissions: every 201 is a committed (fsynced) job
	if want submit; then
		r=$(wrk -t2 -c"$conns" -d"${secs}s" --timeout 30s --latency -H "$auth" -s "$tmp/submit.lua" \
			"$url/v1/jobs" | summarize)
		echo "BENCH api $label submit $r"
	fi
	# healthz while the list is hammered and jobs are submitted
	if want healthz_under_list_submit; then
		wrk -t1 -c"$conns" -d"$((secs + 2))s" --timeout 30s -H "$auth" "$url/v1/jobs?limit=100" >/dev/null &
		bg=$!
		wrk -t1 -c"$conns" -d"$((secs + 2))s" --timeout 30s --latency -H "$auth" -s "$tmp/submit.lua" \
			"$url/v1/jobs" >"$dir/submit_bg" &
		bg2=$!
		sleep 1
		r=$(wrk -t1 -c4 -d"${secs}s" --timeout 30s --latency "$url/v1/healthz" | summarize)
		wait $bg $bg2
		echo "BENCH api $label healthz_under_list_submit $r"
		echo "BENCH api $label submit_beside_list $(summarize <"$dir/submit_bg")"
	fi
	stop_daemon
}

# A sweep waiting behind a held queue: every job queued, none started.
run_queued() { # label bin
	start_daemon "$1-queued" "$2" "$tmp/seed_queued.db"
	label=$1
	for c in "list_queued:/v1/jobs?limit=100" "list_queued_state:/v1/jobs?state=queued&limit=100"; do
		name=${c%%:*} path=${c#*:}
		want "$name" || continue
		echo "BENCH api $label $name $(measure "$path" -H "$auth")"
	done
	want healthz_under_list_queued && healthz_under healthz_under_list_queued "/v1/jobs?limit=100"
	# the same list while one queued job changes 10 times a second (PATCH of
	# its priority): each change is a new store revision, so no page is the
	# same for long (the first page's kept texts stay but one)
	if want list_queued_writes; then
		first=$(curl -sf -H "$auth" "$url/v1/jobs?limit=1" |
			python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["id"])')
		(k=0; while :; do
			k=$(((k + 1) % 100))
			curl -s -o /dev/null -X PATCH -H "$auth" -H 'Content-Type: application/json' \
				-d "{\"priority\": $k}" "$url/v1/jobs/$first"
			sleep 0.1
		done) &
		writer=$!
		r=$(measure "/v1/jobs?limit=100" -H "$auth")
		kill $writer 2>/dev/null; wait $writer 2>/dev/null || true
		echo "BENCH api $label list_queued_writes $r"
	fi
	stop_daemon
}

echo "api bench: $n jobs, ${secs}s per case, $conns connections, $(nproc) cores, state in $state_root"
run_one A "$a"
[ -z "$b" ] || run_one B "$b"
if want list_queued || want list_queued_state || want healthz_under_list_queued || want list_queued_writes; then
	run_queued A "$a"
	[ -z "$b" ] || run_queued B "$b"
fi
