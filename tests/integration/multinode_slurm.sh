#!/usr/bin/env bash
# A private Slurm cluster on this host for the multi-node test
# (docs/multinode.md): its own munged (socket and key in DIR), one
# slurmctld and one slurmd per node (n1, n2, ...: Debian's slurmd runs
# several on one host, each on its own port), all on loopback.
#
#   multinode_slurm.sh start DIR CTLD_PORT NODE_PORT...   prints DIR/slurm.conf
#   multinode_slurm.sh stop DIR
#   multinode_slurm.sh check DIR                          exit 0, or 77 with why
#   multinode_slurm.sh node-stop DIR NODE | node-start DIR NODE
#   multinode_slurm.sh node-start-bind DIR NODE SRC DST   NODE sees SRC at DST (root)
#
# Exit 77 (skip) when the Slurm/munge binaries are missing. Everything runs
# as the calling user (SlurmUser = SlurmdUser = it): root or not, the tasks
# run as that user, which is all a single-user test cluster needs.
set -u
cmd=${1:?}; dir=${2:?}
PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH

need() {
	for b in munged slurmctld slurmd srun sinfo scancel; do
		command -v "$b" >/dev/null || { echo "skip: $b not installed (apt-get install slurmd slurmctld munge)"; exit 77; }
	done
}

start_node() {
	local n=$1
	mkdir -p "$dir/spool/$n"
	setsid slurmd -D -f "$dir/slurm.conf" -N "$n" >"$dir/slurmd-$n.out" 2>&1 </dev/null &
	echo $! >"$dir/slurmd-$n.pid"
}

# start_node, but the node's slurmd (and every task it starts) sees
# directory $2 at path $3: a mount namespace of its own with a bind mount
# (root only). Exits 77 when this machine does not allow it.
start_node_bind() {
	local n=$1 src=$2 dst=$3
	unshare -m --propagation private true 2>/dev/null || { echo "skip: no mount namespaces here"; exit 77; }
	mkdir -p "$dir/spool/$n"
	setsid unshare -m --propagation private sh -c 'mount --bind "$1" "$2" && exec slurmd -D -f "$3" -N "$4"' \
		sh "$src" "$dst" "$dir/slurm.conf" "$n" >"$dir/slurmd-$n.out" 2>&1 </dev/null &
	echo $! >"$dir/slurmd-$n.pid"
}

stop_pidfile() {
	local f=$1 pid
	[ -f "$f" ] || return 0
	pid=$(cat "$f")
	kill -TERM "$pid" 2>/dev/null
	for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	kill -KILL "$pid" 2>/dev/null
	rm -f "$f"
}

case $cmd in
check) need ;;
start)
	need
	shift 2
	ctld_port=${1:?}; shift
	mkdir -p "$dir/state" "$dir/spool"
	head -c 1024 /dev/urandom >"$dir/munge.key" && chmod 0400 "$dir/munge.key"
	munged --force --socket="$dir/munge.sock" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
		--log-file="$dir/munged.log" --seed-file="$dir/munged.seed" >"$dir/munged.out" 2>&1 ||
		{ echo "munged failed:"; cat "$dir/munged.out"; exit 1; }
	nodes=()
	i=0
	{
		cat <<-CONF
		ClusterName=bertdtest
		SlurmctldHost=localhost
		SlurmctldPort=$ctld_port
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
		ReturnToService=2
		MpiDefault=none
		SlurmdTimeout=10
		KillWait=5
		MessageTimeout=5
		InactiveLimit=60
		CONF
		for port in "$@"; do
			i=$((i + 1))
			echo "NodeName=n$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$port CPUs=1 State=UNKNOWN"
		done
		echo "PartitionName=p Nodes=n[1-$i] Default=YES MaxTime=INFINITE State=UP"
	} >"$dir/slurm.conf"
	setsid slurmctld -D -c -f "$dir/slurm.conf" >"$dir/slurmctld.out" 2>&1 </dev/null &
	echo $! >"$dir/slurmctld.pid"
	for k in $(seq 1 $i); do start_node "n$k"; done
	export SLURM_CONF=$dir/slurm.conf
	for _ in $(seq 300); do
		idle=$(sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle$')
		[ "$idle" = "$i" ] && { echo "$dir/slurm.conf"; exit 0; }
		sleep 0.1
	done
	echo "the cluster did not come up:"; sinfo -N 2>&1; tail -5 "$dir"/*.out "$dir"/*.log
	exit 1
	;;
node-stop) stop_pidfile "$dir/slurmd-${3:?}.pid" ;;
node-start) start_node "${3:?}" ;;
node-start-bind) start_node_bind "${3:?}" "${4:?}" "${5:?}" ;;
stop)
	for f in "$dir"/slurmd-*.pid; do stop_pidfile "$f"; done
	stop_pidfile "$dir/slurmctld.pid"
	[ -f "$dir/munged.pid" ] && kill -TERM "$(cat "$dir/munged.pid")" 2>/dev/null
	exit 0
	;;
*) echo "unknown command $cmd"; exit 2 ;;
esac
