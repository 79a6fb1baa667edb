#!/usr/bin/env bash
# bertd.service's ExecStopPost= (the shell line as the unit has it, systemd's
# "$$" unescaped) run in a cgroup named like the unit, beside a stand-in for
# a worker left in it: after a clean stop (SERVICE_RESULT=success,
# EXIT_STATUS=0) the stand-in is killed; after a restart's exit (5) or a
# crash it is left running.
# Usage: systemd_stoppost.sh UNIT
# Exit 77 (skip) without root or a writable cgroup2 hierarchy.
set -u
unit=$1
[ "$(id -u)" -eq 0 ] || { echo "needs root: skip"; exit 77; }
base=
for b in /sys/fs/cgroup /sys/fs/cgroup/unified; do
	if [ "$(stat -f -c %T "$b" 2>/dev/null)" = cgroup2fs ] && [ -w "$b/cgroup.procs" ]; then base=$b; break; fi
done
[ -n "$base" ] || { echo "no writable cgroup2 hierarchy: skip"; exit 77; }
line=$(sed -n 's/^ExecStopPost=\/bin\/sh -c //p' "$unit")
[ -n "$line" ] || { echo "no ExecStopPost=/bin/sh -c line in $unit"; exit 1; }
script=$(python3 -c 'import shlex, sys; print(shlex.split(sys.argv[1])[0].replace("$$", "$"))' "$line")
cg=$base/bertd-stoppost-$$.service
mkdir "$cg" || { echo "cannot make $cg: skip"; exit 77; }
fail=0 worker=
cleanup() { [ -n "$worker" ] && kill -KILL "$worker" 2>/dev/null; wait 2>/dev/null; rmdir "$cg" 2>/dev/null; }
trap cleanup EXIT

# case RESULT STATUS WANT: WANT is "killed" or "alive"
case_() {
	local result=$1 status=$2 want=$3
	sh -c 'echo $$ > "$1/cgroup.procs" && exec sleep 300' sh "$cg" &
	worker=$!
	for _ in $(seq 100); do grep -qx "$worker" "$cg/cgroup.procs" && break; sleep 0.05; done
	sh -c 'echo $$ > "$1/cgroup.procs" && exec env SERVICE_RESULT="$2" EXIT_STATUS="$3" sh -c "$4"' \
		sh "$cg" "$result" "$status" "$script"
	local got=alive
	kill -0 "$worker" 2>/dev/null || got=killed
	# a killed worker is reaped here; give it the moment SIGKILL takes
	if [ "$want" = killed ] && [ $got = alive ]; then
		for _ in $(seq 100); do kill -0 "$worker" 2>/dev/null || { got=killed; break; }; sleep 0.05; done
	fi
	if [ $got = "$want" ]; then echo "ok   SERVICE_RESULT=$result EXIT_STATUS=$status: worker $got"
	else echo "FAIL SERVICE_RESULT=$result EXIT_STATUS=$status: worker $got, want $want"; fail=1; fi
	kill -KILL "$worker" 2>/dev/null
	wait "$worker" 2>/dev/null
	worker=
}
case_ success 5 alive        # a restart's exit: jobs left for the next bertd
case_ exit-code 1 alive      # a failure: Restart= brings a bertd that adopts them
case_ signal KILL alive      # kill -9 of the daemon
case_ success 0 killed       # a stop for good: nothing may stay
exit $fail
