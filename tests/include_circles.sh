#!/bin/bash
# include_circles — no two source files of the product depend on each other.
#
# Usage: include_circles.sh SOURCE_ROOT BUILD_DIR
#
# Two checks over api/ client/ common/ daemon/ kernels/ loader/ worker/:
#  1. Headers: a.c reaches b.h (its own #includes, followed through the
#     project's headers) while b.c reaches a.h. a.h / b.h are each file's own
#     header (same path, .h); a file without one is seen by check 2.
#  2. Symbols: a.c's object uses a function or variable that b.c's object
#     defines while b.c's uses one of a.c's (nm over the objects meson
#     built, compile_commands.json naming each object's source). This sees
#     calls declared in a third header (a device calling back into the
#     process's main file through loop.h, say).
# Either is a circle: the two files can only be read, changed and tested
# together. Break it by moving what both need into a file that depends on
# neither, or by handing a callback or a context in (docs/architecture.md).
# Longer loops through a table of handlers (http.c -> routes.c -> jobs.c ->
# http.c's reply helpers) are what a dispatcher is and are not reported.
#
# Exit 0 clean, 1 with each circle on a line, 77 when the build's objects
# cannot be read (no jq or nm, or no symbols: an LTO build).
set -u
src=$(cd "$1" && pwd) || exit 1
build=$(cd "$2" && pwd) || exit 1
dirs=(api client common daemon kernels loader worker)
fail=0

# ---- 1. headers ----
cd "$src" || exit 1
incs() { sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\.h\)".*/\1/p' "$1"; }
# " h1 h2 ... ": the project headers file $1 reaches
reach() {
	local seen=" " h
	local todo=($(incs "$1"))
	while [ ${#todo[@]} -gt 0 ]; do
		h=${todo[0]}
		todo=("${todo[@]:1}")
		[[ $seen == *" $h "* ]] && continue
		[ -f "$h" ] || continue
		seen+="$h "
		todo+=($(incs "$h"))
	done
	printf '%s' "$seen"
}
declare -A reached
files=()
while IFS= read -r f; do
	[ -f "${f%.*}.h" ] || continue
	files+=("$f")
	reached[$f]=$(reach "$f")
done < <(find "${dirs[@]}" \( -name '*.c' -o -name '*.cu' -o -name '*.cc' -o -name '*.cpp' \) | LC_ALL=C sort)
for a in "${files[@]}"; do
	for b in "${files[@]}"; do
		[[ $a < $b ]] || continue
		ha=${a%.*}.h hb=${b%.*}.h
		[ "$ha" = "$hb" ] && continue
		if [[ ${reached[$a]} == *" $hb "* && ${reached[$b]} == *" $ha "* ]]; then
			echo "include circle: $a includes $hb and $b includes $ha"
			fail=1
		fi
	done
done

# ---- 2. symbols ----
if ! command -v jq >/dev/null || ! command -v nm >/dev/null || [ ! -f "$build/compile_commands.json" ]; then
	echo "include_circles: no jq, nm or compile_commands.json: the symbol check is skipped"
	[ $fail -eq 0 ] && exit 77
	exit 1
fi
cd "$build" || exit 1
# "D target symbol file" per definition, "U target symbol file" per use
syms=$(jq -r '.[] | [.output, .file] | @tsv' compile_commands.json |
	while IFS=$'\t' read -r out file; do
		f=$(realpath -m --relative-to="$src" "$build/$file")
		case $f in api/* | client/* | common/* | daemon/* | kernels/* | loader/* | worker/*) ;; *) continue ;; esac
		[ -f "$out" ] || continue
		nm -g "$out" 2>/dev/null | awk -v t="${out%/*}" -v f="$f" '
			NF == 3 && $2 ~ /^[TDBRVW]$/ { print "D", t, $3, f }
			NF == 2 && $1 == "U" { print "U", t, $2, f }'
	done)
if ! grep -q '^D ' <<<"$syms"; then
	echo "include_circles: no symbols in the build's objects: the symbol check is skipped"
	[ $fail -eq 0 ] && exit 77
	exit 1
fi
# a use resolves to the definition in the same target (meson's object
# directory), else to any: libraries are linked into other targets
circles=$(awk '
	$1 == "D" { dt[$2 " " $3] = $4; dg[$3] = $4; next }
	{ ut[n] = $2; us[n] = $3; uf[n++] = $4 }
	END {
		for (i = 0; i < n; i++) {
			k = ut[i] " " us[i]
			d = (k in dt) ? dt[k] : ((us[i] in dg) ? dg[us[i]] : "")
			if (d != "" && d != uf[i] && !((uf[i] " " d) in e))
				e[uf[i] " " d] = us[i]
		}
		for (p in e) { split(p, x, " ")
		if (x[1] < x[2] && ((x[2] " " x[1]) in e))
			print "circle: " x[1] " uses " e[p] " of " x[2] ", which uses " e[x[2] " " x[1]] " of it" } }
' <<<"$syms" | LC_ALL=C sort)
if [ -n "$circles" ]; then
	echo "$circles"
	fail=1
fi
[ $fail -eq 0 ] && echo "include_circles: no circles"
exit $fail
