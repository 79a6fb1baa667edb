#!/usr/bin/env bash
# The README's walk-through, run as a reader would run it: every ```sh block
# that follows a `<!-- walkthrough -->` line, in order, in one shell, in a
# fresh directory laid out like the repository root (build/ and tests/ are
# links to this build and source tree, ./var is new). The reader's way of
# choosing a port is the test's: BERTD_PORT for bertd, BERTD for the
# commands, set to a port nothing listens on.
#
# Fails when a block's command fails (the blocks run under set -euo
# pipefail; their curl calls use --fail-with-body), when fewer than the
# expected blocks are found, or when a job bertd knows afterwards is not
# `completed` or a dataset not `ready`.
#   readme_walkthrough.sh SOURCE_ROOT BUILD_ROOT
set -euo pipefail
src=$1 build=$2
for tool in curl jq; do # what scripts/setup installs for the reader
  command -v $tool >/dev/null || { echo "skipped: no $tool"; exit 77; }
done
readme=$src/README.md
want_blocks=3 # README's walk-through blocks; a marker lost in an edit must not pass quietly

work=$(mktemp -d "${TMPDIR:-/tmp}/bertd-readme-XXXXXX")
daemon_pid() { [ -s "$work/var/bertd.lock" ] && tr -dc '0-9' <"$work/var/bertd.lock" | head -c 10; }
cleanup() {
  local pid
  pid=$(daemon_pid || true)
  if [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; then
    # bounded wait for bertd to stop its jobs and exit
    for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# The blocks: the fence after each marker, up to its closing fence.
awk -v out="$work/walkthrough.sh" '
  /^<!-- walkthrough -->$/ { armed = 1; next }
  armed && /^```sh$/       { inblock = 1; armed = 0; n++; print "# --- block " n >> out; next }
  inblock && /^```$/       { inblock = 0; next }
  inblock                  { print >> out }
  END                      { print n + 0 > "/dev/stderr" }
' "$readme" 2>"$work/nblocks"
n=$(cat "$work/nblocks")
[ "$n" = "$want_blocks" ] || { echo "README.md: $n walk-through blocks, want $want_blocks" >&2; exit 1; }

ln -s "$build" "$work/build"
ln -s "$src/tests" "$work/tests"
[ -x "$work/build/bertd" ] || { echo "no bertd in $build" >&2; exit 1; }

# A loopback port nothing listens on now (connect refused). Another test's
# daemon may take it before bertd binds it: then the walk-through runs again
# on another port, from a fresh ./var.
free_port() {
  local p
  for _ in $(seq 50); do
    p=$(( 20000 + RANDOM % 30000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  echo "no free loopback port found" >&2
  return 1
}

export BERTD_CONFIG=/dev/null # this machine's /etc/bertd/bertd.conf is not the reader's
export BERTD_DEVICES=cpu      # only the CPU backend is tested here
cd "$work"
for attempt in 1 2 3; do
  port=$(free_port)
  export BERTD_PORT=$port BERTD=http://127.0.0.1:$port
  echo "walk-through in $work, bertd at $BERTD"
  if bash -c "set -euo pipefail; . ./walkthrough.sh" >walk.out 2>&1; then
    break
  fi
  if grep -q "cannot listen on .*Address already in use" walk.out && [ $attempt -lt 3 ]; then
    echo "port $port was taken before bertd bound it: again on another"
    rm -rf var
    continue
  fi
  cat walk.out
  echo "FAIL: a walk-through command failed (last output above)" >&2
  exit 1
done
cat walk.out

# What the walk-through left in bertd: its job completed, its dataset ready.
TOKEN=$(cat var/token)
get() { curl -sS --fail-with-body -H "Authorization: Bearer $TOKEN" "$BERTD$1"; }
jobs=$(get "/v1/jobs?limit=100")
datasets=$(get /v1/datasets)
njobs=$(jq '.jobs | length' <<<"$jobs")
bad=$(jq -r '.jobs[] | select(.state != "completed") | "\(.id) \(.state) \(.failure_reason)"' <<<"$jobs")
[ "$njobs" -ge 1 ] || { echo "FAIL: the walk-through submitted no job" >&2; exit 1; }
[ -z "$bad" ] || { echo "FAIL: jobs not completed: $bad" >&2; exit 1; }
bad=$(jq -r '.datasets[] | select(.state != "ready") | "\(.name) \(.state) \(.error)"' <<<"$datasets")
[ -z "$bad" ] || { echo "FAIL: datasets not ready: $bad" >&2; exit 1; }
model_dir=$(jq -r '.jobs[0].model_dir' <<<"$jobs")
[ -s "$model_dir/config.json" ] || { echo "FAIL: no exported model in $model_dir" >&2; exit 1; }
echo "ok: $njobs job(s) completed, model in $model_dir"
