/* sv_prepare — dataset preparations: one bertd-prepare per dataset
 * preparing, at most prepare_limit at once, oldest first; its progress
 * lines into the dataset's row; its end (ready; failed or canceled, its
 * output removed; started again, resuming, after a kill the daemon did not
 * send); a preparation whose row is no longer preparing stopped; datasets
 * an earlier daemon left preparing (and no one adopted: daemon/adopt.c)
 * queued again. bertd-prepare outlives the daemon (common/chan.h): its
 * messages carry seqs, acknowledged once stored, and its attempt record
 * <state_dir>/datasets/ch/<id>.attempt.json names it for a later daemon.
 *
 * Never touches jobs, the device table or the relay; a run it handles is
 * always a dataset's (is_dataset). Calls sv_child and sv_run only; its
 * runs' and children's ends reach it through their hooks (on_end,
 * child_ops).
 */
#include "daemon/sv_internal.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/chan.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "daemon/childenv.h"
#include "daemon/proc.h"

extern char **environ; /* what children may inherit from (pass_env) */

static void handle_prepare_message(supervisor *sv, run *r, json_t *m)
{
	json_t *ok = json_object_get(m, "ok");
	const char *error = json_string_value(json_object_get(m, "error"));
	if (json_is_false(ok) && error) /* bertd-prepare's own account of its failure */
		sv_set_failure(r, false, "%s", error);
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

/* {"type":"attach"}: an adopted bertd-prepare names its protocol and who
 * it is. A version this daemon does not know, or another identity than
 * the recorded one: killed, and the dataset prepared again (resuming from
 * its finished shards). */
static void prepare_attach(supervisor *sv, run *r, child *c, json_t *m)
{
	(void)sv;
	json_int_t proto = json_integer_value(json_object_get(m, "proto"));
	json_int_t pid = json_integer_value(json_object_get(m, "pid"));
	uint64_t st = (uint64_t)json_integer_value(json_object_get(m, "start_time"));
	char why[300] = "";
	if (proto < CHAN_PROTO_MIN || proto > CHAN_PROTO)
		snprintf(why, sizeof why, "bertd-prepare speaks protocol version %lld; this bertd adopts versions %d "
			 "to %d", (long long)proto, CHAN_PROTO_MIN, CHAN_PROTO);
	else if (pid != c->p.pid || st != c->start_time)
		snprintf(why, sizeof why, "bertd-prepare's socket answered as pid %lld, not the recorded pid %d",
			 (long long)pid, (int)c->p.pid);
	if (!why[0]) {
		log_info("dataset %s: bertd-prepare (pid %d) attached (protocol %lld, %lld bytes it kept meanwhile)",
			 r->id, (int)c->p.pid, (long long)proto, (long long)json_integer_value(json_object_get(m, "queued")));
		return;
	}
	log_warn("dataset %s: %s: not adopted, preparing it again", r->id, why);
	sv_set_failure(r, true, "%s: not adopted", why);
	r->prep_signaled = true; /* prepared again, as after a kill the daemon did not send */
	sv_run_kill_all(r, SIGKILL);
}

/* bertd-prepare's messages (common/msg.h frames; docs/formats.md): each
 * handled once, by its seq, then acknowledged (as sv_report_input does a
 * job's). Its child's on_input. */
static int prepare_input(supervisor *sv, run *r, child *c)
{
	json_t *m;
	uint64_t seq;
	bool attach;
	int rc;
	while ((rc = sv_child_next_message(c, &m, &seq, &attach)) == 1) {
		if (attach) {
			prepare_attach(sv, r, c, m);
		} else {
			handle_prepare_message(sv, r, m);
			if (seq)
				c->seq_done = seq;
		}
		json_decref(m);
	}
	sv_child_ack(c); /* stored: bertd-prepare may forget them */
	return rc < 0 ? rc : 0;
}

const child_ops sv_prepare_ops = {.on_input = prepare_input};

void sv_prepare_record_path(supervisor *sv, const char *id, const char *ext, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s/datasets/ch/%s%s", sv->state_dir, id, ext);
}

/* Writes r's attempt record (tmp + rename; docs/formats.md): who prepares
 * it, for a daemon that starts while it runs. 0 or negative errno. */
static int prepare_record_write(supervisor *sv, run *r)
{
	child *c = r->nkids ? r->kids[0] : NULL;
	if (!c || !c->chan_base[0])
		return -EINVAL;
	char boot[64], path[1200];
	chan_boot_id(boot, sizeof boot);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	int64_t now_unix = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	json_t *rec = json_pack("{s:i, s:i, s:s, s:s, s:I, s:[{s:s, s:i, s:i, s:I, s:s}]}", "format", 1, "proto",
				CHAN_PROTO, "boot_id", boot, "dataset", r->id, "started_unix_ms", (json_int_t)now_unix,
				"children", "role", "prepare", "index", 0, "pid", (int)c->p.pid, "start_time",
				(json_int_t)c->start_time, "chan", c->chan_base);
	sv_prepare_record_path(sv, r->id, ".attempt.json", path, sizeof path);
	return sv_child_record_save(path, rec);
}

void sv_prepare_forget(supervisor *sv, const run *r)
{
	char path[1200];
	sv_prepare_record_path(sv, r->id, ".attempt.json", path, sizeof path);
	unlink(path);
	sv_prepare_record_path(sv, r->id, ".exit", path, sizeof path);
	unlink(path);
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

/* A preparation's end, once bertd-prepare is gone (sv_run_maybe_finish):
 * its dataset's next state. */
void sv_prepare_finished(supervisor *sv, run *r)
{
	sv_prepare_forget(sv, r); /* its attempt is over, whatever comes next */
	/* killed by a signal not ours (OOM killer, kill -9): prepared
	 * again, continuing from its finished shards, a few times */
	if (r->failed && r->prep_signaled && !r->canceled && !r->shutdown) {
		int kills = prepare_killed(sv, r->id);
		if (kills <= PREPARE_MAX_KILLS &&
		    store_dataset_phase(sv->st, r->id, "queued", 0.0) == 0) {
			log_warn("dataset %s: %s; preparing it again from its finished shards "
				 "(%d of %d)", r->id, r->reason, kills, PREPARE_MAX_KILLS);
			sv_run_free(r);
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
	sv_run_free(r);
}

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

run *sv_prepare_run_new(supervisor *sv, const store_dataset *ds)
{
	run *r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	r->is_dataset = true;
	r->sv = sv;
	r->on_end = sv_prepare_finished;
	snprintf(r->id, sizeof r->id, "%s", ds->id);
	snprintf(r->dir, sizeof r->dir, "%s/datasets/%s", sv->dataset_root, ds->name);
	r->spec = json_loads(ds->spec_json, 0, NULL);
	return r;
}

static int start_prepare(supervisor *sv, const store_dataset *ds)
{
	run *r = sv_prepare_run_new(sv, ds);
	if (!r)
		return -ENOMEM;
	if (!r->spec) {
		store_dataset_finish(sv->st, ds->id, DATASET_FAILED, "stored request is unreadable", NULL);
		sv_run_free(r);
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
		sv_run_free(r);
		return 0;
	}
	/* Not ready in the store, so anything at outdir is a previous attempt's
	 * (a daemon that died after bertd-prepare renamed it into place). The
	 * work directory beside it stays: bertd-prepare continues from it. */
	if ((rc = fs_remove_tree(outdir)) < 0)
		log_warn("dataset %s: cannot remove stale %s: %s", ds->name, outdir, strerror(-rc));
	remove_stale_prepare_tmp(sv, dsdir, ds->name);
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
		rc = sv_child_spawn(sv, r, ROLE_PREPARE, 0, &sv_prepare_ops, (char *const *)argv, env->envp, logp);
	free(env);
	if (rc < 0) {
		sv_set_failure(r, false, "cannot start bertd-prepare: %s", strerror(-rc));
		sv_run_maybe_finish(sv, r);
		return 0;
	}
	/* without it, a daemon started after this one's end kills it (daemon/adopt.c) */
	if ((rc = prepare_record_write(sv, r)) < 0)
		log_warn("dataset %s: cannot write its attempt record: %s", ds->id, strerror(-rc));
	log_info("dataset %s (%s): preparing into %s", ds->id, ds->name, outdir);
	return 0;
}

void sv_prepare_tick(supervisor *sv)
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
		if (ds[i].state == DATASET_PREPARING && !sv_find_run(sv, ds[i].id)) {
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
		sv_set_failure(r, false, "canceled while preparing");
		log_info("dataset %s: canceled; stopping bertd-prepare", r->id);
		sv_run_kill_all(r, SIGKILL);
	}
	store_datasets_free(ds, n);
}

/* Datasets left preparing by an earlier daemon whose bertd-prepare was
 * not adopted are prepared again, each when its turn in the queue comes
 * (queued until then); bertd-prepare continues from the shards the killed
 * one finished. */
void sv_prepare_recover(supervisor *sv)
{
	store_dataset *ds = NULL;
	size_t n = 0;
	if (store_dataset_list(sv->st, &ds, &n) < 0)
		return;
	for (size_t i = 0; i < n; i++)
		if (ds[i].state == DATASET_PREPARING && !sv_find_run(sv, ds[i].id))
			store_dataset_phase(sv->st, ds[i].id, "queued", 0.0);
	store_datasets_free(ds, n);
}
