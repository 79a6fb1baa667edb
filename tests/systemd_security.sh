#!/usr/bin/env bash
# The unit, alone and with each documented drop-in of bertd.service.d/
# (remote listening, extra data roots) installed, must pass
# `systemd-analyze verify` without a single warning and rate at most 2.0
# ("OK") in systemd-analyze's exposure score.
# Usage: systemd_security.sh UNIT [BERTD]   (BERTD: an executable to stand in
# for /usr/local/bin/bertd, which verify requires to exist; default: true)
# Exit 77 (skip) where systemd-analyze is not installed.
set -u
unit=$1
exe=${2:-$(command -v true)}
command -v systemd-analyze >/dev/null || { echo "systemd-analyze not found: skip"; exit 77; }
dropins=$(dirname "$unit")/bertd.service.d
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# check NAME [DROPIN]: the unit (plus DROPIN as bertd.service.d/*.conf),
# ExecStart's binary replaced by $exe, in a directory of its own.
check() {
	local name=$1 dropin=${2:-} dir=$tmp/$1
	mkdir -p "$dir/bertd.service.d"
	sed "s#^ExecStart=/usr/local/bin/bertd #ExecStart=$exe #" "$unit" >"$dir/bertd.service"
	grep -q "^ExecStart=$exe " "$dir/bertd.service" || { echo "$name: no ExecStart=/usr/local/bin/bertd to check"; fail=1; return; }
	[ -z "$dropin" ] || cp "$dropin" "$dir/bertd.service.d/$(basename "$dropin" .example)"
	local out
	out=$(systemd-analyze verify "$dir/bertd.service" 2>&1)
	local rc=$?
	if [ $rc -ne 0 ] || [ -n "$out" ]; then
		echo "$name: systemd-analyze verify (rc $rc):"
		echo "$out"
		fail=1
	else
		echo "$name: systemd-analyze verify: clean"
	fi
	out=$(systemd-analyze security --offline=true "$dir/bertd.service" 2>&1)
	local score
	score=$(echo "$out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
	if [ -z "$score" ]; then
		echo "$name: could not read the exposure score:"
		echo "$out" | tail -n 5
		fail=1
	elif awk -v s="$score" 'BEGIN { exit !(s <= 2.0) }'; then
		echo "$name: exposure score $score (limit 2.0)"
	else
		echo "$name: exposure score $score is over the limit 2.0"
		echo "$out" | grep '✗'
		fail=1
	fi
}

check unit
n=0
for f in "$dropins"/*.conf.example; do
	[ -e "$f" ] || continue
	check "$(basename "$f" .conf.example)" "$f"
	n=$((n + 1))
done
[ $n -gt 0 ] || { echo "no drop-in examples in $dropins"; fail=1; }
exit $fail
