#!/usr/bin/env bash
# tests/package_deb.sh SRC BUILD — the Debian package, built and installed
# as a user would: packaging/deb/mkdeb makes bertd_*.deb from a --prefix=/usr
# build of the tree (BUILD/package/build-usr, product targets only), dpkg
# installs it into a clean Debian 12 root (mmdebstrap, minbase plus the
# package's dependencies; the root is cached as a tarball under
# BUILD/package keyed by those dependencies, so only a first run downloads),
# and the installed daemon, started as the user the package created, in a
# chroot in a mount and PID namespace of its own (no systemd as PID 1),
# prepares a dataset and completes a small CPU job driven with curl. When
# BUILD's bertd-worker is a CUDA build, bertd-cuda is made from it too and
# its diversion of the CPU worker checked (installed and removed; nothing
# runs on a GPU). Exit 77 (skip) with the reason when root, a tool or the
# network to the mirror is missing (BERTD_DEBIAN_MIRROR, default
# http://deb.debian.org/debian). It must never touch the host's
# /etc, users or services: everything happens in the root.
set -uo pipefail
src=$(cd "$1" && pwd) build=$(cd "$2" && pwd)
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; [ -n "${log:-}" ] && [ -f "$log" ] && { echo "--- daemon log"; tail -n 40 "$log"; }; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "needs root (dpkg and chroot in the Debian 12 root)"
for t in mmdebstrap dpkg-deb dpkg-shlibdeps unshare chroot curl jq meson ninja tar; do
	command -v $t >/dev/null || skip "$t is not installed (scripts/setup installs mmdebstrap, dpkg-dev, curl, jq)"
done

work=$build/package
mkdir -p "$work"

# ---- the package, from a --prefix=/usr build beside this one ----
. "$src/tests/package_lib.sh"
pkg_deb "$src" "$build" "$work"
deb=$PKG_DEB
echo "package: $deb ($(du -k "$deb" | cut -f1) KiB)"
dpkg-deb -f "$deb" Package Version Depends

# What the package holds, before it is installed anywhere.
contents=$(dpkg-deb -c "$deb" | awk '{print $NF}' | sed 's#^\./#/#')
for f in /usr/bin/bertd /usr/bin/bertd-worker /usr/bin/bertd-loader /usr/bin/bertd-prepare \
	/usr/lib/systemd/system/bertd.service /usr/lib/systemd/system/bertd-nvidia-devices.service \
	/usr/lib/sysusers.d/bertd.conf /usr/lib/tmpfiles.d/bertd.conf /etc/bertd/bertd.conf \
	/usr/share/doc/bertd/README.md /usr/share/doc/bertd/docs/install.md \
	/usr/share/doc/bertd/examples/bertd.service.d/remote-listen.conf.example; do
	grep -qx "$f" <<<"$contents" || fail "the package lacks $f"
done
[ "$(dpkg-deb -I "$deb" conffiles)" = /etc/bertd/bertd.conf ] || fail "conffiles is not /etc/bertd/bertd.conf"
if grep -Eiq 'cuda|cublas|nccl|nvidia' <<<"$(dpkg-deb -f "$deb" Depends)"; then
	fail "the CPU package depends on NVIDIA packages: $(dpkg-deb -f "$deb" Depends)"
fi

# ---- a clean Debian 12 root with the package's dependencies ----
pkg_root_tar "$work" "$deb"
tarball=$PKG_TAR
root=$work/root
ns=""
cleanup() {
	if [ -n "$ns" ]; then kill -KILL "$ns" 2>/dev/null; wait "$ns" 2>/dev/null; fi
	# the namespace's mounts (proc, /dev) went with it; nothing of the host is below
	rm -rf --one-file-system "$root"
}
trap cleanup EXIT
rm -rf --one-file-system "$root"
mkdir -p "$root"
tar -C "$root" -xf "$tarball" || fail "unpacking $tarball"

# ---- dpkg -i, as an admin would ----
cp "$deb" "$root/tmp/"
chroot "$root" dpkg -i "/tmp/${deb##*/}" >"$work/dpkg.log" 2>&1 || fail "dpkg -i: $(cat "$work/dpkg.log")"
cat "$work/dpkg.log"
chroot "$root" getent passwd bertd >/dev/null || fail "postinst made no user bertd"
# names as the root knows them (stat in the chroot)
sdir=$(chroot "$root" stat -c '%U %a' /var/lib/bertd)
[ "$sdir" = "bertd 700" ] || fail "/var/lib/bertd is $sdir, not bertd 700"
# The tmpfiles entry as systemd would apply it at boot (host's
# systemd-tmpfiles on the root): it must not undo the 0710 bertd gives the
# state dir for a shared_group.
if command -v systemd-tmpfiles >/dev/null; then
	chmod 0710 "$root/var/lib/bertd"
	systemd-tmpfiles --root="$root" --create "$root/usr/lib/tmpfiles.d/bertd.conf" ||
		fail "systemd-tmpfiles refuses /usr/lib/tmpfiles.d/bertd.conf"
	sdir=$(chroot "$root" stat -c '%U %a' /var/lib/bertd)
	[ "$sdir" = "bertd 710" ] || fail "systemd-tmpfiles changed /var/lib/bertd to $sdir"
	chmod 0700 "$root/var/lib/bertd"
fi
unit=$root/usr/lib/systemd/system/bertd.service
exec_bin=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$unit")
[ "$exec_bin" = /usr/bin/bertd ] && [ -x "$root$exec_bin" ] || fail "the unit's ExecStart names $exec_bin"
doc=$(sed -n 's#^Documentation=file://##p' "$unit")
[ -f "$root$doc" ] || fail "the unit's Documentation= names $doc, which the package does not install"
enabled=$(find "$root/etc/systemd" -name 'bertd*' 2>/dev/null)
[ -z "$enabled" ] || fail "the package enabled something: $enabled"
cmp -s "$root/etc/bertd/bertd.conf" "$src/systemd/bertd.conf" || fail "/etc/bertd/bertd.conf is not systemd/bertd.conf"

# ---- bertd-cuda's diversion (when this build has a CUDA worker) ----
cdeb=$PKG_CDEB
if [ -n "$cdeb" ]; then
	cp "$cdeb" "$root/tmp/"
	cpu_sum=$(sha256sum <"$root/usr/bin/bertd-worker")
	# its CUDA libraries are not in this root (--force-depends): the files only
	chroot "$root" dpkg -i --force-depends "/tmp/${cdeb##*/}" >>"$work/dpkg.log" 2>&1 ||
		fail "dpkg -i bertd-cuda: $(tail -n 5 "$work/dpkg.log")"
	[ "$(sha256sum <"$root/usr/bin/bertd-worker.cpu")" = "$cpu_sum" ] || fail "bertd-cuda did not divert the CPU worker"
	grep -q 'NEEDED.*libcudart\.' <<<"$(readelf -d "$root/usr/bin/bertd-worker")" || fail "bertd-cuda's worker is not the CUDA one"
	chroot "$root" dpkg -r bertd-cuda >>"$work/dpkg.log" 2>&1 || fail "dpkg -r bertd-cuda"
	[ "$(sha256sum <"$root/usr/bin/bertd-worker")" = "$cpu_sum" ] && [ ! -e "$root/usr/bin/bertd-worker.cpu" ] ||
		fail "removing bertd-cuda did not put the CPU worker back"
	echo "bertd-cuda: diverts the CPU worker and puts it back on removal"
else
	echo "skipped: bertd-cuda ($build/worker/bertd-worker is not a CUDA build)"
fi

# ---- the installed daemon, as the user bertd, without systemd ----
data=$root/var/lib/bertd/data
mkdir -p "$data"
cp -rL /usr/share/common-licenses "$data/"
cp "$src/tests/data/bert-base-uncased-vocab.txt" "$data/"
chroot "$root" chown -R bertd:bertd /var/lib/bertd/data
log=$work/daemon.log
# PID 1 of the namespace is this bash: killing unshare (--kill-child) kills
# it, and with it every process of the namespace (daemon, workers, loaders).
unshare --mount --pid --fork --kill-child bash -c '
	root=$1
	mount -t proc proc "$root/proc" &&
	mount --rbind /dev "$root/dev" &&
	mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm" || exit 1
	chroot --userspec=bertd:bertd "$root" /usr/bin/bertd --config /etc/bertd/bertd.conf \
		--state-dir /var/lib/bertd --port 0 --devices cpu --cpu-slots 1 &
	wait $!' bash "$root" >"$log" 2>&1 &
ns=$!
addr_file=$root/var/lib/bertd/bertd.addr
for _ in $(seq 600); do
	[ -s "$addr_file" ] && break
	kill -0 "$ns" 2>/dev/null || fail "the installed bertd exited at start"
	sleep 0.1
done
[ -s "$addr_file" ] || fail "the installed bertd wrote no bertd.addr"
url=$(cat "$addr_file")
token=$(cat "$root/var/lib/bertd/token")
api() { curl -sS --max-time 30 -H "Authorization: Bearer $token" "$@"; }
echo "installed bertd at $url: $(api "$url/v1/version" | jq -c '{version}')"

pkg_dataset_licenses "$url"

job=$(api -H 'Content-Type: application/json' "$url/v1/jobs" -d '{"dataset": "licenses",
	"model": {"preset": "bert-tiny", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
	          "intermediate_size": 64, "max_position_embeddings": 64},
	"training_args": {"per_device_train_batch_size": 8, "max_seq_length": 32, "max_steps": 10,
	                  "logging_steps": 5, "dataloader_num_workers": 1, "seed": 7}}' | jq -r .id)
[ -n "$job" ] && [ "$job" != null ] || fail "job submit refused"
for _ in $(seq 2400); do
	state=$(api "$url/v1/jobs/$job" | jq -r .state)
	case $state in completed|failed|canceled) break ;; *) sleep 0.5 ;; esac
done
[ "$state" = completed ] || fail "job $job: $(api "$url/v1/jobs/$job" | jq -c '{state, failure_reason}')"
step=$(api "$url/v1/jobs/$job" | jq -r .progress.step)
[ "$step" = 10 ] || fail "job $job completed at step $step, not 10"
api -o "$work/export.tar" "$url/v1/jobs/$job/export"
grep -q 'model.safetensors$' <<<"$(tar -tf "$work/export.tar")" || fail "the export of job $job has no model.safetensors"
# The job's files belong to the user the package created.
owner=$(chroot "$root" stat -c %U "/var/lib/bertd/jobs/$job" 2>/dev/null || echo none)
[ "$owner" = bertd ] || fail "the job directory belongs to $owner, not bertd"
echo "job $job: completed 10 steps in the installed package (Debian 12 root, user bertd, no systemd)"
exit 0
