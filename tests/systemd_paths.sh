#!/usr/bin/env bash
# What bertd's processes need from the sandbox (docs/operations.md, "What
# bertd's processes need from the systemd unit") against the unit itself:
# every setting in the last column of the table after <!-- unit-needs --> is
# a line of bertd.service as written there, and no setting of the table
# after <!-- unit-forbids --> is. bertd-nvidia-devices.service passes
# `systemd-analyze verify` (nvidia-modprobe replaced by true) where
# systemd-analyze exists.
# Usage: systemd_paths.sh SYSTEMD_DIR OPERATIONS_MD
set -u
dir=$1 doc=$2
unit=$dir/bertd.service
fail=0 n=0
# table_cells MARKER COLUMN: the backticked items of one column of the
# table right after MARKER (a column counted from 1, 0 = the last)
table_cells() {
	awk -v m="$1" -v col="$2" '
		$0 ~ m { on = 1; next }
		on && /^\|/ { if (++row <= 2) next
			nf = split($0, c, "|"); cell = (col == 0) ? c[nf - 1] : c[col + 1]
			while (match(cell, /`[^`]+`/)) { print substr(cell, RSTART + 1, RLENGTH - 2); cell = substr(cell, RSTART + RLENGTH) }
			next }
		on && row > 0 && !/^\|/ { exit }' "$doc"
}
while IFS= read -r setting; do
	case $setting in *=*) ;; *) continue ;; esac
	n=$((n + 1))
	if grep -qxF -- "$setting" "$unit"; then echo "ok      $setting"
	else echo "MISSING $setting (docs/operations.md says the unit has it)"; fail=1; fi
done < <(table_cells '<!-- unit-needs -->' 0)
[ $n -ge 15 ] || { echo "only $n settings read from the table in $doc"; fail=1; }
m=0
while IFS= read -r setting; do
	m=$((m + 1))
	if grep -qxF -- "$setting" "$unit"; then echo "FORBIDDEN $setting is in the unit"; fail=1
	else echo "absent  $setting"; fi
done < <(table_cells '<!-- unit-forbids -->' 1)
[ $m -ge 3 ] || { echo "only $m forbidden settings read from the table in $doc"; fail=1; }
if command -v systemd-analyze >/dev/null; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	sed "/^ExecStart=/s#/usr/bin/nvidia-modprobe#$(command -v true)#g" "$dir/bertd-nvidia-devices.service" \
		>"$tmp/bertd-nvidia-devices.service"
	if out=$(systemd-analyze verify "$tmp/bertd-nvidia-devices.service" 2>&1) && [ -z "$out" ]; then
		echo "bertd-nvidia-devices.service: systemd-analyze verify: clean"
	else
		echo "bertd-nvidia-devices.service: systemd-analyze verify:"; echo "$out"; fail=1
	fi
fi
exit $fail
