#!/usr/bin/env bash
# tests/systemd_pid1.sh SRC BUILD — bertd.service under a real systemd as
# PID 1: a clean Debian 12 root (package_deb's, tests/package_lib.sh, with
# systemd and dbus added; cached) is booted in PID, mount, network, UTS,
# IPC and cgroup namespaces of its own, pivot_root'ed into, with a fresh
# cgroup2 hierarchy (a child of this test's cgroup) that its systemd
# owns; the Debian package is installed there with dpkg, as an admin
# would, and the unit driven with systemctl while a small CPU job trains
# (curl in the root's network):
#   start: READY=1 ends it, WATCHDOG=1 pings reach systemd;
#   restart: the old daemon asks systemd over D-Bus, sees a restart, leaves
#     the job running and exits 5; the new one adopts it: same worker and
#     loader pids, the job keeps stepping, 0 restarts; its batch rings in
#     /dev/shm (RemoveIPC=no) and /run/bertd (RuntimeDirectoryPreserve=)
#     are still there;
#   reload: SIGHUP (ExecReload=, RELOADING=1 ... READY=1): a lowered
#     max_body_bytes takes effect (413), same daemon, same worker;
#   stop: the job is checkpointed and stopped, bertd exits 0, ExecStopPost=
#     kills a stray process put into the unit's cgroup, no process of the
#     unit is left (its cgroup empty, none in the root's PID namespace);
#   start: the job resumes from that checkpoint and completes, 0 restarts.
# The job's batches are slowed (profiler.simulate_data_delay_ms) so that
# it cannot finish before the checks are done; it fails, naming that,
# if it does. Exit 77 (skip) with the reason where systemd cannot boot here
# (not root, no cgroup2 hierarchy, a namespace or mount refused) or a tool
# or the Debian mirror for a first root is missing. It must never touch
# the host's /etc, users, services or cgroups outside its own child.
set -uo pipefail
src=$(cd "$1" && pwd) build=$(cd "$2" && pwd)
skip() { echo "SKIP: $*"; exit 77; }
fail() {
	echo "FAIL: $*"
	if [ -n "${pid1:-}" ]; then
		echo "--- journal of bertd.service"
		sd journalctl -u bertd --no-pager -o short-monotonic 2>/dev/null | tail -n 60
	elif [ -s "${bootlog:-}" ]; then
		echo "--- boot"; tail -n 20 "$bootlog"
	fi
	exit 1
}
t0=$SECONDS
phase() { echo "[$((SECONDS - t0)) s] $*"; }

[ "$(id -u)" -eq 0 ] || skip "needs root (namespaces, cgroups and mounts to boot systemd)"
for t in mmdebstrap dpkg-deb dpkg-shlibdeps unshare nsenter pivot_root curl jq meson ninja tar; do
	command -v $t >/dev/null || skip "$t is not installed (scripts/setup installs mmdebstrap, dpkg-dev, curl, jq)"
done
# The cgroup2 hierarchy this test's own cgroup is in (unified, or the
# unified half of a hybrid set-up); systemd in the root gets a child of it.
cg2=
for b in /sys/fs/cgroup /sys/fs/cgroup/unified; do
	[ "$(stat -f -c %T "$b" 2>/dev/null)" = cgroup2fs ] && { cg2=$b; break; }
done
[ -n "$cg2" ] || skip "no cgroup2 hierarchy mounted (systemd in a container needs one)"
mycg=$(sed -n 's/^0:://p' /proc/self/cgroup)
cg=$cg2${mycg%/}/bertd-systemd-pid1-$$
mkdir "$cg" 2>/dev/null || skip "cannot make a child cgroup $cg: $(mkdir "$cg" 2>&1)"

work=$build/package
mkdir -p "$work"
. "$src/tests/package_lib.sh"

root=$work/sdroot
bootlog=$work/sdboot.log
boot=""   # the unshare process; pid1: systemd, as this PID namespace sees it
pid1=""
cleanup() {
	# Killing the root's PID 1 kills every process of its PID namespace; the
	# mounts went with its mount namespace.
	if [ -n "$pid1" ]; then kill -KILL "$pid1" 2>/dev/null; fi
	if [ -n "$boot" ]; then
		[ -n "$pid1" ] || kill -KILL "$boot" 2>/dev/null
		wait "$boot" 2>/dev/null
	fi
	# a cgroup can be removed once its last task is gone, which can trail
	# PID 1's end by a moment
	for _ in $(seq 100); do
		find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
		[ -d "$cg" ] || break
		sleep 0.1
	done
	rm -rf --one-file-system "$root"
}
trap cleanup EXIT

# ---- the package and the root ----
pkg_deb "$src" "$build" "$work"
echo "package: $PKG_DEB"
pkg_root_tar "$work" "$PKG_DEB" systemd,systemd-sysv,dbus
phase "root: $PKG_TAR"
rm -rf --one-file-system "$root"
mkdir -p "$root"
tar -C "$root" -xf "$PKG_TAR" || fail "unpacking $PKG_TAR"
cp "$PKG_DEB" "$root/root/"   # (/tmp is emptied at boot)
data=$root/var/lib/bertd/data
mkdir -p "$data"
cp -rL /usr/share/common-licenses "$data/"
cp "$src/tests/data/bert-base-uncased-vocab.txt" "$data/"

# ---- boot: systemd as PID 1 of namespaces of its own ----
# Inside the new namespaces: the root becomes a mount point and then /
# (pivot_root, not chroot: systemd's PrivateUsers= cannot make a user
# namespace from a chroot), with /proc, a read-only /sys, a cgroup2
# mount showing only the child cgroup (the cgroup namespace's root), a
# small /dev and tmpfs /run and /dev/shm, as systemd-nspawn sets them up.
# container= tells systemd it is in a container.
# shellcheck disable=SC2016
(
	echo "$BASHPID" >"$cg/cgroup.procs" || exit 1
	exec unshare --pid --mount --uts --ipc --net --cgroup --fork bash -c '
		set -e
		root=$1
		mount --make-rprivate /
		mount --bind "$root" "$root"
		mount -t proc proc "$root/proc"
		mount --rbind /sys "$root/sys"
		mount -o remount,bind,ro "$root/sys"
		mount -t cgroup2 cgroup2 "$root/sys/fs/cgroup"
		mount -t tmpfs -o mode=755 tmpfs "$root/dev"
		for d in null zero full random urandom tty; do
			touch "$root/dev/$d"; mount --bind "/dev/$d" "$root/dev/$d"
		done
		mkdir -p "$root/dev/pts" "$root/dev/shm"
		mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts"
		ln -s pts/ptmx "$root/dev/ptmx"
		mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
		mount -t tmpfs -o mode=755 tmpfs "$root/run"
		hostname bertd-systemd-test
		cd "$root"
		pivot_root . .
		umount -l .
		exec env -i container=bertd-test /lib/systemd/systemd --log-target=journal-or-kmsg' bash "$root"
) >"$bootlog" 2>&1 &
boot=$!
for _ in $(seq 300); do
	pid1=$(cat "/proc/$boot/task/$boot/children" 2>/dev/null | tr -d ' ')
	[ -n "$pid1" ] && [ "$(cat "/proc/$pid1/comm" 2>/dev/null)" = systemd ] && break
	kill -0 "$boot" 2>/dev/null || skip "systemd cannot be booted here: $(tail -n 3 "$bootlog")"
	pid1=""
	sleep 0.1
done
[ -n "$pid1" ] || fail "systemd did not start in the root"
sd() { nsenter -t "$pid1" -a -w "$@"; }
# systemctl talks to PID 1 over /run/systemd/private, made early in its boot
for _ in $(seq 300); do
	sd test -S /run/systemd/private && break
	kill -0 "$pid1" 2>/dev/null || fail "systemd exited in the root"
	sleep 0.1
done
state=$(sd systemctl is-system-running --wait 2>&1)
case $state in
running) ;;
degraded) echo "the root's systemd is degraded:"; sd systemctl --failed --no-pager ;;
*) fail "the root's systemd: $state" ;;
esac
phase "systemd $(sd systemctl --version | sed -n '1s/^systemd //p') is PID 1 in the root ($state)"

# ---- install, configure, start ----
sd dpkg -i "/root/${PKG_DEB##*/}" >"$work/sd-dpkg.log" 2>&1 || fail "dpkg -i: $(cat "$work/sd-dpkg.log")"
sd chown -R bertd:bertd /var/lib/bertd/data
[ "$(sd systemctl is-enabled bertd 2>&1)" = disabled ] || fail "the package enabled bertd: $(sd systemctl is-enabled bertd 2>&1)"
sd systemctl start bertd || fail "systemctl start bertd"
[ "$(sd systemctl is-active bertd)" = active ] || fail "bertd is $(sd systemctl is-active bertd) after start"
prop() { sd systemctl show -p "$1" --value bertd; }
phase "bertd.service active (READY=1), main pid $(prop MainPID) (in the root), watchdog $(prop WatchdogUSec)"

conf=/etc/bertd/bertd.conf
port=$(sd sed -n 's/^port *= *//p' $conf)
url=http://127.0.0.1:$port
token=$(cat "$root/var/lib/bertd/token") || fail "no token file"
api() { nsenter -t "$pid1" -n curl -sS --max-time 30 -H "Authorization: Bearer $token" "$@"; }
job_get() { api "$url/v1/jobs/$job"; }
job_field() { job_get | jq -r "$1"; }

pkg_dataset_licenses "$url"

# Each batch takes at least 100 ms (the loader sleeps), so the job cannot
# end in less than 20 s, whatever the machine: the restart, reload and stop
# below take a few seconds (5 here under load); a job that ended before
# them fails the test, saying so.
steps=200
job=$(api -H 'Content-Type: application/json' "$url/v1/jobs" -d '{"dataset": "licenses",
	"model": {"preset": "bert-tiny", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
	          "intermediate_size": 64, "max_position_embeddings": 64},
	"profiler": {"simulate_data_delay_ms": 100},
	"training_args": {"per_device_train_batch_size": 8, "max_seq_length": 32, "max_steps": '$steps',
	                  "logging_steps": 2, "save_steps": 1000, "dataloader_num_workers": 1, "seed": 7}}' | jq -r .id)
[ -n "$job" ] && [ "$job" != null ] || fail "job submit refused"

# step_above N: waits until the job's step is above N (or it ends); prints it
step_above() {
	local s=0 st
	for _ in $(seq 1200); do
		read -r st s < <(job_get | jq -r '"\(.state) \(.progress.step // 0)"')
		s=${s:-0}
		[ "$s" -gt "$1" ] && break
		case $st in completed|failed|canceled) fail "job $job ended ($st at step $s) before the checks were done" ;; esac
		sleep 0.2
	done
	[ "$s" -gt "$1" ] || fail "job $job did not get past step $1 (at $s, $(job_field .state))"
	echo "$s"
}
# the unit's processes, as pids of this PID namespace, with their names
# (its cgroup as systemd named it while active; systemd removes it once
# empty after a stop)
unitcg=$cg$(prop ControlGroup)
[ "$unitcg" != "$cg" ] || fail "systemd names no cgroup for the active bertd.service"
unit_procs() {
	local f=$unitcg/cgroup.procs p
	[ -f "$f" ] || return 0
	while read -r p; do echo "$p $(cat "/proc/$p/comm" 2>/dev/null)"; done <"$f" | sort -n
}
workers() { unit_procs | awk '$2 == "bertd-worker" || $2 == "bertd-loader" {print $1}' | paste -sd' ' -; }
rings() { sd find /dev/shm -maxdepth 1 -user bertd -printf '%i %f\n' | sort; }

s=$(step_above 1)
w1=$(workers) main1=$(prop MainPID) rings1=$(rings) run1=$(sd stat -c %i /run/bertd)
[ -n "$w1" ] || fail "no bertd-worker or bertd-loader in the unit's cgroup: $(unit_procs)"
[ -n "$rings1" ] || fail "job $job has no batch rings in /dev/shm"
phase "job $job running at step $s; worker and loader pids $w1; $(wc -l <<<"$rings1") ring(s) in /dev/shm"

# ---- restart: the job keeps running under the new daemon ----
sd systemctl restart bertd || fail "systemctl restart bertd"
[ "$(sd systemctl is-active bertd)" = active ] || fail "bertd is $(sd systemctl is-active bertd) after restart"
main2=$(prop MainPID)
[ "$main2" != "$main1" ] || fail "the restart did not start a new bertd (main pid $main1)"
jr=$(sd journalctl -u bertd -o cat --no-pager _PID="$main1")
grep -q "systemd job of bertd.service: restart" <<<"$jr" ||
	fail "the old bertd did not learn from systemd that its stop was a restart"
grep -q "restart: jobs left running" <<<"$jr" || fail "the old bertd did not leave the jobs running"
[ "$(prop NRestarts)" = 0 ] || fail "systemd counts $(prop NRestarts) automatic restarts"
[ "$(job_field .state)" = running ] || fail "job $job is $(job_field .state) after the restart"
s2=$(step_above "$(job_field .progress.step)")
[ "$(workers)" = "$w1" ] || fail "worker and loader pids $w1 before the restart, $(workers) after"
[ "$(rings)" = "$rings1" ] || fail "the batch rings changed across the restart: before $rings1, after $(rings)"
[ "$(sd stat -c %i /run/bertd)" = "$run1" ] || fail "/run/bertd was made again by the restart"
[ "$(job_field .restart_count)" = 0 ] || fail "job $job restart_count $(job_field .restart_count) after the restart"
api "$url/v1/jobs/$job/events" | grep -q 'daemon restarted; adopted the running attempt' ||
	fail "job $job has no adoption event"
phase "restart: new main pid $main2, the old one saw a restart and exited 5; job adopted, same worker and loader ($w1), stepping (step $s2), 0 restarts"

# ---- reload: max_body_bytes lowered takes effect; nothing restarts ----
# a 2 KB submit naming no dataset: refused for that (4xx) before, as too
# large (413) after max_body_bytes went down to its least, 1024
big=$(printf '{"dataset": "no-such-dataset", "notes": "%02000d"}' 0)
code=$(api -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' "$url/v1/jobs" -d "$big")
case $code in 4??) [ "$code" != 413 ] ;; *) false ;; esac || fail "a 2 KB submit got $code before the reload"
sd sed -i 's/^max_body_bytes *=.*/max_body_bytes = 1024/' $conf
sd systemctl reload bertd || fail "systemctl reload bertd"
# systemd 252 ends the reload job when ExecReload='s kill returns; the
# daemon's RELOADING=1 ... READY=1 may follow: wait for its journal line
# (the status line says "configuration reloaded" only until its next
# refresh, every 5 s).
reloaded=""
for _ in $(seq 300); do
	reloaded=$(sd journalctl -u bertd -o cat --no-pager _PID="$main2" | grep 'reload: configuration reloaded')
	[ -n "$reloaded" ] && break
	sleep 0.1
done
grep -q 'reload: configuration reloaded (.*max_body_bytes' <<<"$reloaded" ||
	fail "bertd did not log the reload of max_body_bytes: '$reloaded'"
code=$(api -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' "$url/v1/jobs" -d "$big")
[ "$code" = 413 ] || fail "a 2 KB submit after lowering max_body_bytes to 1024 and reloading: $code, not 413"
[ "$(prop MainPID)" = "$main2" ] || fail "the reload replaced bertd ($main2 -> $(prop MainPID))"
[ "$(workers)" = "$w1" ] || fail "the reload changed the worker and loader pids: $w1 -> $(workers)"
# READY=1 ends the reloading state that RELOADING=1 may have started
for _ in $(seq 300); do
	[ "$(sd systemctl is-active bertd)" = active ] && break
	sleep 0.1
done
[ "$(sd systemctl is-active bertd)" = active ] || fail "bertd is $(sd systemctl is-active bertd) after the reload"
s3=$(step_above "$s2")
phase "reload: max_body_bytes 1024 in force (413), same bertd and worker, job at step $s3"

# the watchdog (WatchdogSec=): systemd's time of the last WATCHDOG=1 moves
# on (bertd pings every second; WatchdogSec=30s would kill it after 30)
wd1=$(prop WatchdogTimestampMonotonic) wd2=$wd1
for _ in $(seq 300); do
	wd2=$(prop WatchdogTimestampMonotonic)
	[ "$wd2" != "$wd1" ] && break
	sleep 0.1
done
[ "$wd2" -gt "$wd1" ] 2>/dev/null || fail "no WATCHDOG=1 reached systemd in 30 s (last at $wd1 us)"

# ---- stop: checkpointed and stopped, nothing left ----
# A process of the bertd user in the unit's cgroup that bertd does not know
# of (what a lost grandchild would be): ExecStopPost= must kill it after
# the clean stop, as it must not after the restart above.
# shellcheck disable=SC2016
sd sh -c 'echo $$ >"/sys/fs/cgroup$1/cgroup.procs" && exec setpriv --reuid=bertd --regid=bertd --init-groups sleep 600' \
	sh "$(prop ControlGroup)" &
stray=$!
for _ in $(seq 300); do
	unit_procs | grep -q ' sleep$' && break
	kill -0 "$stray" 2>/dev/null || fail "cannot put a stray process into the unit's cgroup"
	sleep 0.1
done
unit_procs | grep -q ' sleep$' || fail "the stray process is not in the unit's cgroup: $(unit_procs)"
sd systemctl stop bertd || fail "systemctl stop bertd"
[ "$(sd systemctl is-active bertd)" = inactive ] || fail "bertd is $(sd systemctl is-active bertd) after stop"
[ "$(prop Result)" = success ] || fail "the stop's result is $(prop Result)"
[ "$(prop ExecMainStatus)" = 0 ] || fail "bertd exited $(prop ExecMainStatus) on a stop, not 0"
left=$(unit_procs)
[ -z "$left" ] || fail "processes left in the unit's cgroup after the stop: $left"
wait "$stray" 2>/dev/null
[ $? = 137 ] || fail "the stray process in the unit's cgroup was not killed (SIGKILL) by ExecStopPost="
left=$(sd sh -c 'for p in /proc/[0-9]*; do c=$(cat $p/comm 2>/dev/null); case $c in bertd*) echo "${p#/proc/} $c";; esac; done')
[ -z "$left" ] || fail "bertd processes left in the root after the stop: $left"
jr=$(sd journalctl -u bertd -o cat --no-pager _PID="$main2")
grep -q "systemd job of bertd.service: stop" <<<"$jr" || fail "the daemon did not learn from systemd that its stop was a stop"
[ -z "$(rings)" ] || fail "batch rings left in /dev/shm after the stop: $(rings)"
phase "stop: bertd exited 0 (watchdog pinged), ExecStopPost= killed a stray, no process left in the unit or the root, no ring in /dev/shm"

# ---- start: the job resumes from its stop checkpoint and completes ----
sd systemctl start bertd || fail "systemctl start bertd after the stop"
ck=$(job_field .last_checkpoint.step)
[ "$ck" -ge "$s3" ] 2>/dev/null || fail "job $job's last checkpoint is at step $ck, not at or after $s3 (its step before the stop)"
for _ in $(seq 2400); do
	state=$(job_field .state)
	case $state in completed|failed|canceled) break ;; *) sleep 0.5 ;; esac
done
[ "$state" = completed ] || fail "job $job: $(job_get | jq -c '{state, failure_reason}')"
[ "$(job_field .progress.step)" = "$steps" ] || fail "job $job completed at step $(job_field .progress.step), not $steps"
[ "$(job_field .restart_count)" = 0 ] || fail "job $job restart_count $(job_field .restart_count)"
api "$url/v1/jobs/$job/events" | grep -q "resuming from checkpoint at step $ck" ||
	fail "job $job did not resume from its stop checkpoint (step $ck): $(api "$url/v1/jobs/$job/events" | tail -n 5)"
phase "start: job $job resumed from its stop checkpoint (step $ck) and completed $steps steps, 0 restarts"
exit 0
