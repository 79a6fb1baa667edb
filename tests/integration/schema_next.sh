#!/bin/bash
# schema_next — schema.sql with one more migration appended, for the
# "newer" bertd of test_adopt (a daemon with a migration its predecessor
# lacks adopts that one's jobs). Usage: schema_next.sh IN OUT
set -eu
n=$(grep -oE '^-- migration [0-9]+' "$1" | awk '{ if ($3 > m) m = $3 } END { print m + 0 }')
{
	cat "$1"
	printf -- '-- migration %d: test only (test_adopt): a table the older bertd does not have\n' $((n + 1))
	printf 'CREATE TABLE adopt_probe (x INTEGER);\n'
} > "$2"
