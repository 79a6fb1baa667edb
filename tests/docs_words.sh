#!/bin/bash
# docs_words — the docs and the code's comments speak of the product, not of
# how it was developed: no issue numbers, branch names, work sessions, or a
# design document the repository does not hold.
#
# Usage: docs_words.sh SOURCE_ROOT
#
# Docs (docs/, README.md): "DESIGN.md", "issue #N" / "(#N)", "(branch x)",
# "session(s)", "engineer(s)". Code, tests, scripts and build files: the
# first three (a "session" there can be the kernel's, /proc/PID/stat).
# Exit 0 clean, 1 listing each line found.
set -u
cd "$1" || exit 1
history='DESIGN\.md|[Ii]ssues? #?[0-9]+|\(#[0-9]+[),:;]|\(branch [a-z0-9_-]+\)|[Ii]ssue goal'
docs_only='\bsessions?\b|\bengineers?\b'
found=0
out=$(grep -rnIE "$history|$docs_only" docs README.md 2>/dev/null)
if [ -n "$out" ]; then
	echo "$out"
	found=1
fi
out=$(grep -rnIE "$history" api common daemon kernels loader worker bench scripts systemd meson.build \
	meson_options.txt schema.sql tests --exclude-dir=data --exclude-dir=fixtures \
	--exclude=docs_words.sh 2>/dev/null)
if [ -n "$out" ]; then
	echo "$out"
	found=1
fi
[ $found -eq 0 ] && echo "docs_words: clean"
exit $found
