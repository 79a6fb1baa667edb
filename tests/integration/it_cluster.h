/* it_cluster — the multi-node tests' fixture: a test daemon beside a
 * private Slurm cluster (multinode_slurm.sh: slurmd's on this host, or
 * multinode_ns.sh: each node in its own namespaces), the shakes dataset
 * those tests train on, and the lookups of a job's ranks by node
 * (SLURMD_NODENAME in their environment) and of processes by pid.
 * Test-only code on top of it_util.h: it polls, never sleeps for an
 * outcome, and a failed setup leaves no daemon running. */
#ifndef BERTD_TESTS_IT_CLUSTER_H
#define BERTD_TESTS_IT_CLUSTER_H

#include <stdbool.h>
#include <sys/types.h>

#include "it_util.h"

typedef struct it_cluster {
	bertd d;
	char data[160];    /* root/data: the data root */
	char slurm[160];   /* root/slurm: the cluster's directory */
	char conf[200];    /* its slurm.conf */
	const char *script; /* the cluster script (start, stop and its fault verbs) */
} it_cluster;

/* Whether the cluster script can run here (`script check /nonexistent`)
 * and, with need_net, the workers have the network backend (BERTD_HAVE_GLOO,
 * when set, is "1"): 0, or 77 with the reason on stderr. */
int it_cluster_skip(const char *script, bool need_net);

/* A free TCP port on the loopback (bound, read, closed), or -1. */
int it_free_port(void);

/* bertd_init, then the data and cluster directories; script is the
 * cluster script (from the test's environment). 0 or -1. */
int it_cluster_init(it_cluster *c, const char *script);
/* `script start <dir> <port> x (nodes + 1)`: a private slurmctld and nodes
 * slurmd's on free loopback ports. 0, or -1 (said on stderr). */
int it_cluster_start_slurm(it_cluster *c, int nodes);
/* `[env] script what <dir> [args]`; its exit status, or -1. env (may be
 * NULL or "") is a prefix of VAR=value words. */
int it_cluster_do(const it_cluster *c, const char *env, const char *what, const char *args);
/* Starts bertd for Slurm jobs (data root, schedule, srun and slurm.conf,
 * a 60 s stop timeout) with extra (NULL-ended: devices, relay host, ...)
 * after those, then writes shakes.txt and adds the shakes dataset (vocab
 * 400) and waits until it is ready (deadline_s). 0 or -1. */
int it_cluster_start_daemon(it_cluster *c, const char *const *extra, int deadline_s);

/* Submits spec and frees it; returns the job's id (caller frees). */
char *it_cluster_submit(it_cluster *c, char *spec);
/* Runs spec (freed) to completed within deadline_s, failing the test
 * otherwise: its export's sha256 into sha; its id into *id_out (caller
 * frees) when id_out is not NULL. */
void it_cluster_run_to_end(it_cluster *c, char *spec, char sha[65], char **id_out, int deadline_s);

/* `scontrol update nodename=node state=state` (reason=test when down);
 * fails the test unless it succeeds. */
void it_cluster_node_state(const it_cluster *c, const char *node, const char *state);
/* Polls sinfo's compact state of node ("%t") until it is want; fails the
 * test after deadline_s. */
void it_cluster_wait_node(const it_cluster *c, const char *node, const char *want, int deadline_s);
/* How many of job id's ranks logged, in its srun.log (every rank's
 * stderr), that they joined over the network from host. */
int it_cluster_ranks_on_net(const it_cluster *c, const char *id, const char *host);

/* How many entries of dir have a name starting with prefix (0 when dir
 * cannot be read). */
int it_count_files(const char *dir, const char *prefix);

/* The value of name in /proc/pid/environ into out; 0 or -1. */
int it_env_of(pid_t pid, const char *name, char *out, size_t cap);
/* pid's parent, or -1. */
pid_t it_ppid_of(pid_t pid);
/* Whether pid exists and is neither a zombie nor dead. */
bool it_alive(pid_t pid);
/* The bertd-worker of job id on node (its SLURMD_NODENAME), or -1. */
pid_t it_rank_on(const char *id, const char *node);

#endif
