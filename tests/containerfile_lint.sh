#!/usr/bin/env bash
# tests/containerfile_lint.sh SRC — a syntax and consistency check of
# packaging/container/Containerfile.* where no image can be built (no
# registry to pull the base images from; hadolint is not in Debian): every
# instruction known, ARG/FROM first, each stage named once, every COPY
# --from an earlier stage, exec-form ENTRYPOINT/CMD valid JSON naming a
# binary the package installs, every tree path the files use present, and
# the CPU image's build packages installed by scripts/setup too. It must
# never need a container engine.
set -uo pipefail
src=$(cd "$1" && pwd)
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }
known=" FROM RUN COPY ADD ENV ARG WORKDIR USER VOLUME EXPOSE ENTRYPOINT CMD HEALTHCHECK LABEL SHELL STOPSIGNAL ONBUILD "
status=0
bad() { echo "$file:$lineno: $*"; status=1; }

files=("$src"/packaging/container/Containerfile.*)
[ -e "${files[0]}" ] || { echo "no packaging/container/Containerfile.*"; exit 1; }
for file in "${files[@]}"; do
	stages=() first="" lineno=0 start=0 logical=""
	# logical lines: comments dropped, backslash continuations joined
	while IFS= read -r line || [ -n "$line" ]; do
		lineno=$((lineno + 1))
		[ -z "$logical" ] && start=$lineno
		case $line in '#'*) continue ;; esac
		if [[ $line =~ \\[[:space:]]*$ ]]; then
			logical+="${line%\\*} "
			continue
		fi
		logical+=$line
		[[ $logical =~ ^[[:space:]]*$ ]] && { logical=""; continue; }
		inst=$(awk '{print toupper($1)}' <<<"$logical")
		args=$(sed -E 's/^[[:space:]]*[A-Za-z]+[[:space:]]*//' <<<"$logical")
		lineno_save=$lineno lineno=$start
		[[ $known == *" $inst "* ]] || bad "unknown instruction $inst"
		[ -n "$first" ] || { first=$inst; [[ $inst == FROM || $inst == ARG ]] || bad "the first instruction is $inst, not FROM (or ARG)"; }
		case $inst in
		FROM)
			if [[ $args =~ [[:space:]][Aa][Ss][[:space:]]+([A-Za-z0-9_.-]+)[[:space:]]*$ ]]; then
				name=${BASH_REMATCH[1]}
				[[ " ${stages[*]} " == *" $name "* ]] && bad "stage $name named twice"
				stages+=("$name")
			fi ;;
		COPY|ADD)
			if [[ $args =~ --from=([^[:space:]]+) ]]; then
				[[ " ${stages[*]} " == *" ${BASH_REMATCH[1]} "* ]] || bad "COPY --from=${BASH_REMATCH[1]}: no earlier stage of that name"
			else
				read -ra parts <<<"$args"
				for p in "${parts[@]:0:${#parts[@]}-1}"; do
					[[ $p == --* ]] && continue
					[ -e "$src/$p" ] || bad "COPY source $p is not in the tree"
				done
			fi ;;
		ENTRYPOINT|CMD)
			if [[ $args == '['* ]]; then
				if ! exe=$(jq -er '.[0]' <<<"$args" 2>/dev/null); then
					bad "$inst is not valid JSON: $args"
				elif [ "$inst" = ENTRYPOINT ] && ! jq -e 'index("/usr/bin/bertd")' <<<"$args" >/dev/null; then
					bad "ENTRYPOINT does not run /usr/bin/bertd"
				elif ! grep -qx "$exe" "$src/packaging/deb/bertd.files" && [ "$exe" != /usr/bin/tini ]; then
					bad "$inst runs $exe, which nothing installs"
				fi
			fi ;;
		RUN)
			for p in $(grep -oE '(packaging|scripts|systemd)/[A-Za-z0-9_./-]+' <<<"$args"); do
				[ -e "$src/$p" ] || bad "RUN uses $p, which is not in the tree"
			done ;;
		esac
		lineno=$lineno_save logical=""
	done <"$file"
	[ -z "$logical" ] || bad "ends inside a continued line"
	[ -n "$first" ] || bad "no instructions"
	echo "${file#"$src"/}: ${#stages[@]} named stage(s), checked"
done

# The CPU image builds with Debian 12's packages: the ones it installs to
# build must be ones scripts/setup installs (the list CI builds with).
cpu=$src/packaging/container/Containerfile.cpu
setup_pkgs=$(sed -n '/^pkgs=(/,/^[^#]*)/p' "$src/scripts/setup" | sed 's/#.*//' | tr -s ' ()' '\n' | grep -E '^[a-z0-9][a-z0-9.+-]+$')
for p in $(sed -n '/^FROM .* AS build/,/^FROM /p' "$cpu" | grep -oE '\blib[a-z0-9.+-]+-dev\b' | sort -u); do
	grep -qx "$p" <<<"$setup_pkgs" || { echo "$cpu installs $p, which scripts/setup does not"; status=1; }
done
exit $status
