#!/bin/bash
# oldbin_build — builds bertd, bertd-worker, bertd-loader and bertd-prepare
# of an earlier commit of this repository, for test_oldbin (a job started by
# that bertd is adopted by this tree's). Usage:
#   oldbin_build.sh SRCROOT COMMIT OUTDIR STAMP
# The source comes from `git archive COMMIT` (the repository is only read);
# it is configured CPU-only without -Werror (an older tree is not held to
# a newer compiler's warnings) and only the four programs are built, with
# $CC as this build's compiler command (ccache when it is). The programs
# (bertd at the build's root, the others linked beside it) are copied to
# OUTDIR/bin. With BERTD_OLDBIN_CACHE set in the environment (a
# directory several build trees share, e.g. ./build and ./build-asan), the
# commit is built once, in $BERTD_OLDBIN_CACHE/COMMIT, and OUTDIR/bin is a
# link to its programs.
# STAMP gets one line: "ok COMMIT", "skip: why" (no git history: a source
# tarball, or a shallow clone) or "fail: why"; the script itself exits 0
# unless it cannot write STAMP, so a missing history never fails the build,
# only the test reads the verdict. Build output goes to the build
# directory's build.log.
set -u
src=$1 commit=$2 out=$3 stamp=$4
mkdir -p "$out"
verdict() { printf '%s\n' "$1" > "$stamp.tmp" && mv "$stamp.tmp" "$stamp"; exit 0; }

top=$(git -C "$src" rev-parse --show-toplevel 2>/dev/null)
if [ -z "$top" ] || [ "$(cd "$top" && pwd -P)" != "$(cd "$src" && pwd -P)" ]; then
	verdict "skip: $src is not a git checkout (a source tarball has no history to build commit $commit from)"
fi
if ! git -C "$src" cat-file -e "$commit^{commit}" 2>/dev/null; then
	if [ "$(git -C "$src" rev-parse --is-shallow-repository 2>/dev/null)" = true ]; then
		verdict "skip: $src is a shallow clone without commit $commit (git fetch --unshallow)"
	fi
	verdict "fail: commit $commit is not in $src's history"
fi

# Builds the commit into dir (dir/bin the programs) unless done before.
build_in() {
	local dir=$1
	if [ -f "$dir/commit" ] && [ "$(cat "$dir/commit")" = "$commit" ] && [ -x "$dir/bin/bertd-prepare" ]; then
		return 0
	fi
	rm -rf "$dir/src" "$dir/build" "$dir/bin" "$dir/commit"
	mkdir -p "$dir/src" "$dir/bin"
	local log=$dir/build.log start
	start=$(date +%s)
	{
		git -C "$src" archive --format=tar "$commit" | tar -x -C "$dir/src" &&
		meson setup "$dir/build" "$dir/src" -Dcuda=disabled -Dwerror=false -Dgloo=disabled -Dshared_data=none &&
		ninja -C "$dir/build" bertd bertd-worker bertd-loader bertd-prepare &&
		(cd "$dir/build" && cp -L bertd bertd-worker bertd-loader bertd-prepare "$dir/bin/")
	} > "$log" 2>&1 || verdict "fail: building commit $commit did not succeed (see $log)"
	echo "built commit $commit in $(($(date +%s) - start)) s" >> "$log"
	echo "$commit" > "$dir/commit"
}

if [ -n "${BERTD_OLDBIN_CACHE:-}" ]; then
	mkdir -p "$BERTD_OLDBIN_CACHE" || verdict "fail: cannot make BERTD_OLDBIN_CACHE=$BERTD_OLDBIN_CACHE"
	exec 9> "$BERTD_OLDBIN_CACHE/.lock" && flock 9 # two trees building at once: one builds, one waits
	build_in "$BERTD_OLDBIN_CACHE/$commit"
	rm -rf "$out/bin" "$out/src" "$out/build" "$out/commit"
	ln -s "$BERTD_OLDBIN_CACHE/$commit/bin" "$out/bin"
else
	[ -L "$out/bin" ] && rm -f "$out/bin" # from a build with the cache
	build_in "$out"
fi
verdict "ok $commit"
