/* supervisor — see supervisor.h.
 *
 * Job life on this side:
 *   queued/restarting --tick: devices free--> starting (children spawned)
 *   starting --first metrics or every worker said hello--> running
 *   all workers exit 0 --> completed
 *   stop requested (state stopping) --> workers get {"type":"stop"},
 *       checkpoint, exit 6 --> canceled
 *   a child dies otherwise --> the rest are killed; retryable and restarts
 *       left --> restarting (resumes from the last checkpoint), else failed.
 *   workers silent past the stall limit --> killed, as a retryable failure.
 *   a loss or gradient norm that is not finite --> failed, never retried.
 *
 * Stall limit. Every message a worker sends counts as progress (hello,
 * metrics, checkpoint, and {"type":"progress","step":N}, which a worker
 * sends at most once a second from its step loop). Before the job's first
 * step report the limit is at least SUPERVISOR_STARTUP_ALLOWANCE_MS:
 * building the model and loading a checkpoint are not a stall. After it, a rank that sends progress messages is held to
 * stall_timeout_ms from its own last message. A worker that does not
 * (only rank 0 reports, every logging_steps) is judged by the job's last
 * message against max(stall_timeout_ms, twice the longest gap seen between
 * step reports), so slow logging windows are not taken for a stall.
 */
#include "daemon/telemetry.h"
#include "daemon/telemetry_sampler.h"
#include "daemon/supervisor.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/exitcodes.h"
#include "common/fsutil.h"
#include "common/jobspec.h"
#include "common/keepalive.h"
#include "common/log.h"
#include "common/msg.h"
#include "common/procstat.h"
#include "daemon/childenv.h"
#include "daemon/cluster.h"
#include "daemon/proc.h"
#include "daemon/relaykv.h"
#include "daemon/resume.h"
#include "daemon/scheduler.h"
#include "daemon/tbevents.h"

#define MAX_CHILDREN 130 /* 64 workers + 64 loaders + slack */
#define TELEMETRY_SAMPLE_MS 500 /* GPU/host sampling period of running jobs */

extern char **environ; /* what children may inherit from (pass_env) */

/* ROLE_LAUNCHER: srun of a multi-node job; its ranks are ROLE_WORKER
 * children without a process here ("relayed": only their connection). */
enum child_role { ROLE_WORKER, ROLE_LOADER, ROLE_PREPARE, ROLE_LAUNCHER };

typedef struct child {
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
	struct run *owner;
} child;

/* A relay connection that has not said who it is yet (multi-node). */
typedef struct relay_pending {
	int fd;
	msg_reader rd;
	struct run *owner;
	struct relay_pending *next;
} relay_pending;

typedef struct run {
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
	/* verdict, decided when the first child fails */
	bool failed, retryable;
	char reason[512];
	int64_t last_step;
	/* stall watch (see the top of this file); monotonic ms */
	int64_t last_msg_ms;   /* any worker's last message */
	int64_t last_step_ms;  /* the last step report (metrics, progress, checkpoint) */
	int64_t max_gap_ms;    /* longest gap between step reports */
	bool stepping;         /* a step was reported */
	int stall_noted;       /* rank recorded as suspect in the store; -1 none */
	tsampler *ts;          /* device/host samples between metrics rows; NULL if none */
	const char *stop_why;   /* reason recorded when a stop ends the job */
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
} run;

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
	 * PREPARE_MAX_KILLS times (a few; replaced oldest first) */
	struct prepare_kills {
		char id[40];
		int n;
	} prep_kills[16];
	int prep_kills_next;
	int sample_fd;         /* timerfd: telemetry samples every TELEMETRY_SAMPLE_MS; -1 if none */
};

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void relay_close_all(supervisor *sv, run *r);

static void run_free(run *r)
{
	relay_close_all(r->sv, r);
	for (int i = 0; i < r->nkids; i++) {
		if (r->kids[i]->relayed && r->kids[i]->p.sock >= 0)
			close(r->kids[i]->p.sock);
		msg_reader_free(&r->kids[i]->rd);
		free(r->kids[i]);
	}
	free(r->rank_node);
	free(r->rank_sha);
	relaykv_destroy(r->kv);
	json_decref(r->spec);
	tsampler_destroy(r->ts);
	free(r);
}

static void shm_name_for(const char *job_id, char *buf, size_t cap)
{
	snprintf(buf, cap, "/bertd-%s", job_id);
}

/* ---- child I/O on the loop ---- */

static void run_maybe_finish(supervisor *sv, run *r);
static void run_kill_all(run *r, int sig);
static void relay_lost(supervisor *sv, run *r, child *c);
static void launcher_exited(supervisor *sv, run *r, int status, const char *desc);
static void note_stall(supervisor *sv, run *r, const child *c, int64_t silent_ms, int64_t limit_ms, bool stopped);

static void set_failure(run *r, bool retryable, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_failure(run *r, bool retryable, const char *fmt, ...)
{
	if (r->failed)
		return; /* the first cause wins; the rest are consequences */
	r->failed = true;
	r->retryable = retryable;
	if (r->multinode) /* a failed attempt's ranks put nothing in place any more */
		cluster_fence_close(&r->ca);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->reason, sizeof r->reason, fmt, ap);
	va_end(ap);
}

/* A worker's error that says the training diverged: a loss or gradient norm
 * that is not finite. The worker reports it as {"code": "internal",
 * "message": "step N: gradient norm is not finite (loss L)"} (train.c, the
 * device loops); a "non_finite" code with a "step" is taken as well. *step
 * gets the step (steps done before the one that diverged; -1 if not said),
 * *what the message without its "step N: ". */
static bool diverged_report(json_t *m, const char *code, const char *msg, long long *step, const char **what)
{
	*step = -1;
	*what = msg ? msg : "the loss or gradient norm is not finite";
	if (!(code && strcmp(code, "non_finite") == 0) && !(msg && strstr(msg, "not finite")))
		return false;
	json_t *js = json_object_get(m, "step");
	int used = 0;
	if (json_is_integer(js))
		*step = json_integer_value(js);
	else if (msg && sscanf(msg, "step %lld: %n", step, &used) == 1 && used > 0)
		*what = msg + used;
	else if (msg && sscanf(msg, "step %lld", step) != 1)
		*step = -1;
	return true;
}

static void fail_diverged(run *r, child *c, long long step, const char *what)
{
	char at[40] = "";
	if (step >= 0)
		snprintf(at, sizeof at, " after step %lld", step);
	set_failure(r, false,
		    "training diverged%s: rank %d: %s; not retried (a restart from the last checkpoint would repeat it)",
		    at, c->index, what);
}

/* Stall watch bookkeeping: every worker message is progress; metrics,
 * progress and checkpoint messages are step reports. */
static void note_progress(run *r, child *c, const char *type)
{
	if (c->role != ROLE_WORKER)
		return;
	int64_t now = now_ms();
	c->last_msg_ms = r->last_msg_ms = now;
	if (strcmp(type, "metrics") && strcmp(type, "progress") && strcmp(type, "checkpoint") &&
	    strcmp(type, "eval"))
		return;
	/* the first gap counts from the start (startup included: a
	 * generous estimate of the window, never a short one) */
	int64_t gap = now - (r->stepping ? r->last_step_ms : r->start_ms);
	if (gap > r->max_gap_ms)
		r->max_gap_ms = gap;
	r->stepping = true;
	r->last_step_ms = now;
}

/* Stores vals as metrics row `step` over the keys that row already has: a
 * step's training figures ("metrics") and its held-out evaluation ("eval")
 * come in two messages, in either order (docs/api.md, job_metrics). */
static void metric_row_merge(supervisor *sv, run *r, int64_t step, int64_t time_ms, json_t *vals)
{
	store_metric *old = NULL;
	size_t n = 0;
	json_t *row = NULL;
	if (store_metric_list(sv->st, r->id, step - 1, 1, &old, &n) == 0 && n == 1 && old[0].step == step)
		row = json_loads(old[0].values_json, 0, NULL);
	store_metrics_free(old, n);
	if (json_is_object(row)) {
		json_object_update(row, vals);
	} else {
		json_decref(row);
		row = json_incref(vals);
	}
	char *text = json_dumps(row, JSON_COMPACT);
	if (text)
		store_metric_insert(sv->st, r->id, step, time_ms, text);
	free(text);
	json_decref(row);
}

/* Worker rank 0's account of what the job trains on ({"type":"data"},
 * docs/formats.md), sent once it indexed the dataset: kept for the job's
 * representation. When more than 1% of the training documents' tokens are
 * never trained on, a warning event names the causes (once per account,
 * not again at each restart that reports the same). */
static void job_data_report(supervisor *sv, run *r, json_t *m)
{
	json_t *vals = json_deep_copy(m);
	char *text = NULL;
	bool changed = false;
	if (!vals)
		return;
	json_object_del(vals, "type");
	text = json_dumps(vals, JSON_COMPACT | JSON_SORT_KEYS);
	if (!text || store_job_data_set(sv->st, r->id, text, &changed) < 0 || !changed)
		goto out;
	json_int_t corpus = json_integer_value(json_object_get(vals, "corpus_tokens"));
	json_int_t dropped = json_integer_value(json_object_get(vals, "tokens_dropped"));
	if (corpus <= 0 || dropped * 100 <= corpus)
		goto out;
	char why[256] = "";
	size_t n = 0;
	const char *key;
	json_t *v;
	json_object_foreach(json_object_get(vals, "dropped"), key, v) {
		if (json_integer_value(v) > 0 && n < sizeof why)
			n += (size_t)snprintf(why + n, sizeof why - n, "%s%s %lld", n ? ", " : "", key,
					      (long long)json_integer_value(v));
	}
	char note[512];
	snprintf(note, sizeof note,
		 "warning: %lld of the %lld tokens the job trains on (%.1f%%) are dropped in every epoch (%s); "
		 "mlm.drop_long_sentences false keeps them",
		 (long long)dropped, (long long)corpus, 100.0 * (double)dropped / (double)corpus,
		 why[0] ? why : "see data.dropped");
	log_warn("job %s: %s", r->id, note + strlen("warning: "));
	store_job_note(sv->st, r->id, note);
out:
	free(text);
	json_decref(vals);
}

/* Records v (an object; anything else is ignored) as the job's outcome
 * member key (store_job.outcome_json). */
static void note_outcome(supervisor *sv, run *r, const char *key, json_t *v)
{
	if (!json_is_object(v))
		return;
	json_t *patch = json_pack("{s:O}", key, v);
	char *text = patch ? json_dumps(patch, JSON_COMPACT) : NULL;
	if (text && store_job_merge_outcome(sv->st, r->id, text) < 0)
		log_warn("job %s: cannot record its %s", r->id, key);
	free(text);
	json_decref(patch);
}

/* Records the job's wall time so far: its earlier attempts and this one
 * up to now (stopping_condition.max_runtime_seconds counts it). */
static void note_runtime(supervisor *sv, run *r)
{
	if (!r->is_dataset && r->start_ms > 0)
		store_job_set_runtime(sv->st, r->id, r->runtime_base_ms + (now_ms() - r->start_ms));
}

/* This attempt's share of max_runtime_seconds: what the earlier attempts
 * (runtime_ms) left, at least 1 ms, so a job out of time stops at once
 * (with its checkpoint and export); 0 without a limit. */
static int64_t runtime_left_ms(const jobspec *spec, int64_t used_ms)
{
	if (spec->max_runtime_seconds <= 0)
		return 0;
	int64_t left = spec->max_runtime_seconds * 1000 - used_ms;
	return left > 0 ? left : 1;
}

/* relaykv's way out: m to the worker of rank rank, if it is still there. */
static int send_to_rank(void *ctx, int rank, json_t *m)
{
	run *r = ctx;
	for (int i = 0; i < r->nkids; i++)
		if (r->kids[i]->role == ROLE_WORKER && r->kids[i]->index == rank && !r->kids[i]->exited)
			return msg_send(r->kids[i]->p.sock, m);
	return -ENOENT;
}

static void handle_job_message(supervisor *sv, run *r, child *c, json_t *m)
{
	const char *type = json_string_value(json_object_get(m, "type"));
	if (!type)
		return;
	note_progress(r, c, type);
	if (strcmp(type, "progress") == 0) {
		/* the worker's heartbeat from its step loop: {"type":"progress","step":N} */
		c->heartbeat = true;
		json_int_t step = json_integer_value(json_object_get(m, "step"));
		if (c->index == 0 && step > r->last_step)
			r->last_step = step;
	} else if (strcmp(type, "hello") == 0) {
		if (c->role == ROLE_WORKER && ++r->hellos == r->world && !r->saw_running) {
			r->saw_running = true;
			store_job_transition(sv->st, r->id, JOB_MASK(JOB_STARTING), JOB_RUNNING,
					     "all workers started", NULL);
		}
	} else if (strcmp(type, "metrics") == 0) {
		json_int_t step = json_integer_value(json_object_get(m, "step"));
		r->last_step = step;
		/* JSON has no NaN: a worker that cannot say the loss sends null */
		json_t *loss = json_object_get(m, "loss");
		if (loss && !(json_is_number(loss) && isfinite(json_number_value(loss)))) {
			fail_diverged(r, c, step, "the loss is not finite");
			run_kill_all(r, SIGTERM);
		}
		json_t *vals = json_deep_copy(m);
		json_object_del(vals, "type");
		json_object_del(vals, "step");
		if (r->ts)
			tsampler_flush(r->ts, vals);
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		int64_t ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
		metric_row_merge(sv, r, step, ms, vals);
		tbevents_append_row(r->dir, step, ms, vals);
		json_decref(vals);
		if (!r->saw_running) {
			r->saw_running = true;
			store_job_transition(sv->st, r->id, JOB_MASK(JOB_STARTING), JOB_RUNNING,
					     "training", NULL);
		}
	} else if (strcmp(type, "eval") == 0 && c->role == ROLE_WORKER && c->index == 0) {
		/* {"type":"eval","step":N,"eval_loss":..,"perplexity":..,"eval_accuracy":..}
		 * (every rank has the same sums; rank 0 reports): keys of row N */
		json_int_t step = json_integer_value(json_object_get(m, "step"));
		json_t *vals = json_deep_copy(m);
		json_object_del(vals, "type");
		json_object_del(vals, "step");
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		int64_t ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
		if (step >= 0 && json_is_object(vals)) {
			metric_row_merge(sv, r, step, ms, vals);
			tbevents_append_row(r->dir, step, ms, vals);
		}
		json_decref(vals);
	} else if (strcmp(type, "checkpoint") == 0) {
		store_checkpoint ck = {
			.step = json_integer_value(json_object_get(m, "step")),
			.path = (char *)json_string_value(json_object_get(m, "path")),
			.bytes = json_integer_value(json_object_get(m, "bytes")),
		};
		if (ck.path)
			store_checkpoint_insert(sv->st, r->id, &ck);
		note_outcome(sv, r, "best_model", json_object_get(m, "best_model"));
		note_runtime(sv, r);
		/* keep-last-N pruning happened in the worker: forget the rest */
		json_t *present = json_object_get(m, "present_steps");
		store_checkpoint *cks = NULL;
		size_t n = 0;
		if (json_is_array(present) && store_checkpoint_list(sv->st, r->id, &cks, &n) == 0) {
			for (size_t i = 0; i < n; i++) {
				bool keep = false;
				size_t k;
				json_t *v;
				json_array_foreach(present, k, v)
					keep |= json_integer_value(v) == cks[i].step;
				if (!keep)
					store_checkpoint_delete(sv->st, r->id, cks[i].step);
			}
		}
		store_checkpoints_free(cks, n);
	} else if (strcmp(type, "exported") == 0 && c->role == ROLE_WORKER && c->index == 0) {
		/* {"type":"exported","path":..,"step":N,"source":"final"|"best"|"stopped"} */
		json_t *ex = json_pack("{s:O?, s:O?}", "step", json_object_get(m, "step"), "source",
				       json_object_get(m, "source"));
		note_outcome(sv, r, "export", ex);
		json_decref(ex);
	} else if (strcmp(type, "error") == 0) {
		const char *code = json_string_value(json_object_get(m, "code"));
		const char *msg = json_string_value(json_object_get(m, "message"));
		long long at;
		const char *what;
		if (diverged_report(m, code, msg, &at, &what)) {
			fail_diverged(r, c, at, what);
			return;
		}
		bool retry = code && (strcmp(code, "peer_lost") == 0 || strcmp(code, "internal") == 0);
		set_failure(r, retry, "%s %d: %s%s%s", c->role == ROLE_LOADER ? "loader" : "rank", c->index,
			    code ? code : "error", msg ? ": " : "", msg ? msg : "");
	} else if (strcmp(type, "bye") == 0 && c->relayed) {
		c->said_bye = true; /* its connection closing next is no loss */
		/* a rank's bad exit ends the attempt on every node, as a local
		 * worker's does (srun alone would wait for the others) */
		int code = (int)json_integer_value(json_object_get(m, "code"));
		if (code != BERTD_EXIT_OK && code != BERTD_EXIT_STOPPED && !r->killing) {
			set_failure(r, code == BERTD_EXIT_FAILURE || code == BERTD_EXIT_PEER_LOST,
				    "rank %d on node %s ended with exit %d", c->index, r->rank_node[c->index], code);
			run_kill_all(r, SIGTERM);
		}
	} else if (strcmp(type, "data") == 0 && c->role == ROLE_WORKER && c->index == 0) {
		job_data_report(sv, r, m);
	} else if (c->role == ROLE_WORKER && relaykv_is_message(m)) {
		/* the net comm backend's rendezvous (daemon/relaykv.h) */
		if (relaykv_handle(&r->kv, r->id, c->index, m, send_to_rank, r) < 0)
			log_warn("job %s: rank %d: out of memory for its key/value message", r->id, c->index);
	} else if (strcmp(type, "nccl_id") == 0 && c->role == ROLE_WORKER && c->index == 0) {
		/* rank 0 made the communicator id; every other rank needs it */
		for (int i = 0; i < r->nkids; i++) {
			child *k = r->kids[i];
			if (k->role == ROLE_WORKER && k->index != 0 && !k->exited)
				msg_send(k->p.sock, m);
		}
	}
}

static void handle_prepare_message(supervisor *sv, run *r, json_t *m)
{
	json_t *ok = json_object_get(m, "ok");
	const char *error = json_string_value(json_object_get(m, "error"));
	if (json_is_false(ok) && error) /* bertd-prepare's own account of its failure */
		set_failure(r, false, "%s", error);
	const char *phase = json_string_value(json_object_get(m, "phase"));
	json_t *done = json_object_get(m, "bytes_done"), *total = json_object_get(m, "bytes_total");
	json_t *stats = json_object_get(m, "stats");
	char *st = stats ? json_dumps(stats, JSON_COMPACT) : NULL;
	if (phase && strcmp(phase, "done") == 0 && st) {
		/* the end: the whole corpus was read, whatever the last progress line said */
		json_int_t bytes = json_integer_value(json_object_get(stats, "bytes"));
		store_dataset_progress(sv->st, r->id, bytes, bytes, st);
		store_dataset_phase(sv->st, r->id, "done", 1.0);
	} else {
		if (done || st)
			store_dataset_progress(sv->st, r->id, json_integer_value(done),
					       json_integer_value(total), st);
		json_t *frac = json_object_get(m, "fraction");
		if (phase && json_is_number(frac))
			store_dataset_phase(sv->st, r->id, phase, json_number_value(frac));
	}
	free(st);
}

/* Reads line-delimited JSON from bertd-prepare's progress channel. */
static void drain_prepare_lines(supervisor *sv, run *r, child *c)
{
	for (;;) {
		unsigned char *nl = memchr(c->rd.buf, '\n', c->rd.len);
		if (!nl)
			break;
		size_t n = (size_t)(nl - c->rd.buf);
		json_t *m = json_loadb((const char *)c->rd.buf, n, 0, NULL);
		if (m && json_is_object(m))
			handle_prepare_message(sv, r, m);
		json_decref(m);
		memmove(c->rd.buf, nl + 1, c->rd.len - n - 1);
		c->rd.len -= n + 1;
	}
}

/* Reads and handles everything c has sent that is there now (until EAGAIN
 * or end of stream), e.g. what it said just before it exited. */
static void drain_child(supervisor *sv, run *r, child *c)
{
	long n;
	while (c->p.sock >= 0 && !c->sock_eof && (n = msg_reader_fill(&c->rd, c->p.sock)) != -EAGAIN) {
		if (n <= 0) {
			c->sock_eof = true;
			break;
		}
		if (c->role == ROLE_PREPARE) {
			drain_prepare_lines(sv, r, c);
			continue;
		}
		json_t *m;
		while (msg_reader_next(&c->rd, &m) == 1) {
			handle_job_message(sv, r, c, m);
			json_decref(m);
		}
	}
}

static void on_child_sock(loop *l, int fd, uint32_t events, void *arg)
{
	(void)events;
	child *c = arg;
	run *r = c->owner;
	supervisor *sv = r->sv;
	long n = msg_reader_fill(&c->rd, fd);
	if (n == 0 || (n < 0 && n != -EAGAIN)) {
		loop_del(l, fd); /* EOF: exit is handled through the pidfd */
		if (c->relayed)
			relay_lost(sv, r, c);
		return;
	}
	if (c->role == ROLE_PREPARE) {
		drain_prepare_lines(sv, r, c);
		if (c->rd.len == c->rd.cap) /* a line longer than the buffer: drop it */
			c->rd.len = 0;
		return;
	}
	json_t *m;
	int rc;
	while ((rc = msg_reader_next(&c->rd, &m)) == 1) {
		handle_job_message(sv, r, c, m);
		json_decref(m);
	}
	if (rc < 0) {
		log_warn("job %s: %s %d broke the message protocol; stopping the job", r->id,
			 c->role == ROLE_LOADER ? "loader" : "rank", c->index);
		set_failure(r, false, "protocol error from a child process");
		loop_del(l, fd);
		run_kill_all(r, SIGKILL);
	}
}

static void on_child_exit(loop *l, int fd, uint32_t events, void *arg)
{
	(void)events;
	child *c = arg;
	run *r = c->owner;
	supervisor *sv = r->sv;
	if (proc_reap(&c->p) <= 0)
		return;
	loop_del(l, fd);
	loop_del(l, c->p.sock); /* may already be gone */
	/* Drain whatever it said last (its error message comes before exit). */
	drain_child(sv, r, c);
	proc_close(&c->p);
	c->exited = true;
	r->alive--;

	int st = c->p.status;
	char desc[96];
	proc_describe(st, desc, sizeof desc);
	if (c->role == ROLE_LAUNCHER)
		launcher_exited(sv, r, st, desc);
	const char *who = c->role == ROLE_WORKER ? "rank" : c->role == ROLE_LOADER ? "loader"
			  : c->role == ROLE_LAUNCHER ? "srun" : "prepare";
	bool ok = WIFEXITED(st) && WEXITSTATUS(st) == BERTD_EXIT_OK;
	bool stopped = WIFEXITED(st) && WEXITSTATUS(st) == BERTD_EXIT_STOPPED;
	if (c->role == ROLE_LOADER && r->killing)
		ok = true; /* loaders are told to go when the workers are done */
	if (!ok && !stopped && !r->killing) {
		int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
		bool retry = !WIFEXITED(st) || code == BERTD_EXIT_FAILURE || code == BERTD_EXIT_PEER_LOST;
		if (c->role == ROLE_PREPARE && !WIFEXITED(st))
			r->prep_signaled = true;
		set_failure(r, retry, "%s %d ended with %s", who, c->index, desc);
		log_warn("%s %s: %s %d ended with %s", r->is_dataset ? "dataset" : "job", r->id, who, c->index, desc);
		run_kill_all(r, SIGTERM);
	} else {
		log_debug("%s %s: %s %d ended with %s", r->is_dataset ? "dataset" : "job", r->id, who, c->index, desc);
	}
	/* Workers done: loaders have nothing left to do. */
	if (!r->is_dataset && !r->killing) {
		bool workers_left = false;
		for (int i = 0; i < r->nkids; i++)
			if ((r->kids[i]->role == ROLE_WORKER || r->kids[i]->role == ROLE_LAUNCHER) &&
			    !r->kids[i]->exited)
				workers_left = true;
		if (!workers_left)
			run_kill_all(r, SIGTERM);
	}
	run_maybe_finish(sv, r);
}

static void run_kill_all(run *r, int sig)
{
	if (!r->killing) {
		r->killing = true;
		r->stop_deadline_ms = now_ms() + 10000;
	}
	for (int i = 0; i < r->nkids; i++)
		if (!r->kids[i]->exited && !r->kids[i]->relayed)
			proc_signal(&r->kids[i]->p, sig);
}

static int spawn_child(supervisor *sv, run *r, enum child_role role, int index, char *const argv[],
		       char *const envp[], const char *log_path)
{
	if (r->nkids == MAX_CHILDREN)
		return -E2BIG;
	child *c = calloc(1, sizeof *c);
	if (!c)
		return -ENOMEM;
	c->role = role;
	c->index = index;
	c->owner = r;
	c->last_msg_ms = now_ms();
	msg_reader_init(&c->rd);
	int rc = proc_spawn(&c->p, argv, envp, log_path);
	if (rc < 0) {
		free(c);
		return rc;
	}
	r->kids[r->nkids++] = c;
	r->alive++;
	if ((rc = loop_add(sv->lp, c->p.pidfd, EPOLLIN, on_child_exit, c)) < 0 ||
	    (rc = loop_add(sv->lp, c->p.sock, EPOLLIN, on_child_sock, c)) < 0) {
		proc_signal(&c->p, SIGKILL);
		return rc;
	}
	c->watched = true;
	return 0;
}

/* ---- multi-node: the relay (docs/multinode.md, daemon/cluster.h) ---- */

/* Closes a relayed rank's connection; it counts as exited (it has no
 * process here to wait for). */
static void relay_drop(supervisor *sv, child *c)
{
	if (c->p.sock >= 0) {
		loop_del(sv->lp, c->p.sock);
		close(c->p.sock);
		c->p.sock = -1;
	}
	c->exited = true;
}

static void pending_free(supervisor *sv, run *r, relay_pending *p, bool close_fd)
{
	for (relay_pending **pp = &r->pending; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	if (close_fd) {
		loop_del(sv->lp, p->fd);
		close(p->fd);
		msg_reader_free(&p->rd);
	}
	free(p);
}

/* The attempt is over: listener, connections not yet identified, ranks. */
static void relay_close_all(supervisor *sv, run *r)
{
	if (!r->multinode)
		return;
	if (r->ca.listen_fd >= 0)
		loop_del(sv->lp, r->ca.listen_fd);
	cluster_attempt_close(&r->ca);
	while (r->pending)
		pending_free(sv, r, r->pending, true);
	for (int i = 0; i < r->nkids; i++)
		if (r->kids[i]->relayed)
			relay_drop(sv, r->kids[i]);
}

/* A rank's connection closed. After its "bye" that is its exit; before,
 * the rank is lost (killed, its node gone): the attempt fails on every
 * node, retryable, and srun is told to end the step. */
static void relay_lost(supervisor *sv, run *r, child *c)
{
	bool bye = c->said_bye;
	relay_drop(sv, c);
	if (bye || r->killing)
		return;
	set_failure(r, true, "rank %d on node %s was lost (its connection closed before it exited)", c->index,
		    r->rank_node[c->index]);
	log_warn("job %s: %s", r->id, r->reason);
	run_kill_all(r, SIGTERM);
}

/* A job's data as one string for messages: the dataset's name, or a
 * mixture's names joined by "+". Returns buf. */
static const char *data_label(json_t *spec, char *buf, size_t cap)
{
	json_t *ds = json_object_get(spec, "dataset");
	size_t n = 0, i;
	json_t *e;
	buf[0] = '\0';
	if (!json_is_array(ds)) {
		snprintf(buf, cap, "%s", json_string_value(ds) ? json_string_value(ds) : "");
		return buf;
	}
	json_array_foreach(ds, i, e) {
		if (n >= cap)
			break;
		int w = snprintf(buf + n, cap - n, "%s%s", i ? "+" : "",
				 json_string_value(json_object_get(e, "name")));
		if (w < 0)
			break;
		n += (size_t)w;
	}
	return buf;
}

/* Every rank has joined: the same dataset everywhere, or the job fails
 * (not retried: a restart would find the same copies). Then "go". */
static void relay_all_joined(supervisor *sv, run *r)
{
	char why[600], where[600];
	int len = snprintf(where, sizeof where, "%d ranks joined:", r->world);
	for (int i = 0; i < r->world && len > 0 && (size_t)len < sizeof where; i++)
		len += snprintf(where + len, sizeof where - (size_t)len, " %d@%s", i, r->rank_node[i]);
	store_job_note(sv->st, r->id, where);
	char label[JOBSPEC_MAX_DATASETS * 66];
	const char *dataset = data_label(r->spec, label, sizeof label);
	if (cluster_dataset_verdict((const char(*)[64])r->rank_node,
				    (const char(*)[CLUSTER_TOKEN_HEX + 1])r->rank_sha, r->world,
				    dataset ? dataset : "", why, sizeof why) < 0) {
		set_failure(r, false, "%s", why);
		log_warn("job %s: %s", r->id, why);
		run_kill_all(r, SIGTERM);
		return;
	}
	const char *comm = sv->cfg.multinode_comm && *sv->cfg.multinode_comm ? sv->cfg.multinode_comm : "auto";
	json_t *go = json_pack("{s:s, s:s}", "type", "go", "comm", comm);
	for (int i = 0; i < r->nkids; i++)
		if (r->kids[i]->relayed && !r->kids[i]->exited)
			msg_send(r->kids[i]->p.sock, go);
	json_decref(go);
	log_info("job %s: %s", r->id, where);
}

/* The first message of a relay connection: {"type":"relay","token","rank",
 * "node","dataset_sha256"}. The right token makes it rank's child; anything
 * else closes it (a wrong token is logged, the job goes on). */
static void on_relay_pending(loop *l, int fd, uint32_t events, void *arg)
{
	(void)events;
	relay_pending *p = arg;
	run *r = p->owner;
	supervisor *sv = r->sv;
	long n = msg_reader_fill(&p->rd, fd);
	json_t *m = NULL;
	int rc = msg_reader_next(&p->rd, &m);
	if (rc == 0 && (n > 0 || n == -EAGAIN))
		return; /* not whole yet */
	const char *type = json_string_value(json_object_get(m, "type"));
	json_t *jr = json_object_get(m, "rank");
	int rank = json_is_integer(jr) ? (int)json_integer_value(jr) : -1;
	const char *why = NULL;
	if (rc != 1 || !type || strcmp(type, "relay") != 0)
		why = "it did not introduce itself";
	else if (!cluster_token_ok(&r->ca, json_string_value(json_object_get(m, "token"))))
		why = "wrong relay token";
	else if (rank < 0 || rank >= r->world)
		why = "rank out of range";
	for (int i = 0; !why && i < r->nkids; i++)
		if (r->kids[i]->relayed && r->kids[i]->index == rank)
			why = "rank already joined";
	child *c = why || r->nkids == MAX_CHILDREN ? NULL : calloc(1, sizeof *c);
	if (!c) {
		log_warn("job %s: relay connection refused: %s", r->id, why ? why : "out of memory");
		json_decref(m);
		pending_free(sv, r, p, true);
		return;
	}
	*c = (child){.role = ROLE_WORKER, .index = rank, .relayed = true, .owner = r, .rd = p->rd,
		     .last_msg_ms = now_ms(), .p = {.pid = 0, .pidfd = -1, .sock = fd}};
	snprintf(r->rank_node[rank], sizeof r->rank_node[rank], "%s",
		 json_string_value(json_object_get(m, "node")) ? json_string_value(json_object_get(m, "node"))
							     : "?");
	snprintf(r->rank_sha[rank], sizeof r->rank_sha[rank], "%s",
		 json_string_value(json_object_get(m, "dataset_sha256")) ? json_string_value(json_object_get(
										m, "dataset_sha256"))
									  : "");
	json_decref(m);
	loop_del(l, fd);
	pending_free(sv, r, p, false);
	r->kids[r->nkids++] = c;
	if (loop_add(l, fd, EPOLLIN, on_child_sock, c) < 0) {
		relay_lost(sv, r, c);
		return;
	}
	c->watched = true;
	note_progress(r, c, "relay");
	if (++r->relays == r->world)
		relay_all_joined(sv, r);
	while (!c->exited && msg_reader_next(&c->rd, &m) == 1) { /* what came with it */
		handle_job_message(sv, r, c, m);
		json_decref(m);
	}
}

static void on_relay_accept(loop *l, int fd, uint32_t events, void *arg)
{
	(void)events;
	run *r = arg;
	for (;;) {
		int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (cfd < 0)
			return;
		keepalive_set(cfd, r->ca.relay_timeout_ms); /* a cut-off rank is an error in bounded time */
		relay_pending *p = calloc(1, sizeof *p);
		if (!p || loop_add(l, cfd, EPOLLIN, on_relay_pending, p) < 0) {
			free(p);
			close(cfd);
			continue;
		}
		p->fd = cfd;
		p->owner = r;
		msg_reader_init(&p->rd);
		p->next = r->pending;
		r->pending = p;
	}
}

/* The last non-empty line of a log file (srun's own error), or "". */
static void log_last_line(const char *path, char *out, size_t cap)
{
	out[0] = 0;
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	char line[512];
	while (fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = 0;
		if (line[0])
			snprintf(out, cap, "%s", line);
	}
	fclose(f);
}

/* srun ended: what the ranks said last is read first (their error is the
 * cause), then their connections are closed; a bad exit of srun itself
 * (no nodes, a rank killed) fails the attempt with srun's own words. */
static void launcher_exited(supervisor *sv, run *r, int status, const char *desc)
{
	for (int i = 0; i < r->nkids; i++) {
		child *c = r->kids[i];
		if (c->relayed && !c->exited) {
			drain_child(sv, r, c);
			relay_drop(sv, c);
		}
	}
	int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
	bool bad = code != BERTD_EXIT_OK && code != BERTD_EXIT_STOPPED;
	if ((!bad || r->killing) && !r->failed)
		return; /* ended well, or as bertd asked (a cancel, a stop) */
	/* what Slurm made of it: NODE_FAIL, CANCELLED, TIMEOUT, ... (blocks up to 2 s) */
	char last[400], slurm[200] = "";
	cluster_slurm_state(&r->ca, sv->cfg.slurm_srun, sv->cfg.slurm_conf, CLUSTER_STATE_TIMEOUT_MS, slurm,
			    sizeof slurm);
	if (r->failed) { /* a lost rank may be Slurm's doing: say so */
		size_t n = strlen(r->reason);
		if (cluster_state_own(slurm) && n < sizeof r->reason)
			snprintf(r->reason + n, sizeof r->reason - n, "; Slurm job state %s", slurm);
		return;
	}
	log_last_line(r->launch_log, last, sizeof last);
	set_failure(r, true, "srun ended with %s%s%s%s%s", desc, last[0] ? ": " : "", last,
		    slurm[0] ? "; Slurm job state " : "", slurm);
}

/* resources.device of a multi-node job: "auto" is what this machine has
 * (a cluster's nodes are taken to be alike). */
static const char *multinode_kind(supervisor *sv, const run *r)
{
	const char *d = json_string_value(json_object_get(json_object_get(r->spec, "resources"), "device"));
	if (d && strcmp(d, "auto") != 0)
		return d;
	return sv->ndev && sv->devs[0].kind == DEVICE_CUDA ? "cuda" : "cpu";
}

/* ---- jobs ---- */

static void job_dir(supervisor *sv, const char *id, char *buf, size_t cap)
{
	int n = snprintf(buf, cap, "%s/jobs/%s", sv->state_dir, id);
	(void)n;
}

static int cmp_step_desc(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x < y) - (x > y);
}

/* The checkpoint job id resumes from: the newest one that resume_check
 * passes, among the store's rows and the complete directories under ckdir
 * (a stop checkpoint written while the daemon drained may have no row).
 * One found only on disk gets its row; an unusable one (truncated, damaged)
 * loses its row and is noted as a job event, and the next older is tried.
 * path "" and *step 0 when there is none. */
static void pick_resume(supervisor *sv, const char *id, const char *ckdir, char *path, size_t cap,
			int64_t *step)
{
	store_checkpoint *cks = NULL;
	size_t nrow = 0, ndisk = 0;
	int64_t *disk = NULL;
	path[0] = 0;
	*step = 0;
	if (store_checkpoint_list(sv->st, id, &cks, &nrow) < 0)
		nrow = 0;
	if (resume_scan(ckdir, &disk, &ndisk) < 0)
		ndisk = 0;
	int64_t *steps = calloc(nrow + ndisk + 1, sizeof *steps);
	size_t n = 0;
	for (size_t i = 0; steps && i < nrow; i++)
		steps[n++] = cks[i].step;
	for (size_t i = 0; steps && i < ndisk; i++)
		steps[n++] = disk[i];
	if (n)
		qsort(steps, n, sizeof *steps, cmp_step_desc);
	for (size_t i = 0; i < n; i++) {
		if (i > 0 && steps[i] == steps[i - 1])
			continue;
		const store_checkpoint *row = NULL;
		for (size_t k = 0; k < nrow; k++)
			if (cks[k].step == steps[i])
				row = &cks[k];
		char dir[1200], why[600], note[1400];
		if (row)
			snprintf(dir, sizeof dir, "%s", row->path);
		else
			snprintf(dir, sizeof dir, "%s/ckpt-%lld", ckdir, (long long)steps[i]);
		int rc = resume_check(dir, steps[i], why, sizeof why);
		if (rc == 0) {
			if (!row) {
				store_checkpoint ck = {.step = steps[i], .path = dir, .bytes = fs_dir_bytes(dir)};
				store_checkpoint_insert(sv->st, id, &ck);
				snprintf(note, sizeof note,
					 "checkpoint at step %lld found in the job directory without a record (its "
					 "report was lost); recorded it",
					 (long long)steps[i]);
				store_job_note(sv->st, id, note);
				log_info("job %s: %s", id, note);
			}
			snprintf(path, cap, "%s", dir);
			*step = steps[i];
			break;
		}
		if (!row && rc == -ENOENT)
			continue; /* its DONE went away since the scan: not a checkpoint */
		snprintf(note, sizeof note, "checkpoint at step %lld is unusable (%s); trying an older one",
			 (long long)steps[i], why);
		store_job_note(sv->st, id, note);
		log_warn("job %s: %s", id, note);
		if (row)
			store_checkpoint_delete(sv->st, id, steps[i]);
	}
	free(steps);
	free(disk);
	store_checkpoints_free(cks, nrow);
}

static void fail_job_now(supervisor *sv, const char *id, unsigned from, const char *reason)
{
	log_warn("job %s failed: %s", id, reason);
	if (store_job_transition(sv->st, id, from, JOB_FAILED, reason, NULL) == 0)
		telemetry_job_finished(JOB_FAILED);
}

static int write_job_file(supervisor *sv, run *r, const char *dataset_dir, const char *resume)
{
	char path[1200];
	json_t *devs = json_array();
	for (int i = 0; i < r->ndev; i++) {
		const device *d = &sv->devs[r->dev[i]];
		json_array_append_new(devs, json_pack("{s:s, s:i}", "kind", device_kind_name(d->kind),
						      "index", d->index));
	}
	for (int i = 0; r->multinode && i < r->world; i++) /* rank i: local device i % per_node there */
		json_array_append_new(devs, json_pack("{s:s, s:i}", "kind", multinode_kind(sv, r), "index",
						      i % r->per_node));
	char ck[1100], ex[1100], shm[80];
	snprintf(ck, sizeof ck, "%s/checkpoints", r->dir);
	snprintf(ex, sizeof ex, "%s/export", r->dir);
	shm_name_for(r->id, shm, sizeof shm);
	json_t *job = json_pack("{s:s, s:O, s:s, s:s, s:s, s:s, s:o, s:i}", "job_id", r->id, "spec", r->spec,
				"dataset_dir", dataset_dir, "checkpoint_dir", ck, "export_dir", ex, "shm_name", shm,
				"devices", devs, "world_size", r->world);
	json_object_set_new(job, "resume_from", resume && *resume ? json_string(resume) : json_null());
	json_t *mix = json_object_get(r->spec, "dataset");
	if (json_is_array(mix)) { /* a mixture: one directory per component, in the spec's order */
		json_t *dirs = json_array();
		size_t i;
		json_t *e;
		json_array_foreach(mix, i, e) {
			char d[1200];
			snprintf(d, sizeof d, "%s/datasets/%s", sv->dataset_root,
				 json_string_value(json_object_get(e, "name")));
			json_array_append_new(dirs, json_string(d));
		}
		json_object_set_new(job, "dataset_dirs", dirs);
	}
	char *text = json_dumps(job, JSON_INDENT(2) | JSON_SORT_KEYS);
	json_decref(job);
	if (!text)
		return -ENOMEM;
	snprintf(path, sizeof path, "%s/job.json", r->dir);
	int rc = fs_write_atomic(path, text, strlen(text), 0640);
	free(text);
	return rc;
}

/* A stored spec, normalized again: a job queued by an older bertd lacks
 * keys added since, and normalizing an effective spec only fills those
 * defaults (docs/jobspec.md). NULL when it is not JSON or not a valid spec. */
static json_t *stored_spec_load(const char *spec_json)
{
	json_t *in = json_loads(spec_json, 0, NULL), *out = NULL;
	jobspec_error jerr;
	if (in && jobspec_normalize(in, &out, &jerr) < 0)
		out = NULL;
	json_decref(in);
	return out;
}

/* A multi-node job (resources.nodes > 1): srun starts its world ranks on
 * Slurm's nodes; they join through the relay. No device of this machine is
 * taken (Slurm places the ranks). r is start_job's, spec checked. */
static int start_multinode(supervisor *sv, run *r, const store_job *j, const jobspec *spec,
			   const char *dataset_dir, const char *resume, int64_t resume_step, unsigned from)
{
	char reason[1400];
	int rc;
	r->multinode = true;
	r->ca.listen_fd = -1;
	r->nodes = spec->nodes;
	r->per_node = spec->gpus_per_node;
	r->world = spec->gpus;
	if (!sv->cfg.slurm_srun || !*sv->cfg.slurm_srun) {
		snprintf(reason, sizeof reason,
			 "resources.nodes is %d: multi-node jobs are started with Slurm, and this bertd has no "
			 "slurm_srun set (docs/multinode.md)", spec->nodes);
		fail_job_now(sv, j->id, from, reason);
		run_free(r);
		return 0;
	}
	r->rank_node = calloc((size_t)r->world, sizeof *r->rank_node);
	r->rank_sha = calloc((size_t)r->world, sizeof *r->rank_sha);
	rc = r->rank_node && r->rank_sha ? cluster_attempt_open(&r->ca, sv->cfg.relay_host, r->id) : -ENOMEM;
	if (rc == 0 && (rc = loop_add(sv->lp, r->ca.listen_fd, EPOLLIN, on_relay_accept, r)) < 0)
		cluster_attempt_close(&r->ca);
	if (rc == 0 && sv->cfg.relay_timeout_ms > 0)
		r->ca.relay_timeout_ms = sv->cfg.relay_timeout_ms;
	if (rc == 0 && (rc = write_job_file(sv, r, dataset_dir, resume)) == 0)
		rc = cluster_fence_open(&r->ca, r->dir); /* this attempt's ranks may write */
	if (rc < 0)
		relay_close_all(sv, r);
	if (rc < 0) {
		snprintf(reason, sizeof reason, "cannot set up the multi-node attempt: %s", strerror(-rc));
		fail_job_now(sv, j->id, from, reason);
		run_free(r);
		return 0;
	}
	if (resume[0])
		snprintf(reason, sizeof reason, "resuming from checkpoint at step %lld on %d nodes x %d %s (Slurm)",
			 (long long)resume_step, r->nodes, r->per_node, multinode_kind(sv, r));
	else
		snprintf(reason, sizeof reason, "starting on %d nodes x %d %s (Slurm)", r->nodes, r->per_node,
			 multinode_kind(sv, r));
	if (store_job_transition(sv->st, j->id, from, JOB_STARTING, reason, NULL) < 0) {
		run_free(r); /* someone canceled it meanwhile */
		return 0;
	}
	store_job_set_stall(sv->st, r->id, NULL);
	r->start_ms = r->last_msg_ms = now_ms();
	r->stall_noted = -1;
	r->runtime_base_ms = j->runtime_ms;
	r->max_runtime_ms = runtime_left_ms(spec, j->runtime_ms);
	r->next = sv->runs;
	sv->runs = r;

	char job_json[1200], worker_bin[1100];
	snprintf(job_json, sizeof job_json, "%s/job.json", r->dir);
	snprintf(worker_bin, sizeof worker_bin, "%s/bertd-worker", sv->bin_dir);
	snprintf(r->launch_log, sizeof r->launch_log, "%s/logs/srun.log", r->dir);
	cluster_argv av;
	cluster_srun_argv(&av, sv->cfg.slurm_srun, r->nodes, r->per_node,
			  sv->cfg.slurm_gpus_per_node && strcmp(multinode_kind(sv, r), "cuda") == 0 ? r->per_node : 0,
			  sv->cfg.slurm_immediate_s,
			  &r->ca, worker_bin, job_json);
	childenv *henv = NULL;
	cluster_env *env = NULL;
	/* a rank there gets the threads a rank here would (nodes are alike) */
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int threads = strcmp(multinode_kind(sv, r), "cpu") == 0 && ncpu > 0 && sv->ndev
			      ? (int)(ncpu / (long)sv->ndev) : 1;
	if ((rc = childenv_helper(&henv, &sv->pass_env, environ)) == 0 &&
	    (rc = cluster_srun_env(&env, henv->envp, threads > 0 ? threads : 1, &r->ca, sv->cfg.slurm_conf)) == 0)
		rc = spawn_child(sv, r, ROLE_LAUNCHER, 0, av.argv, env->envp, r->launch_log);
	free(env);
	free(henv);
	if (rc < 0) {
		set_failure(r, false, "cannot start srun (%s): %s", sv->cfg.slurm_srun, strerror(-rc));
		run_kill_all(r, SIGKILL);
		run_maybe_finish(sv, r);
		return 0;
	}
	log_info("job %s: %s", j->id, reason);
	return 0;
}

/* init_from_restore "all": dir, a .../ckpt-<step> of another job, as the
 * checkpoint to resume from, checked as one of the job's own would be.
 * 0 with path and *step set, or -EINVAL with reason. */
static int restore_from_init(const char *dir, char *path, size_t cap, int64_t *step, char *reason, size_t rcap)
{
	const char *base = strrchr(dir, '/');
	long long s;
	char tail, why[1100];
	if (!base || sscanf(base, "/ckpt-%lld%c", &s, &tail) != 1 || s < 0)
		snprintf(why, sizeof why, "%s is not a .../ckpt-<step> directory", dir);
	else if (resume_check(dir, s, why, sizeof why) == 0) {
		snprintf(path, cap, "%s", dir);
		*step = s;
		return 0;
	}
	snprintf(reason, rcap, "init_from_restore \"all\": the checkpoint to continue from is unusable (%s)", why);
	return -EINVAL;
}

static int start_job(supervisor *sv, const store_job *j, const int *dev, int ndev, bool resumed)
{
	char reason[1400];
	run *r = calloc(1, sizeof *r);
	if (!r)
		return -ENOMEM;
	r->sv = sv;
	snprintf(r->id, sizeof r->id, "%s", j->id);
	job_dir(sv, j->id, r->dir, sizeof r->dir);
	r->spec = stored_spec_load(j->spec_json);
	jobspec spec;
	jobspec_error jerr;
	unsigned from = JOB_MASK(resumed ? JOB_RESTARTING : JOB_QUEUED);
	if (!r->spec || jobspec_from_json(r->spec, &spec, &jerr) < 0) {
		fail_job_now(sv, j->id, from, "stored job spec is unreadable");
		run_free(r);
		return 0;
	}
	/* every dataset of the job (a mixture's components) exists and is ready */
	for (int k = 0; k < spec.n_datasets; k++) {
		store_dataset ds;
		const char *dn = spec.datasets[k].name;
		if (store_dataset_get_by_name(sv->st, dn, &ds) < 0) {
			snprintf(reason, sizeof reason, "dataset \"%s\" does not exist (POST /v1/datasets first)", dn);
			fail_job_now(sv, j->id, from, reason);
			run_free(r);
			return 0;
		}
		bool ready = ds.state == DATASET_READY;
		store_dataset_free(&ds);
		if (!ready) {
			snprintf(reason, sizeof reason, "dataset \"%s\" is not ready", dn);
			fail_job_now(sv, j->id, from, reason);
			run_free(r);
			return 0;
		}
	}
	/* the first component's; write_job_file adds a mixture's "dataset_dirs" */
	char dataset_dir[1200];
	snprintf(dataset_dir, sizeof dataset_dir, "%s/datasets/%s", sv->dataset_root, spec.datasets[0].name);

	char logs[1100], ckdir[1100];
	snprintf(logs, sizeof logs, "%s/logs", r->dir);
	snprintf(ckdir, sizeof ckdir, "%s/checkpoints", r->dir);
	int rc;
	if ((rc = fs_mkdir_p(logs, 0750)) < 0 || (rc = fs_mkdir_p(ckdir, 0750)) < 0) {
		snprintf(reason, sizeof reason, "cannot create %s: %s", r->dir, strerror(-rc));
		fail_job_now(sv, j->id, from, reason);
		run_free(r);
		return 0;
	}
	char resume[1200];
	int64_t resume_step;
	pick_resume(sv, j->id, ckdir, resume, sizeof resume, &resume_step);
	/* init_from_restore "all": until it has checkpoints of its own, the job
	 * resumes from init_from's (docs/jobspec.md#init_from) */
	if (!resume[0] && strcmp(spec.init_from_restore, "all") == 0 &&
	    restore_from_init(spec.init_from, resume, sizeof resume, &resume_step, reason, sizeof reason) < 0) {
		fail_job_now(sv, j->id, from, reason);
		run_free(r);
		return 0;
	}
	if (spec.nodes > 1)
		return start_multinode(sv, r, j, &spec, dataset_dir, resume, resume_step, from);
	r->world = ndev;
	r->ndev = ndev;
	memcpy(r->dev, dev, sizeof(int) * (size_t)ndev);
	if ((rc = write_job_file(sv, r, dataset_dir, resume)) < 0) {
		snprintf(reason, sizeof reason, "cannot write job.json: %s", strerror(-rc));
		fail_job_now(sv, j->id, from, reason);
		run_free(r);
		return 0;
	}
	if (resume[0])
		snprintf(reason, sizeof reason, "resuming from checkpoint at step %lld on %d device(s)",
			 (long long)resume_step, ndev);
	else
		snprintf(reason, sizeof reason, "starting on %d %s device(s)", ndev,
			 device_kind_name(sv->devs[dev[0]].kind));
	if (spec.max_runtime_seconds > 0 && j->runtime_ms > 0) {
		size_t used = strlen(reason);
		snprintf(reason + used, sizeof reason - used, "; %.1f s of stopping_condition.max_runtime_seconds left "
			 "(%.1f s used)", (double)runtime_left_ms(&spec, j->runtime_ms) / 1000.0,
			 (double)j->runtime_ms / 1000.0);
	}
	if (store_job_transition(sv->st, j->id, from, JOB_STARTING, reason, NULL) < 0) {
		run_free(r); /* someone canceled it meanwhile */
		return 0;
	}
	for (int i = 0; i < ndev; i++)
		sv->dev_job[dev[i]] = strdup(r->id);
	store_job_set_stall(sv->st, r->id, NULL); /* a suspect of an attempt before (a daemon that died) */
	json_t *dj = json_array();
	for (int i = 0; i < ndev; i++)
		json_array_append_new(dj, json_pack("{s:i, s:s, s:i, s:s}", "id", dev[i], "kind",
						    device_kind_name(sv->devs[dev[i]].kind), "index",
						    sv->devs[dev[i]].index, "name", sv->devs[dev[i]].name));
	char *djs = json_dumps(dj, JSON_COMPACT);
	store_job_set_devices(sv->st, r->id, djs);
	free(djs);
	json_decref(dj);
	unsigned nvidx[64];
	int ngpu = 0;
	for (int i = 0; i < ndev; i++)
		if (sv->devs[dev[i]].kind == DEVICE_CUDA)
			nvidx[ngpu++] = (unsigned)sv->devs[dev[i]].index;
	if (tsampler_create(&r->ts, nvidx, ngpu) < 0)
		r->ts = NULL; /* telemetry is optional; training is not */
	r->start_ms = r->last_msg_ms = now_ms();
	r->stall_noted = -1;
	r->runtime_base_ms = j->runtime_ms;
	r->max_runtime_ms = runtime_left_ms(&spec, j->runtime_ms);
	r->next = sv->runs;
	sv->runs = r;

	char job_json[1200], worker_bin[1100], loader_bin[1100];
	snprintf(job_json, sizeof job_json, "%s/job.json", r->dir);
	snprintf(worker_bin, sizeof worker_bin, "%s/bertd-worker", sv->bin_dir);
	snprintf(loader_bin, sizeof loader_bin, "%s/bertd-loader", sv->bin_dir);
	int threads = 1;
	{
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
		if (sv->devs[dev[0]].kind == DEVICE_CPU && ncpu > 0)
			threads = (int)(ncpu / (long)sv->ndev) > 0 ? (int)(ncpu / (long)sv->ndev) : 1;
	}
	for (int l = 0; l < spec.training.dataloader_num_workers && rc == 0; l++) {
		char idx[16], cnt[16], logp[1200];
		snprintf(idx, sizeof idx, "%d", l);
		snprintf(cnt, sizeof cnt, "%d", spec.training.dataloader_num_workers);
		snprintf(logp, sizeof logp, "%s/loader-%d.log", logs, l);
		char *argv[] = {loader_bin, "--job", job_json, "--index", idx, "--count", cnt, NULL};
		childenv *env;
		if ((rc = childenv_helper(&env, &sv->pass_env, environ)) < 0)
			break;
		rc = spawn_child(sv, r, ROLE_LOADER, l, argv, env->envp, logp);
		free(env);
	}
	for (int k = 0; k < ndev && rc == 0; k++) {
		const device *d = &sv->devs[dev[k]];
		char rank[16], logp[1200];
		snprintf(rank, sizeof rank, "%d", k);
		snprintf(logp, sizeof logp, "%s/worker-%d.log", logs, k);
		char *argv[] = {worker_bin, "--job", job_json, "--rank", rank, NULL};
		childenv *env;
		if ((rc = childenv_worker(&env, &sv->pass_env, d, threads, environ)) < 0)
			break;
		rc = spawn_child(sv, r, ROLE_WORKER, k, argv, env->envp, logp);
		free(env);
	}
	if (rc < 0) {
		set_failure(r, false, "cannot start the job's processes: %s", strerror(-rc));
		run_kill_all(r, SIGKILL);
		run_maybe_finish(sv, r);
		return 0;
	}
	log_info("job %s: %s", j->id, reason);
	return 0;
}

static void unlink_run(supervisor *sv, run *r)
{
	for (run **pp = &sv->runs; *pp; pp = &(*pp)->next) {
		if (*pp == r) {
			*pp = r->next;
			return;
		}
	}
}

static void free_dev_ids(supervisor *sv, run *r)
{
	for (int i = 0; i < r->ndev; i++) {
		int d = r->dev[i];
		if (d >= 0 && (size_t)d < sv->ndev) {
			free((char *)sv->dev_job[d]);
			sv->dev_job[d] = NULL;
		}
	}
	r->ndev = 0;
}

#define PREPARE_MAX_KILLS 3

/* How often dataset id's bertd-prepare was killed from outside, counting
 * this time. */
static int prepare_killed(supervisor *sv, const char *id)
{
	for (size_t i = 0; i < sizeof sv->prep_kills / sizeof sv->prep_kills[0]; i++)
		if (strcmp(sv->prep_kills[i].id, id) == 0)
			return ++sv->prep_kills[i].n;
	struct prepare_kills *k = &sv->prep_kills[sv->prep_kills_next];
	sv->prep_kills_next = (sv->prep_kills_next + 1) % (int)(sizeof sv->prep_kills / sizeof sv->prep_kills[0]);
	snprintf(k->id, sizeof k->id, "%s", id);
	return k->n = 1;
}

/* A canceled preparation's output: its work directory (bertd-prepare's
 * ".<name>.partial", and "<out>.tmp-<pid>" of older ones) and <out> itself
 * if it was renamed into place just before, unless another preparation of
 * the same name runs now (deleted and submitted again). */
static void remove_prepare_output(supervisor *sv, run *r)
{
	const char *name = json_string_value(json_object_get(r->spec, "name"));
	for (run *o = sv->runs; o; o = o->next)
		if (o != r && o->is_dataset && name &&
		    json_equal(json_object_get(o->spec, "name"), json_object_get(r->spec, "name")))
			return;
	char tmp[1100];
	int rc;
	for (int i = 0; i < r->nkids; i++) {
		snprintf(tmp, sizeof tmp, "%s.tmp-%ld", r->dir, (long)r->kids[i]->p.pid);
		if ((rc = fs_remove_tree(tmp)) < 0)
			log_warn("dataset %s: cannot remove %s: %s", r->id, tmp, strerror(-rc));
	}
	if (r->dir[0] && (rc = fs_remove_tree(r->dir)) < 0)
		log_warn("dataset %s: cannot remove %s: %s", r->id, r->dir, strerror(-rc));
	if (r->dir[0] && fs_partial_dir(r->dir, tmp, sizeof tmp) == 0 && (rc = fs_remove_tree(tmp)) < 0)
		log_warn("dataset %s: cannot remove %s: %s", r->id, tmp, strerror(-rc));
}

/* All children gone: decide the job's (or dataset's) next state. */
static void run_maybe_finish(supervisor *sv, run *r)
{
	if (r->alive > 0)
		return;
	unlink_run(sv, r);
	if (r->is_dataset) {
		/* killed by a signal not ours (OOM killer, kill -9): prepared
		 * again, continuing from its finished shards, a few times */
		if (r->failed && r->prep_signaled && !r->canceled && !r->shutdown) {
			int kills = prepare_killed(sv, r->id);
			if (kills <= PREPARE_MAX_KILLS &&
			    store_dataset_phase(sv->st, r->id, "queued", 0.0) == 0) {
				log_warn("dataset %s: %s; preparing it again from its finished shards "
					 "(%d of %d)", r->id, r->reason, kills, PREPARE_MAX_KILLS);
				run_free(r);
				return;
			}
		}
		/* canceled, or failed (a kill skips bertd-prepare's own cleanup) */
		if (r->canceled || r->failed)
			remove_prepare_output(sv, r);
		if (r->failed) {
			/* canceled: the row says so already (-EBUSY here leaves it) */
			store_dataset_finish(sv->st, r->id, DATASET_FAILED, r->reason, NULL);
		} else {
			/* bertd-prepare's last line carried the stats */
			store_dataset_finish(sv->st, r->id, DATASET_READY, NULL, NULL);
		}
		log_info("dataset %s %s%s", r->id, r->failed ? "failed: " : "ready", r->failed ? r->reason : "");
		run_free(r);
		return;
	}
	char shm[120];
	shm_name_for(r->id, shm, sizeof shm);
	shm_unlink(shm); /* whoever created it, the job is over */
	snprintf(shm, sizeof shm, "/bertd-%s-comm", r->id);
	shm_unlink(shm);
	free_dev_ids(sv, r);
	if (r->multinode) {
		relay_close_all(sv, r);
		cluster_fence_close(&r->ca); /* a rank still running somewhere writes nothing now */
		/* srun is gone; whatever its step left on a node goes too */
		cluster_scancel(&r->ca, sv->cfg.slurm_srun, sv->cfg.slurm_conf);
	}
	note_stall(sv, r, NULL, 0, 0, false); /* the attempt is over: nothing is silent now */
	note_runtime(sv, r);

	store_job cur;
	if (store_job_get(sv->st, r->id, &cur) < 0) {
		run_free(r);
		return;
	}
	enum job_state state = cur.state;
	int restarts = cur.restart_count;
	store_job_free(&cur);
	unsigned live = JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING) | JOB_MASK(JOB_STOPPING);
	jobspec spec;
	jobspec_error jerr;
	int max_restarts = jobspec_from_json(r->spec, &spec, &jerr) == 0 ? spec.max_restarts : 0;

	if (r->shutdown) {
		store_job_transition(sv->st, r->id, live, JOB_QUEUED, "daemon shutting down; resumes on next start",
				     NULL);
	} else if (state == JOB_STOPPING && (!r->failed || r->stop_sent)) {
		if (store_job_transition(sv->st, r->id, JOB_MASK(JOB_STOPPING), JOB_CANCELED,
					 r->reason[0] && !r->stop_sent ? r->reason
					 : r->stop_why ? r->stop_why : "canceled by user", NULL) == 0)
			telemetry_job_finished(JOB_CANCELED);
	} else if (!r->failed) {
		if (store_job_transition(sv->st, r->id, live, JOB_COMPLETED, "training finished", NULL) == 0)
			telemetry_job_finished(JOB_COMPLETED);
	} else if (r->retryable && restarts < max_restarts) {
		int n = 0;
		store_job_bump_restarts(sv->st, r->id, &n);
		char why[640];
		snprintf(why, sizeof why, "%s; restart %d of %d from the last checkpoint", r->reason, n, max_restarts);
		store_job_transition(sv->st, r->id, live, JOB_RESTARTING, why, NULL);
		telemetry_job_restarted();
		log_info("job %s: %s", r->id, why);
	} else {
		char why[640];
		snprintf(why, sizeof why, "%s%s", r->reason,
			 r->retryable ? " (no restarts left)" : "");
		if (store_job_transition(sv->st, r->id, live, JOB_FAILED, why, NULL) == 0)
			telemetry_job_finished(JOB_FAILED);
		log_warn("job %s failed: %s", r->id, why);
	}
	run_free(r);
}

/* ---- datasets ---- */

/* Removes "<name>.tmp-<pid>" in dsdir: the working directory of a
 * bertd-prepare killed together with an earlier daemon (kill -9), which
 * its own cleanup never removed. One that is another dataset's name ('.'
 * and '-' are allowed in names) is kept. */
static void remove_stale_prepare_tmp(supervisor *sv, const char *dsdir, const char *name)
{
	DIR *d = opendir(dsdir);
	if (!d)
		return;
	size_t nl = strlen(name);
	struct dirent *e;
	while ((e = readdir(d))) {
		const char *pid = e->d_name + nl + 5;
		if (strncmp(e->d_name, name, nl) != 0 || strncmp(e->d_name + nl, ".tmp-", 5) != 0 || !*pid ||
		    strspn(pid, "0123456789") != strlen(pid))
			continue;
		store_dataset other;
		if (store_dataset_get_by_name(sv->st, e->d_name, &other) == 0) {
			store_dataset_free(&other);
			continue;
		}
		char path[1400];
		snprintf(path, sizeof path, "%s/%s", dsdir, e->d_name);
		int rc = fs_remove_tree(path);
		if (rc < 0)
			log_warn("dataset %s: cannot remove stale %s: %s", name, path, strerror(-rc));
		else
			log_info("dataset %s: removed %s, left by a bertd-prepare that was killed", name, path);
	}
	closedir(d);
}

static int start_prepare(supervisor *sv, const store_dataset *ds)
{
	run *r = calloc(1, sizeof *r);
	if (!r)
		return -ENOMEM;
	r->is_dataset = true;
	r->sv = sv;
	snprintf(r->id, sizeof r->id, "%s", ds->id);
	r->spec = json_loads(ds->spec_json, 0, NULL);
	if (!r->spec) {
		store_dataset_finish(sv->st, ds->id, DATASET_FAILED, "stored request is unreadable", NULL);
		run_free(r);
		return 0;
	}
	char outdir[1200], logdir[1100], logp[1200], bin[1100];
	snprintf(outdir, sizeof outdir, "%s/datasets/%s", sv->dataset_root, ds->name);
	snprintf(logdir, sizeof logdir, "%s/datasets", sv->state_dir);
	snprintf(logp, sizeof logp, "%s/%s.log", logdir, ds->name);
	snprintf(bin, sizeof bin, "%s/bertd-prepare", sv->bin_dir);
	char dsdir[1200];
	snprintf(dsdir, sizeof dsdir, "%s/datasets", sv->dataset_root);
	int rc;
	if ((rc = fs_mkdir_p(logdir, 0750)) < 0 || (rc = fs_mkdir_p(dsdir, 0750)) < 0) {
		char why[1400];
		snprintf(why, sizeof why, "cannot create %s: %s", dsdir, strerror(-rc));
		store_dataset_finish(sv->st, ds->id, DATASET_FAILED, why, NULL);
		run_free(r);
		return 0;
	}
	/* Not ready in the store, so anything at outdir is a previous attempt's
	 * (a daemon that died after bertd-prepare renamed it into place). The
	 * work directory beside it stays: bertd-prepare continues from it. */
	if ((rc = fs_remove_tree(outdir)) < 0)
		log_warn("dataset %s: cannot remove stale %s: %s", ds->name, outdir, strerror(-rc));
	remove_stale_prepare_tmp(sv, dsdir, ds->name);
	snprintf(r->dir, sizeof r->dir, "%s", outdir);
	/* The request was validated by the API; pass it on as options. */
	/* options, 64 roots, 64 sources, 64 include and 64 exclude patterns */
	const char *argv[40 + 2 * 64 + 64 + 4 * 64];
	int a = 0;
	char fd[8];
	snprintf(fd, sizeof fd, "%d", PROC_CHILD_FD);
	argv[a++] = bin;
	argv[a++] = "--output";
	argv[a++] = outdir;
	argv[a++] = "--progress-fd";
	argv[a++] = fd;
	const char *fmt = json_string_value(json_object_get(r->spec, "format"));
	if (fmt) {
		argv[a++] = "--format";
		argv[a++] = fmt;
	}
	const char *tf = json_string_value(json_object_get(r->spec, "text_field"));
	if (tf) {
		argv[a++] = "--text-field";
		argv[a++] = tf;
	}
	json_t *vocab = json_object_get(r->spec, "vocab");
	const char *vfile = json_string_value(json_object_get(vocab, "file"));
	json_t *train = json_object_get(vocab, "train");
	char vsize[24];
	if (vfile) {
		argv[a++] = "--vocab";
		argv[a++] = vfile;
	} else if (train) {
		snprintf(vsize, sizeof vsize, "%lld", (long long)json_integer_value(json_object_get(train, "vocab_size")));
		argv[a++] = "--train-vocab";
		argv[a++] = vsize;
	}
	json_t *lower = json_object_get(r->spec, "lowercase");
	if (json_is_boolean(lower)) /* null: bertd-prepare infers it from the vocab */
		argv[a++] = json_is_true(lower) ? "--lowercase" : "--cased";
	/* Reading stays under the data roots the request was checked against
	 * (a request stored before they were recorded: the first one). */
	json_t *roots = json_object_get(r->spec, "roots");
	size_t nroots = 0;
	for (size_t i = 0; i < json_array_size(roots) && nroots < 64; i++) {
		const char *root = json_string_value(json_array_get(roots, i));
		if (root) {
			argv[a++] = "--root";
			argv[a++] = root;
			nroots++;
		}
	}
	if (nroots == 0) {
		argv[a++] = "--root";
		argv[a++] = sv->dataset_root;
	}
	/* threads (default 1: prepare_concurrency preparations take one CPU
	 * each, also for requests stored before it existed), and
	 * max_sentence_tokens, shard_tokens (absent in those: bertd-prepare's
	 * defaults, the same) */
	static const char *const opt_key[] = {"threads", "max_sentence_tokens", "shard_tokens"};
	static const char *const opt_opt[] = {"--jobs", "--max-sentence-tokens", "--shard-tokens"};
	char opt_val[3][24];
	for (int i = 0; i < 3; i++) {
		json_t *v = json_object_get(r->spec, opt_key[i]);
		if (!json_is_integer(v) && i > 0)
			continue;
		snprintf(opt_val[i], sizeof opt_val[i], "%lld", json_is_integer(v) ? (long long)json_integer_value(v) : 1);
		argv[a++] = opt_opt[i];
		argv[a++] = opt_val[i];
	}
	static const char *const lim_key[] = {"max_depth", "max_files", "max_bytes"};
	static const char *const lim_opt[] = {"--max-depth", "--max-files", "--max-bytes"};
	char lim_val[3][24];
	json_t *limits = json_object_get(r->spec, "limits");
	for (int i = 0; i < 3; i++) {
		json_t *v = json_object_get(limits, lim_key[i]);
		if (!json_is_integer(v))
			continue; /* bertd-prepare's default */
		snprintf(lim_val[i], sizeof lim_val[i], "%lld", (long long)json_integer_value(v));
		argv[a++] = lim_opt[i];
		argv[a++] = lim_val[i];
	}
	static const char *const pat_key[] = {"include", "exclude"};
	static const char *const pat_opt[] = {"--include", "--exclude"};
	for (int k = 0; k < 2; k++) {
		json_t *pats = json_object_get(r->spec, pat_key[k]);
		for (size_t i = 0; i < json_array_size(pats) && i < 64; i++) {
			const char *pat = json_string_value(json_array_get(pats, i));
			if (pat) {
				argv[a++] = pat_opt[k];
				argv[a++] = pat;
			}
		}
	}
	argv[a++] = "--";
	/* several sources (paths or patterns); a request stored before lists: its one */
	json_t *srcs = json_object_get(r->spec, "source_paths");
	size_t nsrc = 0;
	for (size_t i = 0; i < json_array_size(srcs) && nsrc < 64; i++)
		if ((argv[a] = json_string_value(json_array_get(srcs, i))))
			a++, nsrc++;
	if (nsrc == 0)
		argv[a++] = json_string_value(json_object_get(r->spec, "source_path"));
	argv[a] = NULL;
	childenv *env = NULL;
	r->next = sv->runs;
	sv->runs = r;
	/* phase "queued" (as inserted) becomes "starting": the API shows it
	 * preparing from now on, before the process exists, so whoever sees
	 * the process sees it preparing */
	store_dataset_phase(sv->st, ds->id, "starting", 0.0);
	rc = childenv_helper(&env, &sv->pass_env, environ);
	if (rc == 0)
		rc = spawn_child(sv, r, ROLE_PREPARE, 0, (char *const *)argv, env->envp, logp);
	free(env);
	if (rc < 0) {
		set_failure(r, false, "cannot start bertd-prepare: %s", strerror(-rc));
		run_maybe_finish(sv, r);
		return 0;
	}
	log_info("dataset %s (%s): preparing into %s", ds->id, ds->name, outdir);
	return 0;
}

static run *find_run(supervisor *sv, const char *id)
{
	for (run *r = sv->runs; r; r = r->next)
		if (strcmp(r->id, id) == 0)
			return r;
	return NULL;
}

/* ---- the tick ---- */

static void tick_datasets(supervisor *sv)
{
	store_dataset *ds = NULL;
	size_t n = 0;
	if (store_dataset_list(sv->st, &ds, &n) < 0)
		return;
	/* At most prepare_concurrency bertd-prepare at once (one being killed
	 * still counts: it still holds its CPU until it is reaped); the list is
	 * oldest first, so the oldest waiting dataset starts next. */
	int running = 0;
	for (run *r = sv->runs; r; r = r->next)
		running += r->is_dataset;
	for (size_t i = 0; i < n && running < sv->prepare_limit; i++)
		if (ds[i].state == DATASET_PREPARING && !find_run(sv, ds[i].id)) {
			start_prepare(sv, &ds[i]);
			running++;
		}
	/* A preparation whose row is no longer preparing (DELETE canceled it,
	 * or deleted it) is stopped: nothing it writes now would be used. */
	for (run *r = sv->runs; r; r = r->next) {
		if (!r->is_dataset || r->killing)
			continue;
		bool live = false;
		for (size_t i = 0; i < n; i++)
			live |= strcmp(ds[i].id, r->id) == 0 && ds[i].state == DATASET_PREPARING;
		if (live)
			continue;
		r->canceled = true;
		set_failure(r, false, "canceled while preparing");
		log_info("dataset %s: canceled; stopping bertd-prepare", r->id);
		run_kill_all(r, SIGKILL);
	}
	store_datasets_free(ds, n);
}

static int64_t wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Records (or, c NULL, clears) the rank the stall watch suspects, in the
 * store where the diagnosis reads it (store_job.stall_json). */
static void note_stall(supervisor *sv, run *r, const child *c, int64_t silent_ms, int64_t limit_ms, bool stopped)
{
	if (!c) {
		if (r->stall_noted >= 0)
			store_job_set_stall(sv->st, r->id, NULL);
		r->stall_noted = -1;
		return;
	}
	if (r->stall_noted == c->index)
		return;
	json_t *o = json_pack("{s:i, s:I, s:I, s:b}", "rank", c->index, "since_ms",
			      (json_int_t)(wall_ms() - silent_ms), "limit_s", (json_int_t)(limit_ms / 1000),
			      "stopped", stopped);
	char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
	if (text && store_job_set_stall(sv->st, r->id, text) == 0)
		r->stall_noted = c->index;
	free(text);
	json_decref(o);
}

/* The stall watch (see the top of this file). Picks the worker furthest
 * into its limit (a stopped process first); past a quarter of it, the rank
 * is noted for the diagnosis; past the limit, the job's processes are
 * killed and the attempt fails as retryable. */
static void check_stall(supervisor *sv, run *r, int64_t now)
{
	int64_t timeout = sv->cfg.stall_timeout_ms;
	int64_t job_limit = timeout;
	if (!r->stepping)
		job_limit = timeout > SUPERVISOR_STARTUP_ALLOWANCE_MS ? timeout : SUPERVISOR_STARTUP_ALLOWANCE_MS;
	else if (2 * r->max_gap_ms > job_limit)
		job_limit = 2 * r->max_gap_ms;
	child *who = NULL;
	int64_t who_silent = 0, who_limit = 1;
	bool who_stopped = false;
	for (int i = 0; i < r->nkids; i++) {
		child *c = r->kids[i];
		if (c->role != ROLE_WORKER || c->exited)
			continue;
		bool own = c->heartbeat && r->stepping;
		int64_t silent = now - (own ? c->last_msg_ms : r->last_msg_ms);
		int64_t limit = own ? timeout : job_limit;
		if (4 * silent <= limit)
			continue; /* not even suspect */
		char state = 0;
		if (!c->relayed) /* a rank on another node: no process to look at here */
			procstat_starttime(c->p.pid, &state);
		bool stopped = state == 'T' || state == 't';
		/* furthest into its limit; ties (ranks judged by the job's
		 * silence) go to the one whose own last message is oldest */
		bool better = !who || (stopped && !who_stopped);
		if (who && stopped == who_stopped) {
			double x = (double)silent / (double)limit, y = (double)who_silent / (double)who_limit;
			better = x > y || (x == y && c->last_msg_ms < who->last_msg_ms);
		}
		if (better) {
			who = c;
			who_silent = silent;
			who_limit = limit;
			who_stopped = stopped;
		}
	}
	if (!who) {
		note_stall(sv, r, NULL, 0, 0, false);
		return;
	}
	note_stall(sv, r, who, who_silent, who_limit, who_stopped);
	if (who_silent <= who_limit)
		return;
	set_failure(r, true, "rank %d made no progress for %lld s (%s; last reported step %lld)", who->index,
		    (long long)(who_limit / 1000),
		    !r->stepping ? "before its first step" : who->heartbeat && r->stepping ? "stall_timeout_s"
		    : "stall_timeout_s, or twice the longest gap between its reports",
		    (long long)r->last_step);
	log_warn("job %s: rank %d silent for %lld ms%s; killing the attempt", r->id, who->index,
		 (long long)who_silent, who_stopped ? " (its process is stopped)" : "");
	run_kill_all(r, SIGKILL);
}

static void tick_running(supervisor *sv)
{
	int64_t now = now_ms();
	for (run *r = sv->runs; r; r = r->next) {
		if (r->is_dataset)
			continue;
		if (r->killing) {
			if (now > r->stop_deadline_ms)
				for (int i = 0; i < r->nkids; i++)
					if (!r->kids[i]->exited && !r->kids[i]->relayed)
						proc_signal(&r->kids[i]->p, SIGKILL);
			continue;
		}
		store_job j;
		if (store_job_get(sv->st, r->id, &j) < 0)
			continue;
		bool stop = j.state == JOB_STOPPING;
		store_job_free(&j);
		if (!stop && r->max_runtime_ms && now - r->start_ms > r->max_runtime_ms) {
			store_job_transition(sv->st, r->id, JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING),
					     JOB_STOPPING, "stopping_condition.max_runtime_seconds reached", NULL);
			r->stop_why = "stopped at stopping_condition.max_runtime_seconds (checkpoint kept)";
			stop = true;
		}
		if (stop && !r->stop_sent) {
			json_t *m = json_pack("{s:s, s:s}", "type", "stop", "reason", "cancel");
			for (int i = 0; i < r->nkids; i++)
				if (r->kids[i]->role == ROLE_WORKER && !r->kids[i]->exited)
					msg_send(r->kids[i]->p.sock, m);
			json_decref(m);
			r->stop_sent = true;
			r->stop_deadline_ms = now + sv->cfg.stop_timeout_ms;
		} else if (r->stop_sent && now > r->stop_deadline_ms) {
			log_warn("job %s did not stop within %d ms; killing it", r->id, sv->cfg.stop_timeout_ms);
			run_kill_all(r, SIGKILL);
		} else if (!r->stop_sent) {
			check_stall(sv, r, now);
		}
	}
}

/* Whether the dataset named name is still being prepared (or waits in the
 * preparation queue). memo keeps the last answer: the queued jobs of a tick
 * mostly name the same dataset. */
typedef struct {
	char name[256];
	bool preparing;
} dataset_memo;

static bool dataset_preparing(supervisor *sv, const char *name, dataset_memo *memo)
{
	if (!name)
		return false;
	if (strcmp(memo->name, name) == 0)
		return memo->preparing;
	store_dataset ds;
	bool preparing = false;
	if (store_dataset_get_by_name(sv->st, name, &ds) == 0) {
		preparing = ds.state == DATASET_PREPARING;
		store_dataset_free(&ds);
	}
	snprintf(memo->name, sizeof memo->name, "%s", name);
	memo->preparing = preparing;
	return preparing;
}

/* A job's "dataset": one name, or a mixture's entries; true while any of
 * them is preparing. */
static bool job_data_preparing(supervisor *sv, json_t *ds, dataset_memo *memo)
{
	if (!json_is_array(ds))
		return dataset_preparing(sv, json_string_value(ds), memo);
	size_t i;
	json_t *e;
	json_array_foreach(ds, i, e)
		if (dataset_preparing(sv, json_string_value(json_object_get(e, "name")), memo))
			return true;
	return false;
}

static void tick_schedule(supervisor *sv)
{
	for (;;) {
		dataset_memo memo = {.name = ""};
		store_job *jobs = NULL;
		size_t n = 0;
		int64_t next = 0;
		if (store_job_list(sv->st, JOB_MASK(JOB_QUEUED) | JOB_MASK(JOB_RESTARTING), 0, 1000, &jobs, &n,
				   &next) < 0)
			return;
		/* restarting jobs that are still being torn down are not candidates */
		sched_job *q = calloc(n ? n : 1, sizeof *q);
		size_t *map = calloc(n ? n : 1, sizeof *map);
		size_t nq = 0;
		for (size_t i = 0; i < n; i++) {
			if (find_run(sv, jobs[i].id))
				continue;
			/* Only resources.gpus is needed here, every tick, for every
			 * queued job: read it without validating the whole spec
			 * (start_job does that). A spec without it asks for 1. */
			json_t *js = json_loads(jobs[i].spec_json, 0, NULL);
			json_t *g = json_object_get(json_object_get(js, "resources"), "gpus");
			int want = json_is_integer(g) && json_integer_value(g) >= 1 && json_integer_value(g) <= 64
					   ? (int)json_integer_value(g) : 1;
			/* a job waits for its dataset while it is queued or preparing */
			bool waits = job_data_preparing(sv, json_object_get(js, "dataset"), &memo);
			json_t *nodes = json_object_get(json_object_get(js, "resources"), "nodes");
			bool multinode = json_is_integer(nodes) && json_integer_value(nodes) > 1;
			json_decref(js);
			if (waits)
				continue;
			if (multinode) { /* Slurm places it, not this machine's device table */
				start_job(sv, &jobs[i], NULL, 0, jobs[i].state == JOB_RESTARTING);
				continue;
			}
			q[nq] = (sched_job){jobs[i].id, jobs[i].priority, jobs[i].seq, want};
			map[nq++] = i;
		}
		bool *busy = calloc(sv->ndev ? sv->ndev : 1, sizeof *busy);
		for (size_t d = 0; d < sv->ndev; d++)
			busy[d] = sv->dev_job[d] != NULL;
		int *dev = calloc(sv->ndev ? sv->ndev : 1, sizeof *dev);
		size_t pick = 0;
		enum sched_verdict v = sched_pick(q, nq, busy, sv->ndev, &pick, dev);
		bool again = false;
		if (v == SCHED_IMPOSSIBLE) {
			char why[200];
			snprintf(why, sizeof why, "asks for %d devices; this machine has %zu", q[pick].want, sv->ndev);
			fail_job_now(sv, q[pick].id, JOB_MASK(JOB_QUEUED) | JOB_MASK(JOB_RESTARTING), why);
			again = true;
		} else if (v == SCHED_START) {
			store_job *j = &jobs[map[pick]];
			start_job(sv, j, dev, q[pick].want, j->state == JOB_RESTARTING);
			again = true;
		}
		free(busy);
		free(dev);
		free(q);
		free(map);
		store_jobs_free(jobs, n);
		if (!again)
			return;
	}
}

/* Telemetry timer: one sample of every running job's devices, host CPU
 * and loaders (folded into its next metrics row). */
static void on_sample(loop *l, int fd, uint32_t events, void *arg)
{
	(void)l;
	(void)events;
	supervisor *sv = arg;
	uint64_t expirations;
	if (read(fd, &expirations, sizeof expirations) < 0)
		return;
	int64_t now = now_ms();
	for (run *r = sv->runs; r; r = r->next) {
		if (r->is_dataset || r->killing || !r->ts)
			continue;
		pid_t lp[TSAMPLER_MAX_LOADERS];
		int nl = 0;
		for (int i = 0; i < r->nkids && nl < TSAMPLER_MAX_LOADERS; i++)
			if (r->kids[i]->role == ROLE_LOADER && !r->kids[i]->exited)
				lp[nl++] = r->kids[i]->p.pid;
		tsampler_sample(r->ts, lp, nl, now);
	}
}

/* Telemetry is optional: without the timer jobs run, rows just lack samples. */
static void sample_timer_start(supervisor *sv)
{
	sv->sample_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (sv->sample_fd < 0) {
		log_warn("telemetry sampling off: timerfd: %s", strerror(errno));
		return;
	}
	struct itimerspec its = {
		.it_interval = {TELEMETRY_SAMPLE_MS / 1000, (TELEMETRY_SAMPLE_MS % 1000) * 1000000L},
		.it_value = {TELEMETRY_SAMPLE_MS / 1000, (TELEMETRY_SAMPLE_MS % 1000) * 1000000L},
	};
	if (timerfd_settime(sv->sample_fd, 0, &its, NULL) < 0 ||
	    loop_add(sv->lp, sv->sample_fd, EPOLLIN, on_sample, sv) < 0) {
		log_warn("telemetry sampling off: cannot arm its timer");
		close(sv->sample_fd);
		sv->sample_fd = -1;
	}
}

void supervisor_tick(supervisor *sv)
{
	tick_datasets(sv);
	tick_running(sv);
	if (!sv->cfg.hold_queue)
		tick_schedule(sv);
}

/* ---- lifecycle ---- */

/* Datasets left preparing by an earlier daemon are prepared again, each
 * when its turn in the queue comes (queued until then); bertd-prepare
 * continues from the shards the killed one finished. */
static void recover_datasets(supervisor *sv)
{
	store_dataset *ds = NULL;
	size_t n = 0;
	if (store_dataset_list(sv->st, &ds, &n) < 0)
		return;
	for (size_t i = 0; i < n; i++)
		if (ds[i].state == DATASET_PREPARING)
			store_dataset_phase(sv->st, ds[i].id, "queued", 0.0);
	store_datasets_free(ds, n);
}

static void recover(supervisor *sv)
{
	recover_datasets(sv);
	store_job *jobs = NULL;
	size_t n = 0;
	int64_t next = 0;
	unsigned mask = JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING) | JOB_MASK(JOB_STOPPING);
	if (store_job_list(sv->st, mask, 0, 100000, &jobs, &n, &next) < 0)
		return;
	for (size_t i = 0; i < n; i++) {
		char shm[120];
		shm_name_for(jobs[i].id, shm, sizeof shm);
		shm_unlink(shm); /* segments left by the previous daemon's job */
		snprintf(shm, sizeof shm, "/bertd-%s-comm", jobs[i].id);
		shm_unlink(shm);
		if (jobs[i].state == JOB_STOPPING)
			store_job_transition(sv->st, jobs[i].id, JOB_MASK(JOB_STOPPING), JOB_CANCELED,
					     "daemon restarted during cancel", NULL);
		else
			store_job_transition(sv->st, jobs[i].id, mask, JOB_RESTARTING,
					     "daemon restarted; resuming from the last checkpoint", NULL);
	}
	store_jobs_free(jobs, n);
}

int supervisor_create(supervisor **out, const supervisor_config *cfg, loop *lp, store *st,
		      const device *devices, size_t ndev)
{
	supervisor *sv = calloc(1, sizeof *sv);
	if (!sv)
		return -ENOMEM;
	sv->cfg = *cfg;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	if (ncpu < 1)
		ncpu = 1;
	sv->prepare_limit = cfg->prepare_concurrency > 0 ? cfg->prepare_concurrency
			    : cfg->prepare_concurrency == 0 ? (int)ncpu
			    : (int)(ncpu / 2 > 1 ? ncpu / 2 : 1);
	snprintf(sv->state_dir, sizeof sv->state_dir, "%s", cfg->state_dir);
	snprintf(sv->bin_dir, sizeof sv->bin_dir, "%s", cfg->bin_dir);
	snprintf(sv->dataset_root, sizeof sv->dataset_root, "%s", cfg->dataset_root);
	sv->cfg.state_dir = sv->state_dir;
	sv->cfg.bin_dir = sv->bin_dir;
	sv->cfg.dataset_root = sv->dataset_root;
	char why[300];
	if (childenv_pass_parse(&sv->pass_env, cfg->pass_env ? cfg->pass_env : "", why, sizeof why) < 0) {
		log_error("pass_env: %s", why);
		free(sv);
		return -EINVAL;
	}
	sv->cfg.pass_env = NULL; /* parsed into sv->pass_env */
	if (sv->cfg.stop_timeout_ms <= 0)
		sv->cfg.stop_timeout_ms = 120000;
	if (sv->cfg.stall_timeout_ms <= 0)
		sv->cfg.stall_timeout_ms = 300000;
	sv->lp = lp;
	sv->st = st;
	sv->sample_fd = -1;
	sv->devs = calloc(ndev ? ndev : 1, sizeof *sv->devs);
	sv->dev_job = calloc(ndev ? ndev : 1, sizeof *sv->dev_job);
	if (!sv->devs || !sv->dev_job) {
		supervisor_destroy(sv);
		return -ENOMEM;
	}
	memcpy(sv->devs, devices, ndev * sizeof *devices);
	sv->ndev = ndev;
	recover(sv);
	sample_timer_start(sv);
	*out = sv;
	return 0;
}

size_t supervisor_devices(supervisor *sv, const device **devs, const char *const **job_ids)
{
	*devs = sv->devs;
	*job_ids = sv->dev_job;
	return sv->ndev;
}

/* Waits until every worker of r has exited or deadline_ms (monotonic) has
 * passed, handling their messages meanwhile. Workers that exit are reaped
 * (proc_stop then finds them so). */
static void shutdown_wait_workers(supervisor *sv, run *r, int64_t deadline_ms)
{
	if (r->is_dataset)
		return;
	for (;;) {
		struct pollfd pfd[2 * MAX_CHILDREN];
		child *who[2 * MAX_CHILDREN];
		nfds_t n = 0;
		for (int i = 0; i < r->nkids; i++) {
			child *c = r->kids[i];
			if (c->role != ROLE_WORKER || c->exited || c->p.reaped || (c->relayed && c->sock_eof))
				continue;
			if (!c->relayed) { /* a relayed rank ends with its connection */
				pfd[n] = (struct pollfd){.fd = c->p.pidfd, .events = POLLIN};
				who[n++] = c;
			}
			if (c->p.sock >= 0 && !c->sock_eof) {
				pfd[n] = (struct pollfd){.fd = c->p.sock, .events = POLLIN};
				who[n++] = c;
			}
		}
		int64_t left = deadline_ms - now_ms();
		if (n == 0 || left <= 0)
			return;
		int rc = poll(pfd, n, (int)(left > 1000 ? 1000 : left));
		if (rc < 0 && errno != EINTR)
			return;
		for (nfds_t k = 0; rc > 0 && k < n; k++) {
			if (!pfd[k].revents)
				continue;
			child *c = who[k];
			drain_child(sv, r, c);
			if (pfd[k].fd == c->p.pidfd && proc_reap(&c->p) > 0)
				drain_child(sv, r, c); /* what it wrote just before exiting */
		}
	}
}

void supervisor_shutdown(supervisor *sv)
{
	if (!sv)
		return;
	json_t *m = json_pack("{s:s, s:s}", "type", "stop", "reason", "shutdown");
	for (run *r = sv->runs; r; r = r->next) {
		r->shutdown = true;
		for (int i = 0; i < r->nkids; i++) {
			child *c = r->kids[i];
			if (c->exited)
				continue;
			if (c->role == ROLE_WORKER)
				msg_send(c->p.sock, m);
			else if (c->role == ROLE_PREPARE)
				proc_signal(&c->p, SIGTERM);
		}
	}
	json_decref(m);
	/* Workers checkpoint and exit within the grace period (their loaders
	 * keep feeding them until then); what they report meanwhile is read,
	 * the stop checkpoint's report included. Then the rest is stopped. */
	int64_t deadline = now_ms() + sv->cfg.stop_timeout_ms;
	for (run *r = sv->runs; r; r = r->next)
		shutdown_wait_workers(sv, r, deadline);
	while (sv->runs) {
		run *r = sv->runs;
		for (int i = 0; i < r->nkids; i++) {
			child *c = r->kids[i];
			if (c->exited)
				continue;
			if (c->relayed) { /* srun (below) ends its process */
				relay_drop(sv, c);
				continue;
			}
			bool gentle = c->role == ROLE_LOADER || c->role == ROLE_LAUNCHER;
			int sig = gentle ? SIGTERM : 0;
			/* workers: the grace period is spent, so this kills what is left */
			proc_stop(&c->p, sig, gentle ? 2000 : 0);
			if (!r->is_dataset)
				drain_child(sv, r, c);
			if (c->watched) {
				loop_del(sv->lp, c->p.pidfd);
				loop_del(sv->lp, c->p.sock);
			}
			proc_close(&c->p);
			c->exited = true;
			r->alive--;
		}
		if (r->is_dataset) {
			/* left preparing: the next start prepares it again from scratch */
			unlink_run(sv, r);
			run_free(r);
			continue;
		}
		run_maybe_finish(sv, r);
	}
}

void supervisor_destroy(supervisor *sv)
{
	if (!sv)
		return;
	while (sv->runs) {
		run *r = sv->runs;
		sv->runs = r->next;
		run_free(r);
	}
	for (size_t d = 0; d < sv->ndev; d++)
		free((char *)(sv->dev_job ? sv->dev_job[d] : NULL));
	free(sv->dev_job);
	free(sv->devs);
	if (sv->sample_fd >= 0) {
		loop_del(sv->lp, sv->sample_fd);
		close(sv->sample_fd);
	}
	free(sv);
}
