#!/usr/bin/env bash
# A private Slurm cluster of namespaced nodes on this host, for the
# multi-node fault tests (docs/multinode.md, "Namespaced nodes"). Each node
# n1..nN is its own network namespace (a veth to a bridge), its own UTS
# namespace (hostname nK) and, around its slurmd and every task it starts,
# its own mount namespace with a fresh tmpfs on /dev/shm and on /tmp (the
# directory $BERTD_NS_SHARED, default DIR, stays visible at its path whether
# under /tmp or not: it is the cluster's shared filesystem; DIR must be in it). munged, slurmctld, and whoever enters DIR/ns/head
# (the test process, so bertd and srun) live in the head namespace. The
# bridge and the fault rules (nftables, tbf) live in a switch namespace of
# their own. Nothing here sends a packet outside these namespaces: the
# addresses (10.213.77.0/24) exist only inside them, the root namespace has
# no route to them and is never used to reach them.
#
#   multinode_ns.sh check [delay]             exit 0, or 77 with why (root, nft, Slurm;
#                                             with delay: what the delay fault needs)
#   multinode_ns.sh start DIR NNODES [shared-shm]   prints DIR/slurm.conf; OWNER pid
#                                             in $BERTD_NS_OWNER (default: the caller);
#                                             $BERTD_NS_TASK_ENV ("NAME=value ...") goes
#                                             into every task (Slurm's TaskProlog)
#   multinode_ns.sh stop DIR                  everything down (idempotent)
#   multinode_ns.sh cut DIR NODE | heal DIR NODE     NODE's link down / up
#   multinode_ns.sh partition DIR A B         drop every frame between A and B only
#   multinode_ns.sh loss DIR NODE PCT         drop PCT% of NODE's frames, both ways
#   multinode_ns.sh rate DIR NODE KBIT        tbf on NODE's link (towards NODE)
#   multinode_ns.sh delay DIR NODE MS         hold each packet into and out of NODE
#                                             MS ms (a round trip through NODE's link
#                                             gains 2 x MS); needs $BERTD_NFQ_DELAY
#   multinode_ns.sh clear DIR                 no partition, loss, rate limit or delay
#   multinode_ns.sh flap DIR NODE DOWN_MS COUNT   COUNT times: down DOWN_MS, up DOWN_MS
#   multinode_ns.sh in DIR NS CMD...          CMD in namespace NS (head, sw, nK)
#
# Teardown is certain: stop removes the namespaces, their processes (every
# process whose network namespace is one of them, stray ranks included),
# the bridge and the nft table (they live and die with the switch
# namespace); a watcher started with the cluster runs stop when the owner
# process ends (killed included); and start first stops the clusters of
# owners that are gone (a registry under /run/bertd-nsnodes).
#
# tc netem is not built into this kernel, so the delay fault is NFQUEUE:
# iptables-legacy rules in the node's network namespace send what crosses
# its eth0 (INPUT and OUTPUT) to queue 0 there, and nfq-delay
# ($BERTD_NFQ_DELAY, tests/integration/nfq_delay.c), run in that namespace,
# holds each packet MS ms and lets it go, in order. iptables-nft would need
# nft's queue support (CONFIG_NFT_QUEUE), which this kernel lacks. The
# helper lives in the node's namespace, so stop kills it with the rest;
# clear removes the rules first, then stops it (it lets what it holds go).
set -u
cmd=${1:?}
PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
self=$(readlink -f "$0")
reg=/run/bertd-nsnodes
net=10.213.77

need() {
	[ "$(id -u)" = 0 ] || { echo "skip: namespaced nodes need root"; exit 77; }
	for b in munged slurmctld slurmd srun sinfo scancel nft ip tc nsenter unshare; do
		command -v "$b" >/dev/null || { echo "skip: $b not installed"; exit 77; }
	done
	unshare -n -u -m --propagation private true 2>/dev/null || { echo "skip: no namespaces here"; exit 77; }
}

ns() { printf '%s/ns/%s' "$dir" "$1"; }
in_ns() { # in_ns NAME CMD...: network (and, for nodes, UTS) namespace NAME
	local n=$1; shift
	if [ -e "$(ns "$n").uts" ]; then
		nsenter --net="$(ns "$n")" --uts="$(ns "$n").uts" -- "$@"
	else
		nsenter --net="$(ns "$n")" -- "$@"
	fi
}
sw() { in_ns sw "$@"; }

# kill_ns NAME [KEEP...]: SIGKILL every process in network namespace NAME
# except the pids KEEP.
kill_ns() {
	local f ino p keep
	f=$(ns "$1"); shift
	[ -e "$f" ] || return 0
	ino=$(stat -L -c %i "$f" 2>/dev/null) || return 0
	for _ in 1 2 3; do
		for p in $(stat -L -c '%i %n' /proc/[0-9]*/ns/net 2>/dev/null | awk -v i="$ino" '$1 == i {split($2, a, "/"); print a[3]}'); do
			keep=0
			for k in "$@"; do [ "$k" = "$p" ] && keep=1; done
			[ $keep = 1 ] || kill -KILL "$p" 2>/dev/null
		done
		sleep 0.2
	done
}

ancestors() {
	local p=$$
	while [ "$p" -gt 1 ] 2>/dev/null; do
		echo "$p"
		p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null) || break
	done
}

stop() {
	[ -d "$dir/ns" ] || { unregister; return 0; }
	local me w
	me=$(ancestors)
	w=$(cat "$dir/watcher.pid" 2>/dev/null)
	[ -n "$w" ] && ! echo "$me" | grep -qx "$w" && kill -KILL "$w" 2>/dev/null
	for f in "$dir"/ns/n*; do
		case $f in *.uts) continue ;; esac
		[ -e "$f" ] && kill_ns "$(basename "$f")"
	done
	# the head: its daemons, and anything else but the caller's own line
	# (a test that entered the head namespace is stopping its cluster)
	kill_ns head $me ${BERTD_NS_OWNER:-}
	kill_ns sw
	for f in "$dir"/ns/*; do while umount "$f" 2>/dev/null; do :; done; done
	while umount "$dir/ns" 2>/dev/null; do :; done
	rm -rf "$dir/ns"
	[ -f "$dir/munged.pid" ] && kill -TERM "$(cat "$dir/munged.pid")" 2>/dev/null
	unregister
}

unregister() {
	for f in "$reg"/*.dir; do
		[ -f "$f" ] && [ "$(sed -n 2p "$f")" = "$dir" ] && rm -f "$f"
	done
	return 0
}

# Clusters whose owner is gone (a killed test): torn down now.
reap_stale() {
	local f owner d
	mkdir -p "$reg"
	for f in "$reg"/*.dir; do
		[ -f "$f" ] || continue
		owner=$(sed -n 1p "$f"); d=$(sed -n 2p "$f")
		kill -0 "$owner" 2>/dev/null && continue
		echo "removing a stale cluster at $d (owner $owner is gone)" >&2
		BERTD_NS_OWNER='' "$self" stop "$d"
		rm -f "$f"
	done
}

mkns() { # mkns NAME [hostname]
	touch "$(ns "$1")"
	unshare --net="$(ns "$1")" true || return 1
	if [ $# -gt 1 ]; then
		touch "$(ns "$1").uts"
		unshare --uts="$(ns "$1").uts" hostname "$2" || return 1
	fi
	in_ns "$1" ip link set lo up
}

# link NAME ADDR: a veth from the bridge (sw side "v<NAME>") into NAME as eth0.
link() {
	sw ip link add "v$1" type veth peer name eth0 netns "$(ns "$1")" &&
		sw ip link set "v$1" master br0 && sw ip link set "v$1" up &&
		in_ns "$1" ip addr add "$2/24" dev eth0 && in_ns "$1" ip link set eth0 up
}

start_node() { # start_node nK: slurmd in nK's namespaces, private /dev/shm and /tmp
	local n=$1 shm=tmpfs
	[ -f "$dir/shared-dir" ] || return 1
	[ -f "$dir/shared-shm" ] && shm=shared
	mkdir -p "$dir/spool/$n"
	# What stays visible at its own path under the private /tmp: the shared
	# directory and the paths in DIR/keep-dirs (the build and source trees,
	# when they live under /tmp), outer ones first.
	setsid nsenter --net="$(ns "$n")" --uts="$(ns "$n").uts" -- \
		unshare -m --propagation private bash -c '
			shm=$1 n=$2 dir=$3; shift 3
			fds=()
			for p in "$@"; do exec {fd}<"$p" || exit 1; fds+=("$fd:$p"); done
			[ "$shm" = tmpfs ] && { mount -t tmpfs -o mode=1777 shm /dev/shm || exit 1; }
			mount -t tmpfs -o mode=1777 tmp /tmp || exit 1
			for e in "${fds[@]}"; do
				fd=${e%%:*} p=${e#*:}
				mkdir -p "$p" && mount --no-canonicalize --bind "/proc/self/fd/$fd" "$p" || exit 1
				exec {fd}<&-
			done
			exec slurmd -D -f "$dir/slurm.conf" -N "$n"' bash "$shm" "$n" "$dir" \
		$(cat "$dir/shared-dir" "$dir/keep-dirs" | awk '{ print length($0) "\t" $0 }' | sort -n | cut -f2-) \
		>"$dir/slurmd-$n.out" 2>&1 </dev/null &
	echo $! >"$dir/slurmd-$n.pid"
}

nft_rule() { sw nft add rule bridge bertd faults "$@"; }

# need_delay: what the delay fault needs, or exit 77 saying what is missing.
need_delay() {
	command -v iptables-legacy >/dev/null || { echo "skip: no delay fault: iptables-legacy not installed (Debian's iptables)"; exit 77; }
	[ -x "${BERTD_NFQ_DELAY:-}" ] || { echo "skip: no delay fault: BERTD_NFQ_DELAY (the nfq-delay helper) not set"; exit 77; }
	local why
	why=$(unshare -n sh -c 'iptables-legacy -A OUTPUT -o lo -j NFQUEUE --queue-num 0 2>&1 && "$1" --probe 0 2>&1' sh "$BERTD_NFQ_DELAY") ||
		{ echo "skip: no delay fault: NFQUEUE does not work here (needs CONFIG_NETFILTER_XT_TARGET_NFQUEUE, CONFIG_NETFILTER_NETLINK_QUEUE): $why"; exit 77; }
}

delay_rules() { # delay_rules NODE: NODE's eth0, both ways, to queue 0
	in_ns "$1" iptables-legacy -w -A INPUT -i eth0 -j NFQUEUE --queue-num 0 &&
		in_ns "$1" iptables-legacy -w -A OUTPUT -o eth0 -j NFQUEUE --queue-num 0
}

# undelay NODE: its rules out, then its helper stopped (it lets go what it
# holds) and waited for; SIGKILL after 5 s.
undelay() {
	local n=$1 p
	[ -f "$dir/delay-$n.pid" ] || return 0
	while in_ns "$n" iptables-legacy -w -D INPUT -i eth0 -j NFQUEUE --queue-num 0 2>/dev/null; do :; done
	while in_ns "$n" iptables-legacy -w -D OUTPUT -o eth0 -j NFQUEUE --queue-num 0 2>/dev/null; do :; done
	p=$(cat "$dir/delay-$n.pid")
	if [ -n "$p" ] && grep -qs nfq "/proc/$p/comm"; then
		kill -TERM "$p" 2>/dev/null
		for _ in $(seq 50); do grep -qs nfq "/proc/$p/comm" || break; sleep 0.1; done
		kill -KILL "$p" 2>/dev/null
	fi
	rm -f "$dir/delay-$n.pid"
}

case $cmd in
check) need; [ "${2:-}" = delay ] && need_delay; exit 0 ;;
start)
	dir=${2:?}; nodes=${3:?}; mode=${4:-private-shm}
	need
	reap_stale
	dir=$(readlink -f "$dir")
	[ -d "$dir/ns" ] && BERTD_NS_OWNER='' stop # a cluster here already: down first
	owner=${BERTD_NS_OWNER:-$PPID}
	mkdir -p "$dir/ns" "$dir/state" "$dir/spool"
	printf '%s\n%s\n' "$owner" "$dir" >"$reg/$(basename "$dir")-$$.dir"
	[ "$mode" = shared-shm ] && touch "$dir/shared-shm"
	readlink -f "${BERTD_NS_SHARED:-$dir}" >"$dir/shared-dir"
	# the trees the nodes run bertd-worker and read the sources from, kept
	# visible when they are under /tmp (a clone there: the nodes' /tmp is their own)
	here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
	for p in "$here" ${BERTD_BIN:+"$(dirname "$(readlink -f "$BERTD_BIN")")"}; do
		case $p in /tmp/*) echo "$p" ;; esac
	done | sort -u >"$dir/keep-dirs"
	# the watcher: when the owner ends, however it ends, the cluster goes
	setsid sh -c 'tail --pid="$1" -f /dev/null; exec "$2" stop "$3"' sh "$owner" "$self" "$dir" \
		>/dev/null 2>&1 </dev/null &
	echo $! >"$dir/watcher.pid"
	fail() { echo "$1"; BERTD_NS_OWNER=$owner stop; exit 1; }
	# nsfs bind mounts need a mount that does not propagate
	mount --bind "$dir/ns" "$dir/ns" && mount --make-private "$dir/ns" || fail "cannot mount $dir/ns"
	mkns sw && sw ip link add br0 type bridge && sw ip link set br0 up || fail "cannot make the switch"
	printf 'table bridge bertd {\n chain faults { type filter hook forward priority 0; }\n}\n' |
		sw nft -f - || fail "nft on the bridge failed"
	mkns head head && link head "$net.1" || fail "cannot make the head namespace"
	for k in $(seq 1 "$nodes"); do
		mkns "n$k" "n$k" && link "n$k" "$net.$((10 + k))" || fail "cannot make node n$k"
	done
	{
		echo '#!/bin/sh'
		for kv in ${BERTD_NS_TASK_ENV:-}; do echo "echo 'export $kv'"; done
	} >"$dir/taskprolog.sh" && chmod 0755 "$dir/taskprolog.sh"
	head -c 1024 /dev/urandom >"$dir/munge.key" && chmod 0400 "$dir/munge.key"
	in_ns head munged --force --socket="$dir/munge.sock" --key-file="$dir/munge.key" \
		--pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" \
		>"$dir/munged.out" 2>&1 || fail "munged failed: $(cat "$dir/munged.out")"
	{
		cat <<-CONF
		ClusterName=bertdns
		SlurmctldHost=head($net.1)
		AuthType=auth/munge
		AuthInfo=socket=$dir/munge.sock
		SlurmUser=$(id -un)
		SlurmdUser=$(id -un)
		StateSaveLocation=$dir/state
		SlurmdSpoolDir=$dir/spool/%n
		SlurmctldPidFile=$dir/slurmctld.pidf
		SlurmdPidFile=$dir/slurmd-%n.pidf
		SlurmctldLogFile=$dir/slurmctld.log
		SlurmdLogFile=$dir/slurmd-%n.log
		ProctrackType=proctrack/linuxproc
		TaskPlugin=task/none
		SchedulerType=sched/builtin
		SelectType=select/linear
		JobAcctGatherType=jobacct_gather/none
		AccountingStorageType=accounting_storage/none
		JobCompType=jobcomp/filetxt
		JobCompLoc=$dir/jobcomp.txt
		ReturnToService=2
		MpiDefault=none
		SlurmdTimeout=10
		KillWait=5
		MessageTimeout=5
		InactiveLimit=60
		TaskProlog=$dir/taskprolog.sh
		CONF
		for k in $(seq 1 "$nodes"); do
			echo "NodeName=n$k NodeHostname=n$k NodeAddr=$net.$((10 + k)) CPUs=1 State=UNKNOWN"
		done
		echo "PartitionName=p Nodes=n[1-$nodes] Default=YES MaxTime=INFINITE State=UP"
	} >"$dir/slurm.conf"
	setsid nsenter --net="$(ns head)" --uts="$(ns head).uts" -- slurmctld -D -c -f "$dir/slurm.conf" \
		>"$dir/slurmctld.out" 2>&1 </dev/null &
	echo $! >"$dir/slurmctld.pid"
	for k in $(seq 1 "$nodes"); do start_node "n$k"; done
	for _ in $(seq 300); do
		idle=$(in_ns head env SLURM_CONF="$dir/slurm.conf" sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle$')
		[ "$idle" = "$nodes" ] && { echo "$dir/slurm.conf"; exit 0; }
		sleep 0.1
	done
	echo "the cluster did not come up:"
	in_ns head env SLURM_CONF="$dir/slurm.conf" sinfo -N 2>&1
	tail -5 "$dir"/*.out "$dir"/*.log
	BERTD_NS_OWNER=$owner stop
	exit 1
	;;
stop) dir=$(readlink -f "${2:?}"); stop ;;
cut) dir=${2:?}; sw ip link set "v${3:?}" down ;;
heal) dir=${2:?}; sw ip link set "v${3:?}" up ;;
partition)
	dir=${2:?}; a=${3:?}; b=${4:?}
	nft_rule iifname "v$a" oifname "v$b" drop && nft_rule iifname "v$b" oifname "v$a" drop
	;;
loss)
	dir=${2:?}; n=${3:?}; pct=${4:?}
	nft_rule iifname "v$n" numgen random mod 100 "<" "$pct" drop &&
		nft_rule oifname "v$n" numgen random mod 100 "<" "$pct" drop
	;;
rate) dir=${2:?}; sw tc qdisc replace dev "v${3:?}" root tbf rate "${4:?}kbit" burst 32kbit latency 400ms ;;
delay)
	dir=${2:?}; n=${3:?}; ms=${4:?}
	need_delay
	case $ms in '' | *[!0-9]*) echo "delay: MS must be a whole number of milliseconds, not '$ms'"; exit 2 ;; esac
	[ -e "$(ns "$n")" ] || { echo "no node $n"; exit 1; }
	undelay "$n"
	setsid nsenter --net="$(ns "$n")" -- "$BERTD_NFQ_DELAY" 0 "$ms" >"$dir/delay-$n.out" 2>"$dir/delay-$n.log" </dev/null &
	echo $! >"$dir/delay-$n.pid"
	for _ in $(seq 100); do
		grep -qx ready "$dir/delay-$n.out" 2>/dev/null && break
		kill -0 "$!" 2>/dev/null || break
		sleep 0.1
	done
	grep -qx ready "$dir/delay-$n.out" 2>/dev/null || { echo "nfq-delay did not start: $(cat "$dir/delay-$n.log")"; undelay "$n"; exit 1; }
	delay_rules "$n" || { echo "iptables-legacy in $n failed"; undelay "$n"; exit 1; }
	;;
clear)
	dir=${2:?}
	sw nft flush chain bridge bertd faults
	for f in "$dir"/ns/n*; do
		case $f in *.uts) continue ;; esac
		sw tc qdisc del dev "v$(basename "$f")" root 2>/dev/null
		undelay "$(basename "$f")"
	done
	exit 0
	;;
flap)
	dir=${2:?}; n=${3:?}; ms=${4:?}; count=${5:?}
	s=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))
	for _ in $(seq "$count"); do
		sw ip link set "v$n" down; sleep "$s"; sw ip link set "v$n" up; sleep "$s"
	done
	;;
in) dir=${2:?}; n=${3:?}; shift 3; in_ns "$n" "$@" ;;
*) echo "unknown command $cmd"; exit 2 ;;
esac
