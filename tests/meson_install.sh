#!/usr/bin/env bash
# tests/meson_install.sh BUILD — `meson install` of BUILD into a staging
# root, twice: the four binaries, both units naming this install's bindir
# and docdir (files that exist in the stage), sysusers and tmpfiles entries
# under <prefix>/lib, the docs and drop-in examples, and
# /etc/bertd/bertd.conf, which the second install, over an operator's
# edited file, must leave alone. It must never install outside the stage.
set -uo pipefail
build=$(cd "$1" && pwd)
fail() { echo "FAIL: $*"; exit 1; }
opt() { meson introspect "$build" --buildoptions | jq -r --arg n "$1" '.[] | select(.name == $n) | .value'; }
command -v jq >/dev/null || { echo "SKIP: jq is not installed"; exit 77; }
prefix=$(opt prefix) bindir=$(opt bindir) datadir=$(opt datadir)
stage=$(mktemp -d "$build/meson-install-test.XXXXXX")
trap 'rm -rf "$stage"' EXIT
DESTDIR= meson install -C "$build" --no-rebuild --destdir "$stage" >"$stage.log" 2>&1 ||
	fail "meson install: $(tail -n 20 "$stage.log")"
rm -f "$stage.log"
p=$stage$prefix
for f in "$bindir/bertd" "$bindir/bertd-worker" "$bindir/bertd-loader" "$bindir/bertd-prepare"; do
	[ -x "$p/$f" ] || fail "no $prefix/$f"
done
for f in lib/sysusers.d/bertd.conf lib/tmpfiles.d/bertd.conf "$datadir/doc/bertd/README.md" \
	"$datadir/doc/bertd/docs/install.md" "$datadir/doc/bertd/examples/bertd.conf" \
	"$datadir/doc/bertd/examples/bertd.service.d/data-roots.conf.example"; do
	[ -f "$p/$f" ] || fail "no $prefix/$f"
done
for unit in bertd.service bertd-nvidia-devices.service; do
	u=$p/lib/systemd/system/$unit
	[ -f "$u" ] || fail "no $prefix/lib/systemd/system/$unit"
	doc=$(sed -n 's#^Documentation=file://##p' "$u")
	[ -n "$doc" ] && [ -f "$stage$doc" ] || fail "$unit: Documentation= names $doc, which the install lacks"
done
exe=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$p/lib/systemd/system/bertd.service")
[ "$exe" = "$prefix/$bindir/bertd" ] && [ -x "$stage$exe" ] || fail "bertd.service: ExecStart=$exe, not $prefix/$bindir/bertd"
conf=$stage/etc/bertd/bertd.conf
[ -f "$conf" ] || fail "no /etc/bertd/bertd.conf"
echo 'port = 9999   # the operator changed it' >>"$conf"
edited=$(sha256sum <"$conf")
DESTDIR= meson install -C "$build" --no-rebuild --destdir "$stage" >/dev/null 2>&1 || fail "second meson install"
[ "$(sha256sum <"$conf")" = "$edited" ] || fail "a second meson install overwrote /etc/bertd/bertd.conf"
echo "meson install ($prefix): binaries, units (ExecStart=$exe), sysusers, tmpfiles, config (kept on reinstall), docs"
