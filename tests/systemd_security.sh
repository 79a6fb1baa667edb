#!/usr/bin/env bash
# The unit must rate at most 2.0 ("OK") in systemd-analyze's exposure score.
# Exit 77 (skip) where systemd-analyze is not installed.
set -u
unit=$1
command -v systemd-analyze >/dev/null || { echo "systemd-analyze not found: skip"; exit 77; }
out=$(systemd-analyze security --offline=true "$unit" 2>&1)
echo "$out" | tail -n 3
score=$(echo "$out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
[ -n "$score" ] || { echo "could not read the exposure score"; exit 1; }
echo "exposure score: $score (limit 2.0)"
awk -v s="$score" 'BEGIN { exit !(s <= 2.0) }'
