/* sv_internal — what the supervisor's files share: a run (one job attempt
 * or one dataset preparation) and its children, the supervisor object, and
 * the functions one of them calls in another. Included only by
 * daemon/supervisor.c and daemon/sv_*.c; the rest of the daemon sees
 * daemon/supervisor.h. Everything here lives on the event loop thread.
 *
 * Call order: a file calls only files below it, never one above or beside
 * it (tests/include_circles.sh checks that no two call each other):
 *
 *   supervisor.c   sv_shutdown.c                    (the tick; shutdown)
 *   adopt.c                                         (attempts of an earlier daemon)
 *   sv_preempt.c                                    (the tick's preemption)
 *   sv_launch.c                                     (starts a job's attempt)
 *   sv_slurm.c     sv_prepare.c                     (multi-node; datasets)
 *   sv_finish.c                                     (a job attempt's end)
 *   sv_relay.c                                      (multi-node ranks)
 *   sv_report.c                                     (a job's messages)
 *   sv_stall.c     sv_child.c     sv_jobfile.c
 *   sv_run.c                                        (calls none of them)
 *
 * Where a lower file must reach the code of a run's or a child's kind, it
 * calls a hook the upper file set: a child's child_ops (its input, a lost
 * connection, its exit), given to sv_child_spawn, and a run's on_end and
 * on_free.
 *
 * Declares, never defines; a function is listed under the file that
 * defines it.
 */
#ifndef BERTD_DAEMON_SV_INTERNAL_H
#define BERTD_DAEMON_SV_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/jobspec.h"
#include "common/msg.h"
#include "daemon/childenv.h"
#include "daemon/cluster.h"
#include "daemon/proc.h"
#include "daemon/relaykv.h"
#include "daemon/scheduler.h"
#include "daemon/supervisor.h"
#include "daemon/telemetry_sampler.h"

#define MAX_CHILDREN 130 /* 64 workers + 64 loaders + slack */
/* run.stop_why of a user's cancel: the event that ends the job names who (sv_canceled_by) */
#define SV_STOP_USER "canceled by user"

/* ROLE_LAUNCHER: srun of a multi-node job; its ranks are ROLE_WORKER
 * children without a process here ("relayed": only their connection). */
enum child_role { ROLE_WORKER, ROLE_LOADER, ROLE_PREPARE, ROLE_LAUNCHER };

typedef struct child child;
typedef struct run run;

/* What a child's kind does with it, set by the file that makes the child
 * (sv_launch, sv_slurm, sv_relay, sv_prepare) and called by sv_child. */
typedef struct child_ops {
	/* Handles the whole messages (or lines) there are in c->rd;
	 * negative when they break the message protocol. */
	int (*on_input)(struct supervisor *sv, run *r, child *c);
	/* c's connection closed (a relayed rank's); NULL: nothing to do. */
	void (*on_lost)(struct supervisor *sv, run *r, child *c);
	/* c's process ended with status (desc: its words for it), after its
	 * last input was read; before the common handling. NULL: nothing. */
	void (*on_exit)(struct supervisor *sv, run *r, int status, const char *desc);
	/* An adopted child (not this daemon's to wait for) that left no exit
	 * record: its wait status from what else it left (an adopted srun:
	 * its ranks' last words and Slurm's state, sv_slurm). NULL: it counts
	 * as killed. */
	int (*adopted_status)(struct supervisor *sv, run *r, child *c);
} child_ops;

struct child {
	enum child_role role;
	int index;             /* rank, loader index */
	proc p;
	msg_reader rd;
	bool watched;          /* registered with the loop */
	bool exited;
	bool sock_eof;         /* its end of the socket is closed */
	int64_t last_msg_ms;   /* monotonic: its last message (or its start) */
	bool heartbeat;        /* it sends "progress" messages: held to its own silence */
	bool relayed;          /* a multi-node rank: p.sock is its relay connection, no process */
	bool said_bye;         /* relayed: it said it is exiting (EOF is then no loss) */
	int bye_code;          /* relayed: the exit code its "bye" said */
	struct run *owner;
	const child_ops *ops;
	/* its line that outlives the daemon (common/chan.h): <chan_base>.sock
	 * and .exit; "" for none (srun, relayed ranks) */
	char chan_base[300];
	uint64_t start_time;   /* /proc/<pid>/stat field 22, its identity with the pid */
	uint64_t seq_done;     /* the last message seq handled (and stored) */
	uint64_t seq_acked;    /* the last seq acknowledged to it */
};

/* A relay connection that has not said who it is yet (multi-node). */
typedef struct relay_pending {
	int fd;
	msg_reader rd;
	struct run *owner;
	struct relay_pending *next;
} relay_pending;

struct run {
	bool is_dataset;
	char id[40];
	char dir[1024];
	json_t *spec;          /* effective job spec (jobs) or request (datasets) */
	int ndev;
	int dev[64];           /* device table indices */
	child *kids[MAX_CHILDREN];
	int nkids, alive;
	bool stop_sent, killing, shutdown;
	bool canceled;         /* dataset: its row left preparing (DELETE): killed, output removed */
	bool prep_signaled;    /* dataset: its bertd-prepare died of a signal the daemon did not send */
	int64_t start_ms, stop_deadline_ms;
	int64_t max_runtime_ms;  /* this attempt's share: what the earlier ones left */
	int64_t runtime_base_ms; /* wall time of the job's earlier attempts */
	bool saw_running;
	int hellos;
	bool adopted;          /* an attempt a daemon before this one started (daemon/adopt.c) */
	bool requeue;          /* end as restarting from the checkpoint, no restart counted (a refused worker protocol) */
	/* verdict, decided when the first child fails */
	bool failed, retryable;
	char reason[512];
	int64_t last_step;
	/* stall watch (see sv_stall.c); monotonic ms */
	int64_t last_msg_ms;   /* any worker's last message */
	int64_t last_step_ms;  /* the last step report (metrics, progress, checkpoint) */
	int64_t max_gap_ms;    /* longest gap between step reports */
	bool stepping;         /* a step was reported */
	int stall_noted;       /* rank recorded as suspect in the store; -1 none */
	tsampler *ts;          /* device/host samples between metrics rows; NULL if none */
	const char *stop_why;   /* reason recorded when a stop ends the job; SV_STOP_USER: a
				 * user's cancel, whose event names who (sv_canceled_by) */
	char preempted_by[40];  /* the job it was told to stop for (sv_preempt.c); "" when not:
				 * its end queues it again (sv_finish.c) */
	/* multi-node (docs/multinode.md): world ranks started by srun */
	bool multinode;
	int world;              /* ranks: ndev, or nodes * gpus_per_node */
	int nodes, per_node;
	cluster_attempt ca;     /* relay listener and token; listen_fd -1 when none */
	relay_pending *pending;
	int relays;             /* ranks connected with the token */
	char (*rank_node)[64];  /* (world,) node of each rank, from its relay hello */
	char (*rank_sha)[CLUSTER_TOKEN_HEX + 1]; /* (world,) its dataset manifest's sha256 */
	char launch_log[1200];  /* srun's output, for the reason when it fails */
	relaykv *kv;            /* the ranks' rendezvous map (daemon/relaykv.h); NULL until used */
	struct supervisor *sv;
	struct run *next;
	/* Set by whoever makes the run: unlinked, with no child left, the
	 * job's or dataset's next state; frees r (sv_finish_job,
	 * sv_prepare_finished). */
	void (*on_end)(struct supervisor *sv, run *r);
	/* Before r is freed: what its kind holds beyond its children (a
	 * multi-node attempt's relay: sv_relay_close_all); NULL for none. */
	void (*on_free)(struct supervisor *sv, run *r);
};

struct supervisor {
	supervisor_config cfg;
	char state_dir[1024], bin_dir[1024], dataset_root[1024];
	childenv_pass pass_env;  /* what children inherit of environ */
	loop *lp;
	store *st;
	device *devs;
	size_t ndev;
	const char **dev_job;  /* (ndev,) job id on each device or NULL */
	run *runs;
	int prepare_limit;     /* bertd-prepare processes at once (cfg.prepare_concurrency resolved) */
	/* datasets whose bertd-prepare a signal killed that the daemon did not
	 * send (OOM killer, kill -9): started again, resuming, at most
	 * PREPARE_MAX_KILLS times (sv_prepare.c; a few; replaced oldest first) */
	struct prepare_kills {
		char id[40];
		int n;
	} prep_kills[16];
	int prep_kills_next;
	int sample_fd;         /* timerfd: telemetry samples every TELEMETRY_SAMPLE_MS (supervisor.c); -1 if none */
	/* jobs preempted for a job that has not started yet: held in the queue
	 * until it has (sv_preempt.c); kept in the store too (preempt_holds) */
	struct preempt_hold {
		char victim[40], by[40];
		bool noted;    /* the victim's events say it waits (false: read back at start) */
	} preempt_holds[64];
	int npreempt_holds;
	struct jobqueue *jq;   /* the queue as the tick last read it (supervisor.c); NULL before the first pass */
};

/* ---- sv_run.c: a run's small helpers ---- */

/* Monotonic clock, ms. */
int64_t sv_now_ms(void);
/* Frees r (its relay, relayed ranks' connections, children's memory); r is
 * off sv->runs and its processes are gone. */
void sv_run_free(run *r);
/* The POSIX shm name of job_id's shared memory (job.json's shm_name). */
void sv_shm_name_for(const char *job_id, char *buf, size_t cap);
/* Sets r's verdict: failed, retryable or not, with the reason; the first
 * cause wins (later calls are no-ops). */
void sv_set_failure(run *r, bool retryable, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Signals every child with a process (relayed ranks have none); the first
 * call marks r killing, with 10 s before the tick sends SIGKILL. */
void sv_run_kill_all(run *r, int sig);
/* Records the job's wall time so far in the store (a job's run only). */
void sv_note_runtime(supervisor *sv, run *r);
/* This attempt's share of stopping_condition.max_runtime_seconds after
 * used_ms of earlier attempts: >= 1 ms, or 0 without a limit. */
int64_t sv_runtime_left_ms(const jobspec *spec, int64_t used_ms);
/* Moves job id from a state in from to failed with reason (no attempt runs). */
void sv_fail_job_now(supervisor *sv, const char *id, unsigned from, const char *reason);
/* Takes r off sv->runs (r is not freed). */
void sv_unlink_run(supervisor *sv, run *r);
/* With no child of r left alive: unlinks r and hands it to r->on_end (the
 * job's or dataset's next state; frees r). Otherwise does nothing. */
void sv_run_maybe_finish(supervisor *sv, run *r);
/* The run of job or dataset id, or NULL. */
run *sv_find_run(supervisor *sv, const char *id);

/* ---- sv_child.c: child processes on the loop ---- */

/* Spawns argv as r's child (role, index, handled through ops, which must
 * outlive it), stdout/stderr to log_path, watched by the loop. Negative
 * errno when it could not start (a process that started but cannot be
 * watched is killed, and counts as alive). */
int sv_child_spawn(supervisor *sv, run *r, enum child_role role, int index, const child_ops *ops,
		   char *const argv[], char *const envp[], const char *log_path);
/* Makes c, r's child (role, index, ops), with no process yet: calloc'd
 * and listed in r (counted alive). NULL when out of memory or r is full. */
child *sv_child_new(run *r, enum child_role role, int index, const child_ops *ops);
/* Registers c's pidfd and socket (when it has one) with the loop. */
int sv_child_watch(supervisor *sv, child *c);
/* c's process is gone (its pidfd said so, or adoption found it gone):
 * its last messages and its exit record's read, then the common handling
 * (the verdict, the loaders told to go, the run's end). An adopted child's
 * status is its exit record's code, or SIGKILL without a record. */
void sv_child_ended(supervisor *sv, run *r, child *c);
/* Writes <r->dir>/attempt.json: who runs r (docs/formats.md), for a daemon
 * that starts while they run. 0 or negative errno. */
int sv_child_record_write(supervisor *sv, run *r);
/* Writes rec (stolen) to path as compact JSON, atomically
 * (fs_write_atomic, mode 0600): an attempt record. 0 or negative errno. */
int sv_child_record_save(const char *path, json_t *rec);
/* Handles the frames of rec, an exit record (common/chan.h) that is c's
 * (the caller checked whose it is), as if c had just sent them: those
 * handled before are skipped by seq. */
void sv_child_exit_frames(supervisor *sv, run *r, child *c, json_t *rec);
/* Reads and handles everything c has sent that is there now. */
void sv_child_drain(supervisor *sv, run *r, child *c);
/* The loop's callback for a child's socket (arg: the child). */
void sv_child_on_sock(loop *l, int fd, uint32_t events, void *arg);
/* c's next message to handle (common/chan.h numbers them): 1 with *m
 * (caller decrefs), its seq (0: not numbered) and whether it is the
 * child's attach (whose "acked" is taken as handled here); 0 when none is
 * left; negative errno. A numbered message handled before (sent again
 * after an adoption) is skipped. After handling one, the caller sets
 * c->seq_done to its seq. */
int sv_child_next_message(child *c, json_t **m, uint64_t *seq, bool *attach);
/* Tells c that every message up to c->seq_done is handled and stored (it
 * may forget them); nothing when there is nothing new or no line. */
void sv_child_ack(child *c);

/* ---- sv_report.c: a job's messages ---- */

/* Handles one worker-protocol message m from c (m stays the caller's). */
void sv_report_handle_job_message(supervisor *sv, run *r, child *c, json_t *m);
/* A job's child's on_input (child_ops): every whole message in c->rd,
 * through sv_report_handle_job_message. Negative when one is not a
 * message (the protocol is broken). */
int sv_report_input(supervisor *sv, run *r, child *c);

/* ---- sv_stall.c: the stall watch ---- */

/* Stall bookkeeping for a message of this type from c (workers only). */
void sv_stall_note_progress(run *r, child *c, const char *type);
/* Records c as the suspect rank in the store, or clears it (c NULL). */
void sv_stall_note(supervisor *sv, run *r, const child *c, int64_t silent_ms, int64_t limit_ms, bool stopped);
/* The check of one tick for a running attempt, at now (sv_now_ms). */
void sv_stall_check(supervisor *sv, run *r, int64_t now);

/* ---- sv_jobfile.c: job.json ---- */

/* resources.device of r's multi-node job, "auto" resolved to this machine's. */
const char *sv_jobfile_multinode_kind(supervisor *sv, const run *r);
/* Writes <r->dir>/job.json for r's workers and loaders (resume: the
 * checkpoint directory, "" for none). 0 or negative errno. */
int sv_jobfile_write(supervisor *sv, run *r, const char *dataset_dir, const char *resume);

/* ---- sv_finish.c: the end of a job's attempt ---- */

/* A job's run->on_end: r, unlinked and with no child left: its shared
 * memory, devices, relay and Slurm step released, the job's next state
 * (queued, canceled, completed, restarting or failed). Frees r. */
void sv_finish_job(supervisor *sv, run *r);
/* "canceled by <who>" into buf (cap bytes): who asked for job id's cancel
 * (store_job_stop_by), "user" when nobody was recorded. Returns buf. */
const char *sv_canceled_by(supervisor *sv, const char *id, char *buf, size_t cap);

/* ---- adopt.c: attempts an earlier daemon started ---- */

/* At start, for j (starting, running or stopping in the store): adopts
 * its attempt when its attempt.json's processes are still the recorded
 * ones or ended with exit records: 1 (a run now; ended ones accounted
 * for). 0: nothing adoptable (what was left of it is killed); the caller
 * recovers the job as before. */
int sv_adopt_job(supervisor *sv, const store_job *j);
/* An adopted attempt's clocks from its record rec (started_unix_ms,
 * runtime_base_ms, max_runtime_ms) on this daemon's monotonic clock, its
 * stall watch from now, and a cancel the earlier daemon had asked for
 * (j stopping) asked again; for local and multi-node attempts alike. */
void sv_adopt_clock(run *r, const store_job *j, const json_t *rec);
/* At start, for every dataset the store has preparing: adopts its
 * bertd-prepare when its attempt record's process is still the recorded
 * one or ended with an exit record (a run now; one that ended is
 * accounted for: ready, or failed with its error). Otherwise what is left
 * of it is killed and sv_prepare_recover queues it again. */
void sv_adopt_datasets(supervisor *sv);

/* ---- sv_preempt.c: the tick's preemption ---- */

/* held (nq,): true for the jobs of q (the tick's queue, before
 * sched_decide) that were preempted for a job that has not started yet;
 * forgets the holds whose preemptor has started or is gone. */
void sv_preempt_hold(supervisor *sv, const sched_job *q, size_t nq, bool *held);
/* When sched_decide started nothing: asks sched_preempt whether q's head
 * should preempt running jobs (m: the machine as sched_decide saw it) and
 * tells the chosen ones' workers to checkpoint and stop. */
void sv_preempt_consider(supervisor *sv, const sched_job *q, size_t nq, const sched_machine *m);
/* r, stopping for a preemption, was canceled meanwhile (by a user or
 * max_runtime_seconds: its state is stopping): its workers get the
 * cancel's stop too (rank 0 exports if it has not exited yet) and r is no
 * longer preempted (its end is the cancel's). */
void sv_preempt_canceled(supervisor *sv, run *r);
/* At start, before adoption and the first tick: the holds the store keeps
 * (a daemon before this one preempted those jobs). */
void sv_preempt_load(supervisor *sv);
/* r, just adopted, was stopping for a preemption when the daemon before
 * this one went (its hold stands, its preemptor still waits): its workers
 * are asked again to checkpoint and stop, and its end queues it again as
 * a preempted job. Nothing for any other run. */
void sv_preempt_adopted(supervisor *sv, run *r);

/* ---- sv_launch.c: starting an attempt ---- */

/* Starts an attempt of j on devices dev (ndev of them; none for a
 * multi-node job), from queued or (resumed) restarting. A job that cannot
 * start is failed in the store; 0 then too. -ENOMEM only before anything
 * was done. */
int sv_launch_start_job(supervisor *sv, const store_job *j, const int *dev, int ndev, bool resumed);

/* ---- sv_slurm.c: a multi-node attempt ---- */

/* Starts r (set up by sv_launch_start_job, spec checked, nodes > 1) through
 * srun. Takes r: freed at once, or linked into sv->runs until its attempt
 * ends. Returns 0; a job that cannot start is failed in the store. */
int sv_slurm_start_multinode(supervisor *sv, run *r, const store_job *j, const jobspec *spec,
			     const char *dataset_dir, const char *resume, int64_t resume_step, unsigned from);
/* At start, for j (starting, running or stopping) whose attempt record
 * rec is a multi-node attempt's (docs/multinode.md, "A daemon restart"):
 * adopts it when srun is still the recorded process (or ended, with
 * what its ranks and Slurm left to judge it by) and the relay can listen
 * on its recorded address again: 1, a run now, its srun watched, the
 * ranks admitted again as they redial. 0: not adoptable (another boot,
 * no Slurm set up, the relay's address taken): srun, if still running,
 * and its Slurm job are ended, the fence closed; the caller recovers the
 * job. spec: the job's normalized spec (taken). */
int sv_slurm_adopt(supervisor *sv, const store_job *j, json_t *rec, json_t *spec);
/* r's srun ended with status (desc: its words for it): its child's
 * on_exit (child_ops). */
void sv_slurm_launcher_exited(supervisor *sv, run *r, int status, const char *desc);

/* ---- sv_relay.c: a multi-node attempt's relay ---- */

/* The loop's callback for r's relay listener (arg: the run). */
void sv_relay_on_accept(loop *l, int fd, uint32_t events, void *arg);
/* Closes a relayed rank's connection; it counts as exited. */
void sv_relay_drop(supervisor *sv, child *c);
/* A relayed rank's connection closed: its exit after its "bye", else a
 * lost rank (the attempt fails, retryable). Its child's on_lost. */
void sv_relay_lost(supervisor *sv, run *r, child *c);
/* Closes r's listener, unidentified connections and ranks (multi-node
 * only); a multi-node run's on_free. */
void sv_relay_close_all(supervisor *sv, run *r);

/* ---- sv_prepare.c: dataset preparations ---- */

/* A bertd-prepare child's ops: its messages (seqs, acknowledgements, an
 * adopted one's attach); its exit is the common one. */
extern const child_ops sv_prepare_ops;
/* A dataset's run for ds (is_dataset, on_end, dir: where its output goes),
 * not linked, no child; spec NULL when the stored request is unreadable.
 * NULL when out of memory. Caller owns (sv_run_free). */
run *sv_prepare_run_new(supervisor *sv, const store_dataset *ds);
/* <state_dir>/datasets/ch/<id><ext> into buf: "" its channel's base,
 * ".attempt.json" its attempt record, ".exit" its exit record. */
void sv_prepare_record_path(supervisor *sv, const char *id, const char *ext, char *buf, size_t cap);
/* Removes r's attempt record and exit record (its attempt is over). */
void sv_prepare_forget(supervisor *sv, const run *r);
/* r, a dataset's, unlinked and with no child left: its dataset's next
 * state (ready, failed, or queued again after an outside kill). Frees r.
 * A dataset's run->on_end. */
void sv_prepare_finished(supervisor *sv, run *r);
/* The tick's part for datasets: start what may start, stop canceled ones. */
void sv_prepare_tick(supervisor *sv);
/* At start: datasets an earlier daemon left preparing are queued again. */
void sv_prepare_recover(supervisor *sv);

#endif
