/* jobs — the /v1/jobs resource: submit (validated by jobspec, idempotent
 * with Idempotency-Key), list with state, tag and owner filters and cursor
 * paging, get, change (PATCH: priority, name, tags, notes, preemptible), cancel,
 * delete, events.
 *
 * Handlers only read and write through store_*; state changes are
 * compare-and-set transitions, so a handler racing the scheduler or the
 * supervisor never overwrites a state it did not see. Cancel of a job that
 * is already starting or running only moves it to `stopping`: the
 * supervisor owns processes and finishes the stop (checkpoint, then
 * canceled). List pages are copied from kept job texts; every page is read
 * from the store (and its jobs without a kept text rendered) by this
 * file's page threads, never on the server thread that read the request
 * (so health checks on that thread do not wait); a page with no running
 * job is kept whole per store revision and answered by the server thread
 * from that one buffer. Must never touch child processes or daemon state
 * directly, nor answer a kept page once any job was written after its
 * read began.
 */
#include <errno.h>
#include <limits.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api/handlers.h"
#include "api/diagnosis.h"
#include "api/follow.h"
#include "api/http.h"
#include "api/initmodel.h"
#include "api/paths.h"
#include "api/restore.h"
#include "common/fsutil.h"
#include "common/jobspec.h"
#include "common/sha256.h"
#include "common/log.h"
#include "daemon/cluster.h"
#include "daemon/store.h"
#include "daemon/retention.h"
#include "daemon/telemetry.h"

#define LIST_LIMIT_DEFAULT 20
#define LIST_LIMIT_MAX 100
#define IDEM_KEY_MAX 255

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static json_t *time_json(int64_t ms)
{
	if (ms <= 0)
		return json_null();
	char buf[32];
	api_time_format(ms, buf);
	return json_string(buf);
}

/* Progress of a job that has run: latest logged metrics (the newest row of
 * x->tail), ETA, devices, newest checkpoint and, once completed, where the
 * exported model is. */
static void add_progress(json_t *o, const store_job *j, const json_t *spec,
			 const store_job_extras *x)
{
	json_t *devs = j->devices_json ? json_loads(j->devices_json, 0, NULL) : NULL;
	json_object_set_new(o, "devices", devs ? devs : json_array());
	json_int_t max_steps = json_integer_value(json_object_get(json_object_get(spec, "training_args"), "max_steps"));
	json_t *prog = json_pack("{s:I, s:I}", "step", (json_int_t)0, "max_steps", max_steps);
	if (x->n_tail > 0) {
		const store_metric *m = &x->tail[x->n_tail - 1];
		json_t *vals = json_loads(m->values_json, 0, NULL);
		json_object_set_new(prog, "step", json_integer(m->step));
		const char *keep[] = {"epoch", "loss", "learning_rate", "grad_norm", "tokens_per_s", "step_time_ms"};
		for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
			json_t *v = json_object_get(vals, keep[i]);
			if (v)
				json_object_set(prog, keep[i], v);
		}
		double step_ms = json_number_value(json_object_get(vals, "step_time_ms"));
		if (step_ms > 0 && max_steps > m->step && !job_state_is_terminal(j->state))
			json_object_set_new(prog, "eta_seconds",
					    json_real(step_ms * (double)(max_steps - m->step) / 1000.0));
		char t[32];
		api_time_format(m->time_ms, t);
		json_object_set_new(prog, "logged_at", json_string(t));
		json_decref(vals);
	}
	json_object_set_new(o, "progress", prog);
	json_t *last = json_null();
	if (x->n_checkpoint > 0) {
		json_decref(last);
		last = json_pack("{s:I, s:s}", "step", (json_int_t)x->last_checkpoint[0].step, "path",
				 x->last_checkpoint[0].path);
	}
	json_object_set_new(o, "last_checkpoint", last);
}

/* The job's tags ([] when none) and notes (null) as its spec holds them,
 * and its owner (the name of the token it was submitted with; null when
 * not known). */
static void add_labels(json_t *o, const store_job *j, const json_t *spec)
{
	json_t *tags = json_object_get(spec, "tags"), *notes = json_object_get(spec, "notes");
	json_object_set_new(o, "tags", json_is_array(tags) ? json_incref(tags) : json_array());
	json_object_set_new(o, "notes", json_is_string(notes) ? json_incref(notes) : json_null());
	json_object_set_new(o, "owner", j->owner ? json_string(j->owner) : json_null());
}

/* Who a request acts for: the name of the API token it carried ("default":
 * the token file's). Borrowed from req. NULL: not known. */
static const char *request_owner(const api_request *req)
{
	return req->who.name[0] ? req->who.name : NULL;
}

/* For cancel and change: whether the request's token may act on
 * job id (an admin on any, a user on its own: api_may_act_on). True also
 * when the job does not exist, so that the handler's own lookup answers
 * 404; a store error is replied (and false). */
static bool may_act_on_job(api_request *req, const char *id, enum MHD_Result *ret)
{
	if (req->who.role >= TOKENS_ROLE_ADMIN)
		return true;
	store_job j = {0};
	int rc = store_job_get(req->st, id, &j);
	bool ok = true;
	if (rc == 0) {
		char what[64];
		snprintf(what, sizeof what, "job %s", id);
		ok = api_may_act_on(req, j.owner, what, ret);
	} else if (rc != -ENOENT) {
		*ret = api_reply_store_error(req, rc, "loading job %s", id);
		ok = false;
	}
	store_job_free(&j);
	return ok;
}

/* What the job's end left and how long it ran: "export" ({"step",
 * "source"}: the checkpoint whose model GET /v1/jobs/{id}/export holds, and
 * why: "final", "best" (load_best_model_at_end), "stopped" (canceled or out
 * of max_runtime_seconds); null before), "best_model" ({"step", "metric",
 * "value"}: the best checkpoint by metric_for_best_model; null without
 * evaluation) and "runtime_seconds" (its attempts' wall time so far). A
 * canceled job with an export gets its model_dir too. */
static void add_outcome(json_t *o, const store_job *j, const api_config *cfg)
{
	json_t *out = j->outcome_json ? json_loads(j->outcome_json, 0, NULL) : NULL;
	json_t *ex = json_object_get(out, "export"), *best = json_object_get(out, "best_model");
	json_object_set(o, "export", json_is_object(ex) && j->state != JOB_FAILED ? ex : json_null());
	json_object_set(o, "best_model", json_is_object(best) ? best : json_null());
	json_object_set_new(o, "runtime_seconds", json_real((double)j->runtime_ms / 1000.0));
	if (j->state == JOB_CANCELED && json_is_object(ex)) {
		char path[1400];
		snprintf(path, sizeof path, "%s/jobs/%s/export", cfg->state_dir, j->id);
		json_object_set_new(o, "model_dir", json_string(path));
	}
	json_decref(out);
}

/* "preemption": {"count", "by", "at"} (how often the job was preempted,
 * by which job the last time, and when its workers had stopped for it),
 * null when it never was. A job preempted and waiting is "queued" with
 * this set; the record stays after it resumes. */
static void add_preemption(json_t *o, const store_job *j)
{
	json_t *out = j->outcome_json ? json_loads(j->outcome_json, 0, NULL) : NULL;
	json_t *p = json_object_get(out, "preemption");
	if (json_is_object(p))
		json_object_set_new(o, "preemption",
				    json_pack("{s:I, s:s?, s:o}", "count",
					      json_integer_value(json_object_get(p, "count")), "by",
					      json_string_value(json_object_get(p, "by")), "at",
					      time_json(json_integer_value(json_object_get(p, "at_ms")))));
	else
		json_object_set_new(o, "preemption", json_null());
	json_decref(out);
}

/* "placement": the device table entries of the job's current or last run
 * and whether each pair of them is directly linked (NVLink; CPU slots
 * share memory), null when the topology is not known; null for a job that
 * has not run on this machine's devices. */
static void add_placement(json_t *o, const store_job *j, const api_config *cfg)
{
	json_t *devs = j->devices_json ? json_loads(j->devices_json, 0, NULL) : NULL;
	json_t *ids = json_array();
	bool known = true, linked = true;
	size_t i;
	json_t *e;
	json_array_foreach(devs, i, e) {
		json_int_t id = json_integer_value(json_object_get(e, "id"));
		json_array_append_new(ids, json_integer(id));
		if (id < 0 || (size_t)id >= cfg->n_devices || !cfg->devices[id].peers_known) {
			known = false;
			continue;
		}
		size_t k;
		json_t *f;
		json_array_foreach(devs, k, f) {
			json_int_t other = json_integer_value(json_object_get(f, "id"));
			if (other != id && (other < 0 || other >= 64 || !((cfg->devices[id].peers >> other) & 1)))
				linked = false;
		}
	}
	json_decref(devs);
	if (json_array_size(ids) == 0) {
		json_decref(ids);
		json_object_set_new(o, "placement", json_null());
		return;
	}
	json_object_set_new(o, "placement", json_pack("{s:o, s:o}", "devices", ids, "connected",
						      known ? json_boolean(linked) : json_null()));
}

/* The job representation every endpoint answers with, from its row and
 * what store_job_extras_get read for it (window DIAG_WINDOW). The stored
 * spec is parsed once here for progress, diagnosis and the "spec" member.
 * NULL on OOM. */
static json_t *job_json(const store_job *j, const store_job_extras *x, const api_config *cfg,
			int64_t now)
{
	json_t *spec = j->spec_json ? json_loads(j->spec_json, 0, NULL) : NULL;
	if (!spec)
		log_error("job %s: stored spec is not JSON", j->id);
	json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:o, s:o, s:o, s:o, s:i, s:s?}",
			      "id", j->id,
			      "name", j->name ? j->name : "",
			      "state", job_state_name(j->state),
			      "priority", j->priority,
			      "created_at", time_json(j->created_ms),
			      "updated_at", time_json(j->updated_ms),
			      "started_at", time_json(j->started_ms),
			      "finished_at", time_json(j->finished_ms),
			      "restart_count", j->restart_count,
			      "failure_reason", j->failure_reason);
	if (!o) {
		json_decref(spec);
		return NULL;
	}
	add_labels(o, j, spec);
	add_progress(o, j, spec, x);
	add_placement(o, j, cfg);
	if (j->state == JOB_COMPLETED) {
		char path[1400];
		snprintf(path, sizeof path, "%s/jobs/%s/export", cfg->state_dir, j->id);
		json_object_set_new(o, "model_dir", json_string(path));
	}
	add_outcome(o, j, cfg);
	add_preemption(o, j);
	diag_report rep;
	if (api_diagnose_rows(j, spec, x->tail, x->n_tail, x->first, x->n_first, now, &rep) == 0)
		json_object_set_new(o, "diagnosis", json_string(rep.summary));
	else
		json_object_set_new(o, "diagnosis", json_null());
	if (spec)
		json_object_set_new(o, "spec", spec);
	return o;
}

/* ---- rendered representations of jobs not running ----
 *
 * A list page is mostly finished jobs or, while a sweep waits, queued ones.
 * The representation of a job that is not running does not depend on the
 * clock: only a running job's diagnosis reads it (time to the first step,
 * a silent rank); the ETA comes from the logged step time. So it changes
 * only when the store writes something of the job (row, metrics,
 * checkpoints), which changes store_job.version, and the compact JSON text
 * of every job but the running ones is kept, keyed by id, version and the
 * server's config (model_dir), and a page of them is copied text instead of
 * one spec parse, one metrics window parse and one dump per job. A queued
 * job that starts, is canceled or changes in any way has a new version, so
 * the next page renders it afresh. RENDER_SETS x RENDER_WAYS entries at
 * most (a new one evicts the oldest of its set); each is one job's text
 * (~2 KB). */
#define RENDER_SETS 8192
#define RENDER_WAYS 4
#define RENDER_LOCKS 64

/* One job's text, shared by the cache and the replies being built from it. */
typedef struct rtext {
	atomic_int refs;
	size_t len;
	char text[];
} rtext;

static rtext *rtext_new(const char *text, size_t len)
{
	rtext *t = malloc(sizeof *t + len + 1);
	if (!t)
		return NULL;
	atomic_init(&t->refs, 1);
	t->len = len;
	memcpy(t->text, text, len + 1);
	return t;
}

static void rtext_put(rtext *t)
{
	if (t && atomic_fetch_sub(&t->refs, 1) == 1)
		free(t);
}

typedef struct rendered {
	uint64_t version;
	const api_config *cfg;
	char id[24];
	rtext *t;
} rendered;

static rendered render_cache[RENDER_SETS][RENDER_WAYS];
static unsigned render_victim[RENDER_SETS];
static pthread_mutex_t render_mu[RENDER_LOCKS];
static pthread_once_t render_once = PTHREAD_ONCE_INIT;

static void render_init(void)
{
	for (int i = 0; i < RENDER_LOCKS; i++)
		pthread_mutex_init(&render_mu[i], NULL);
}

static size_t render_set(const char *id)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (const unsigned char *p = (const unsigned char *)id; *p; p++)
		h = (h ^ *p) * 1099511628211ull;
	return (size_t)(h % RENDER_SETS);
}

/* Must agree with api_diagnose_rows: the clock matters only while running. */
static bool render_cacheable(const store_job *j)
{
	return j->state != JOB_RUNNING && j->version && j->id &&
	       strlen(j->id) < sizeof render_cache[0][0].id;
}

/* j's cached text at this version (a reference: rtext_put it), or NULL. */
static rtext *render_get(const store_job *j, const api_config *cfg)
{
	if (!render_cacheable(j))
		return NULL;
	pthread_once(&render_once, render_init);
	size_t set = render_set(j->id);
	rtext *t = NULL;
	pthread_mutex_lock(&render_mu[set % RENDER_LOCKS]);
	for (int w = 0; w < RENDER_WAYS; w++) {
		rendered *r = &render_cache[set][w];
		if (r->t && r->version == j->version && r->cfg == cfg && strcmp(r->id, j->id) == 0) {
			t = r->t;
			atomic_fetch_add(&t->refs, 1);
			break;
		}
	}
	pthread_mutex_unlock(&render_mu[set % RENDER_LOCKS]);
	return t;
}

/* Keeps t (takes a reference) as j's representation at j->version. */
static void render_put(const store_job *j, const api_config *cfg, rtext *t)
{
	if (!render_cacheable(j))
		return;
	pthread_once(&render_once, render_init);
	size_t set = render_set(j->id);
	atomic_fetch_add(&t->refs, 1);
	pthread_mutex_lock(&render_mu[set % RENDER_LOCKS]);
	int way = -1;
	for (int w = 0; w < RENDER_WAYS && way < 0; w++)
		if (render_cache[set][w].t && strcmp(render_cache[set][w].id, j->id) == 0)
			way = w;
	for (int w = 0; w < RENDER_WAYS && way < 0; w++)
		if (!render_cache[set][w].t)
			way = w;
	if (way < 0)
		way = (int)(render_victim[set]++ % RENDER_WAYS);
	rendered *r = &render_cache[set][way];
	rtext *old = r->t;
	*r = (rendered){.version = j->version, .cfg = cfg, .t = t};
	snprintf(r->id, sizeof r->id, "%s", j->id);
	pthread_mutex_unlock(&render_mu[set % RENDER_LOCKS]);
	rtext_put(old);
}

/* The kept texts of jobs[0..n) into texts[i] (references: the caller
 * rtext_puts each), NULL where none is kept; returns how many are NULL. */
static size_t jobs_texts_kept(const store_job *jobs, size_t n, const api_config *cfg, rtext **texts)
{
	size_t missing = 0;
	for (size_t i = 0; i < n; i++)
		missing += !(texts[i] = render_get(&jobs[i], cfg));
	return missing;
}

/* Renders the texts[i] that are NULL from one read of the store for all of
 * them (and keeps those of jobs not running). On an error (the store's, or
 * -ENOMEM) some may stay NULL; the caller rtext_puts every texts[i]. */
static int jobs_texts_render(store *st, const store_job *jobs, size_t n, const api_config *cfg,
			     rtext **texts)
{
	store_job *miss = n ? malloc(n * sizeof *miss) : NULL;
	size_t *at = n ? malloc(n * sizeof *at) : NULL;
	size_t m = 0;
	int rc = 0;
	if (n && (!miss || !at)) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		if (!texts[i]) {
			miss[m] = jobs[i]; /* a shallow copy: store_job_extras_get only reads it */
			at[m++] = i;
		}
	}
	if (m == 0)
		goto out;
	store_job_extras *x = NULL;
	if ((rc = store_job_extras_get(st, miss, m, DIAG_WINDOW, &x)) < 0)
		goto out;
	int64_t now = now_ms();
	for (size_t k = 0; k < m && rc == 0; k++) {
		json_t *o = job_json(&miss[k], &x[k], cfg, now);
		char *d = o ? api_json_dumps(o, false) : NULL;
		json_decref(o);
		rtext *t = d ? rtext_new(d, strlen(d)) : NULL;
		free(d);
		if (!t) {
			rc = -ENOMEM;
			break;
		}
		texts[at[k]] = t;
		render_put(&miss[k], cfg, t);
	}
	store_job_extras_free(x, m);
out:
	free(miss);
	free(at);
	return rc;
}

/* The compact JSON texts of jobs[0..n) into texts[i] (references: the
 * caller rtext_puts each): kept ones shared, the others rendered from one
 * read of the store for all of them. A store error is returned; -ENOMEM;
 * then every texts[i] is NULL. */
static int jobs_texts(store *st, const store_job *jobs, size_t n, const api_config *cfg,
		      rtext **texts)
{
	int rc = 0;
	if (jobs_texts_kept(jobs, n, cfg, texts))
		rc = jobs_texts_render(st, jobs, n, cfg, texts);
	if (rc < 0) {
		for (size_t i = 0; i < n; i++) {
			rtext_put(texts[i]);
			texts[i] = NULL;
		}
	}
	return rc;
}

/* Ids are made here ("job-" + 16 hex); anything else cannot exist, so it is
 * a 404 without a database round trip. */
static bool id_plausible(const char *id)
{
	if (strncmp(id, "job-", 4) != 0 || strlen(id) != 20)
		return false;
	for (const char *p = id + 4; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return true;
}

static int make_id(char id[21])
{
	unsigned char r[8];
	if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
		return -EIO;
	memcpy(id, "job-", 4);
	for (int i = 0; i < 8; i++)
		snprintf(id + 4 + 2 * i, 3, "%02x", r[i]);
	return 0;
}

/* Maps a store error for job `id` to its one reply. */
static enum MHD_Result store_failed(api_request *req, int rc, const char *id, const char *what)
{
	if (rc == -ENOENT)
		return api_reply_problem(req, API_P_JOB_NOT_FOUND, NULL, "no job %s", id);
	return api_reply_store_error(req, rc, "%s %s failed", what, id);
}

static enum MHD_Result no_such_job(api_request *req, const char *id)
{
	return api_reply_problem(req, API_P_JOB_NOT_FOUND, NULL, "no job %s", id);
}

/* One held-out evaluation of a metrics row: step and its eval keys. */
static json_t *eval_point(const store_metric *m)
{
	json_t *v = json_loads(m->values_json, 0, NULL);
	json_t *o = json_pack("{s:I}", "step", (json_int_t)m->step);
	static const char *const keys[] = {"eval_loss", "perplexity", "eval_accuracy"};
	for (size_t i = 0; o && i < sizeof keys / sizeof keys[0]; i++) {
		json_t *x = json_object_get(v, keys[i]);
		json_object_set(o, keys[i], x ? x : json_null());
	}
	json_decref(v);
	return o;
}

/* Adds "eval" (docs/api.md: the newest and the best held-out evaluation,
 * or null) to the compact job text *text (len bytes; replaced). Only a
 * single job's representation has it: it reads the job's metrics rows. */
static int add_eval_summary(store *st, const char *id, char **text, size_t *len)
{
	store_metric last, best;
	int rc = store_metric_eval(st, id, &last, &best);
	if (rc < 0 && rc != -ENOENT)
		return rc;
	json_t *o = json_loads(*text, 0, NULL);
	json_t *ev = rc == 0 ? json_pack("{s:o, s:o}", "last", eval_point(&last), "best", eval_point(&best))
			     : json_null();
	if (rc == 0) {
		free(last.values_json);
		free(best.values_json);
	}
	char *t = NULL;
	if (o && ev && json_object_set_new(o, "eval", ev) == 0)
		t = api_json_dumps(o, false);
	else
		json_decref(ev);
	json_decref(o);
	if (!t)
		return -ENOMEM;
	free(*text);
	*text = t;
	*len = strlen(t);
	return 0;
}

/* Adds "data" (docs/api.md: what the job trains on, as worker rank 0
 * counted it, or null before its first start) to the compact job text
 * *text (len bytes; replaced), as add_eval_summary does. */
static int add_data_summary(store *st, const char *id, char **text, size_t *len)
{
	char *dj = NULL;
	int rc = store_job_data_get(st, id, &dj);
	if (rc < 0)
		return rc;
	json_t *o = json_loads(*text, 0, NULL);
	json_t *d = dj ? json_loads(dj, 0, NULL) : json_null();
	free(dj);
	char *t = NULL;
	if (o && d && json_object_set_new(o, "data", d) == 0)
		t = api_json_dumps(o, false);
	else
		json_decref(d);
	json_decref(o);
	if (!t)
		return -ENOMEM;
	free(*text);
	*text = t;
	*len = strlen(t);
	return 0;
}

/* Replies with the job's current representation. */
static enum MHD_Result reply_job(api_request *req, unsigned status, const char *id)
{
	store_job j = {0};
	int rc = store_job_get(req->st, id, &j);
	if (rc)
		return store_failed(req, rc, id, "loading job");
	char *text = NULL;
	size_t len = 0;
	rtext *t = NULL;
	rc = jobs_texts(req->st, &j, 1, req->cfg, &t);
	store_job_free(&j);
	if (rc == 0) {
		len = t->len;
		if (!(text = malloc(len + 1)))
			rc = -ENOMEM;
		else
			memcpy(text, t->text, len + 1);
		rtext_put(t);
	}
	if (rc == 0 && ((rc = add_eval_summary(req->st, id, &text, &len)) < 0 ||
			(rc = add_data_summary(req->st, id, &text, &len)) < 0)) {
		free(text);
		text = NULL;
	}
	if (rc == -ENOMEM)
		return api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
	if (rc < 0)
		return store_failed(req, rc, id, "loading job");
	char *body = realloc(text, len + 2);
	if (!body) {
		free(text);
		return api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
	}
	body[len] = '\n';
	body[len + 1] = 0;
	enum MHD_Result ret = api_reply_raw(req, status, "application/json", body, len + 1);
	free(body);
	return ret;
}

/* ------------------------------------------------------------ submit */

/* Printable ASCII without spaces, like the IETF idempotency-key draft's
 * examples (UUIDs, ULIDs); anything else is a client bug worth a 400. */
static bool idem_key_ok(const char *k)
{
	size_t n = strlen(k);
	if (n == 0 || n > IDEM_KEY_MAX)
		return false;
	for (; *k; k++)
		if (*k < 0x21 || *k > 0x7e)
			return false;
	return true;
}

/* Serializes exactly what a 201 answers, so a replay can send the same
 * bytes. Steals o. */
static char *dump_line(json_t *o)
{
	char *text = o ? api_json_dumps(o, true) : NULL;
	json_decref(o);
	return text;
}

/* ------------------------------------------------------------ init_from
 *
 * init_from names a model directory on the daemon's machine: a path, or a
 * bertd job ({"job": id} its HF export, {"job": id, "checkpoint": step or
 * "latest"} one of its checkpoints). Like every path in a request it must
 * resolve (symlinks followed) inside a data root, or inside a job's own
 * outputs under the state dir (<state_dir>/jobs/<id>/export or
 * .../checkpoints/), never elsewhere there: the database and tokens live in
 * the state dir too. A path is resolved before the spec is validated
 * (common/jobspec.c takes absolute paths only), a job reference after
 * (jobspec checks its shape); either way the canonical path replaces what
 * was submitted, so the stored spec holds a path and the worker opens
 * exactly what was checked. Errors name the resolved path and what is
 * missing, never what a file holds. */

/* Whether canon lies in a job's export or checkpoints directory; with
 * job_id, only that job's. */
static bool in_job_outputs(const char *canon, const char *state_dir, const char *job_id)
{
	char jobs[PATH_MAX], real[PATH_MAX];
	snprintf(jobs, sizeof jobs, "%s/jobs", state_dir);
	if (!realpath(jobs, real) || !api_path_under(canon, real))
		return false;
	const char *rest = canon + strlen(real);
	if (*rest++ != '/' || strlen(rest) < 21 || rest[20] != '/')
		return false;
	char id[21];
	memcpy(id, rest, 20);
	id[20] = 0;
	if (!id_plausible(id) || (job_id && strcmp(id, job_id) != 0))
		return false;
	rest += 21;
	if (strncmp(rest, "export", 6) == 0 && (rest[6] == 0 || rest[6] == '/'))
		return true;
	/* a checkpoint, not the checkpoints directory itself */
	return strncmp(rest, "checkpoints/", 12) == 0 && rest[12] != 0;
}

static bool has_file(const char *dir, const char *name)
{
	char path[PATH_MAX + 64];
	struct stat sb;
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* What worker/hf.c hf_init_from can load (its hf_init_from_missing, whose
 * messages these are): an HF directory, config.json with model.safetensors,
 * sharded safetensors (model.safetensors.index.json), pytorch_model.bin or
 * its index; or a complete bertd checkpoint (state.json,
 * params.safetensors, DONE). A TensorFlow- or Flax-only directory is
 * refused naming the conversion. NULL when dir is one, else what is
 * missing. */
static const char *const hf_weight_files[] = {"model.safetensors", "model.safetensors.index.json",
					      "pytorch_model.bin", "pytorch_model.bin.index.json"};

static const char *model_dir_missing(const char *dir)
{
	struct stat sb;
	if (stat(dir, &sb) < 0 || !S_ISDIR(sb.st_mode))
		return "is not a directory";
	if (has_file(dir, "config.json")) {
		for (size_t i = 0; i < sizeof hf_weight_files / sizeof hf_weight_files[0]; i++)
			if (has_file(dir, hf_weight_files[i]))
				return NULL;
		if (has_file(dir, "tf_model.h5"))
			return "holds only TensorFlow weights (tf_model.h5): convert them with transformers, "
			       "BertForPreTraining.from_pretrained(dir, from_tf=True).save_pretrained(new_dir), "
			       "and give new_dir";
		if (has_file(dir, "flax_model.msgpack"))
			return "holds only Flax weights (flax_model.msgpack): convert them with transformers, "
			       "BertForPreTraining.from_pretrained(dir, from_flax=True).save_pretrained(new_dir), "
			       "and give new_dir";
		return "has config.json but no weights (model.safetensors, model.safetensors.index.json, "
		       "pytorch_model.bin or pytorch_model.bin.index.json)";
	}
	if (has_file(dir, "state.json")) {
		if (!has_file(dir, "params.safetensors"))
			return "has state.json but no params.safetensors (not a usable bertd checkpoint)";
		return has_file(dir, "DONE") ? NULL
			: "is an incomplete bertd checkpoint (no DONE marker: it was never finished)";
	}
	return "holds no model: neither config.json + model.safetensors or pytorch_model.bin "
	       "(HF model directory) nor state.json + params.safetensors (bertd checkpoint)";
}

/* A path (absolute, or relative to the first data root as a dataset source
 * is) into out. Returns true, or replies and sets *ret. */
static bool init_from_path(api_request *req, json_t *v, char *out, size_t cap,
			   enum MHD_Result *ret)
{
	const api_config *cfg = req->cfg;
	const char *s = json_string_value(v);
	size_t len = json_string_length(v);
	int rc = api_path_resolve(s, len, cfg->data_roots, cfg->n_data_roots, out, cap);
	if (rc == -EACCES || (rc == -EINVAL && cfg->n_data_roots == 0)) {
		/* outside the data roots: fine if it is a job's output */
		char canon[PATH_MAX];
		if (api_path_canonical(s, len, cfg->n_data_roots ? cfg->data_roots[0] : NULL, canon,
				       sizeof canon) == 0 &&
		    in_job_outputs(canon, cfg->state_dir, NULL) && strlen(canon) < cap) {
			memcpy(out, canon, strlen(canon) + 1);
			return true;
		}
	}
	if (rc == 0)
		return true;
	char why[1600];
	api_path_problem(rc, s, len, cfg->data_roots, cfg->n_data_roots, why, sizeof why);
	if (rc == -EACCES)
		*ret = api_reply_problem(req, API_P_PATH_FORBIDDEN, "init_from",
					 "%s; nor is it a job's export or checkpoint", why);
	else
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from", "%s", why);
	return false;
}

/* The canonical path of step's checkpoint of job j ("latest": the newest
 * complete one) into out. Returns true, or replies and sets *ret. */
static bool init_from_checkpoint(api_request *req, const store_job *j, json_t *step, char *out,
				 size_t cap, enum MHD_Result *ret)
{
	bool latest = json_is_string(step) && strcmp(json_string_value(step), "latest") == 0;
	if (!latest && (!json_is_integer(step) || json_integer_value(step) < 0)) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from.checkpoint",
					 "must be a step (an integer >= 0) or \"latest\"");
		return false;
	}
	store_checkpoint *ck = NULL;
	size_t n = 0;
	int rc = store_checkpoint_list(req->st, j->id, &ck, &n);
	if (rc < 0 && rc != -ENOENT) {
		*ret = api_reply_store_error(req, rc, "listing checkpoints failed");
		return false;
	}
	bool found = false;
	for (size_t k = n; k-- > 0 && !found;) {
		if (!latest && ck[k].step != json_integer_value(step))
			continue;
		char canon[PATH_MAX];
		if (!realpath(ck[k].path, canon) || !in_job_outputs(canon, req->cfg->state_dir, j->id) ||
		    strlen(canon) >= cap) {
			if (!latest) {
				*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from",
							 "job %s's checkpoint at step %lld (%s) is gone "
							 "from disk", j->id, (long long)ck[k].step,
							 ck[k].path);
				store_checkpoints_free(ck, n);
				return false;
			}
			continue;
		}
		if (latest && !has_file(canon, "DONE"))
			continue;
		memcpy(out, canon, strlen(canon) + 1);
		found = true;
	}
	if (!found) {
		/* Name what there is, bounded, so the fix is obvious. */
		char have[160] = "";
		size_t used = 0;
		for (size_t k = 0; k < n && used + 8 < sizeof have; k++) {
			int w = snprintf(have + used, sizeof have - used, "%s%lld", k ? ", " : "",
					 (long long)ck[k].step);
			if (w < 0 || (size_t)w >= sizeof have - used)
				break;
			used += (size_t)w;
		}
		if (latest)
			*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from",
						 "job %s (%s) has no complete checkpoint", j->id,
						 job_state_name(j->state));
		else
			*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from",
						 "job %s (%s) has no checkpoint at step %lld; it has: %s",
						 j->id, job_state_name(j->state),
						 (long long)json_integer_value(step), n ? have : "none");
	}
	store_checkpoints_free(ck, n);
	return found;
}

/* {"job": id} or {"job": id, "checkpoint": step | "latest"}, as
 * jobspec_normalize leaves it, into out. Returns true, or replies and sets
 * *ret. */
static bool init_from_job(api_request *req, json_t *ref, char *out, size_t cap,
			  enum MHD_Result *ret)
{
	const char *id = json_string_value(json_object_get(ref, "job"));
	if (!id || !id_plausible(id)) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from.job",
					 "must be a job id (\"job-\" and 16 hex digits)");
		return false;
	}
	store_job j = {0};
	int rc = store_job_get(req->st, id, &j);
	if (rc == -ENOENT) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from", "no job %s", id);
		return false;
	}
	if (rc < 0) {
		*ret = api_reply_store_error(req, rc, "loading job %s failed", id);
		return false;
	}
	bool ok = false;
	json_t *step = json_object_get(ref, "checkpoint");
	if (step && !json_is_null(step)) {
		ok = init_from_checkpoint(req, &j, step, out, cap, ret);
	} else if (j.state != JOB_COMPLETED) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from",
					 "job %s is %s; only a completed job has an HF export "
					 "(name one of its checkpoints: {\"job\": \"%s\", "
					 "\"checkpoint\": \"latest\"})",
					 id, job_state_name(j.state), id);
	} else {
		char dir[PATH_MAX];
		snprintf(dir, sizeof dir, "%s/jobs/%s/export", req->cfg->state_dir, id);
		ok = realpath(dir, out) && strlen(out) < cap;
		if (!ok)
			*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from",
						 "job %s is completed but its export %s is missing",
						 id, dir);
	}
	store_job_free(&j);
	return ok;
}

/* The files the worker reads from a model directory (worker/hf.c,
 * checkpoint.c), and the vocab.txt the API compares, must stay where dir
 * is allowed to be: each is opened beneath the data root holding dir (a
 * job's output: dir itself), so a link among them that leads out is
 * refused. NULL when all are fine, else the offending name (the link,
 * never what it points at) and *rc. (model_files_escape, below.) */
/* The shard file names of dir's weight index (model.safetensors.index.json,
 * else pytorch_model.bin.index.json), each once, into names (n at most);
 * returns how many, 0 when there is no index or it is no JSON object (the
 * worker says what is wrong with it). Names with a '/' are skipped: the
 * worker refuses them. Owned by *idx (json_decref); *which says, for a
 * message, which index named them. */
static size_t index_shards(const char *dir, json_t **idx, const char **which, const char **names,
			   size_t n)
{
	char path[PATH_MAX + 64];
	*idx = NULL;
	for (size_t i = 1; i < sizeof hf_weight_files / sizeof hf_weight_files[0] && !*idx; i += 2) {
		snprintf(path, sizeof path, "%s/%s", dir, hf_weight_files[i]);
		*idx = json_load_file(path, 0, NULL);
		*which = i == 1 ? "model.safetensors.index.json names a shard that"
				: "pytorch_model.bin.index.json names a shard that";
	}
	size_t k = 0;
	const char *key;
	json_t *v;
	json_object_foreach(json_object_get(*idx, "weight_map"), key, v) {
		const char *s = json_string_value(v);
		bool seen = !s || !s[0] || strchr(s, '/');
		for (size_t j = 0; j < k && !seen; j++)
			seen = strcmp(names[j], s) == 0;
		if (!seen && k < n)
			names[k++] = s;
	}
	return k;
}

static const char *model_files_escape(const api_config *cfg, const char *dir, int *rc)
{
	static const char *const fixed[] = {"config.json", "model.safetensors", "state.json",
					    "params.safetensors", "optim.safetensors", "DONE",
					    "model.safetensors.index.json", "pytorch_model.bin",
					    "pytorch_model.bin.index.json",
					    "vocab.txt" /* compared at submit (api/initmodel.c) */};
	/* and every shard an index names */
	const char *names[sizeof fixed / sizeof fixed[0] + 256];
	size_t nn = sizeof fixed / sizeof fixed[0];
	memcpy(names, fixed, sizeof fixed);
	json_t *idx = NULL;
	const char *which = "";
	nn += index_shards(dir, &idx, &which, names + nn, 256);
	char root[PATH_MAX] = "";
	for (size_t i = 0; i < cfg->n_data_roots && !root[0]; i++) {
		char real[PATH_MAX];
		if (realpath(cfg->data_roots[i], real) && api_path_under(dir, real))
			snprintf(root, sizeof root, "%s", real);
	}
	if (!root[0])
		snprintf(root, sizeof root, "%s", dir);
	int rfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (rfd < 0) {
		*rc = -errno;
		json_decref(idx);
		return ".";
	}
	size_t n = strlen(root);
	const char *below = dir[n] == '/' ? dir + n + 1 : dir + n; /* "" when dir is the root */
	const char *bad = NULL;
	for (size_t i = 0; i < nn && !bad; i++) {
		char rel[PATH_MAX + 64];
		snprintf(rel, sizeof rel, "%s%s%s", below, below[0] ? "/" : "", names[i]);
		int fd = fs_open_beneath(rfd, rel, O_PATH, 0);
		if (fd >= 0)
			close(fd);
		else if (fd != -ENOENT) {
			*rc = fd;
			/* a static name, or the index's one (freed below) */
			bad = i < sizeof fixed / sizeof fixed[0] ? fixed[i] : which;
		}
	}
	close(rfd);
	json_decref(idx);
	return bad;
}

/* Resolves o's init_from in place (see the section comment): a string
 * when paths is true, an object when it is false; anything else is left
 * for jobspec. Returns true, or replies (422 unusable, 403 outside what may
 * be read) and sets *ret. */
static bool init_from_resolve(api_request *req, json_t *o, bool paths, enum MHD_Result *ret)
{
	json_t *v = json_object_get(o, "init_from");
	char real[PATH_MAX];
	bool ok;
	if (paths && json_is_string(v))
		ok = init_from_path(req, v, real, sizeof real, ret);
	else if (!paths && json_is_object(v))
		ok = init_from_job(req, v, real, sizeof real, ret);
	else
		return true; /* null or absent: train from scratch */
	if (!ok)
		return false;
	const char *missing = model_dir_missing(real);
	if (missing) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from", "%s %s", real, missing);
		return false;
	}
	int erc = 0;
	const char *escape = model_files_escape(req->cfg, real, &erc);
	if (escape) {
		if (erc == -EXDEV || erc == -ELOOP)
			*ret = api_reply_problem(req, API_P_PATH_FORBIDDEN, "init_from",
						 "%s/%s is a symbolic link %s; the model's files must lie under "
						 "the data root that holds it (or in the job's own output)",
						 real, escape, erc == -EXDEV ? "leading outside" : "loop");
		else
			*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from", "%s/%s: %s", real, escape,
						 strerror(-erc));
		return false;
	}
	if (json_object_set_new(o, "init_from", json_string(real)) < 0) {
		*ret = api_reply_problem(req, API_P_INTERNAL, "init_from", "out of memory");
		return false;
	}
	return true;
}

/* Once init_from is resolved: the model it names becomes the job's, its
 * vocab is held against the dataset's (api/initmodel.c), and then
 * init_from_restore "all" is checked against that model. in is the spec
 * as submitted (a job reference is still there); *note as
 * api_initmodel_apply. Returns true, or replies and sets *ret. */
static bool init_from_model(api_request *req, const json_t *in, json_t **spec, char **note,
			    enum MHD_Result *ret)
{
	if (!api_initmodel_apply(req, in, spec, note, ret))
		return false;
	json_t *dir = json_object_get(*spec, "init_from");
	json_t *ref = json_object_get(in, "init_from");
	return !json_is_string(dir) || /* init_from_restore "all" */
	       api_restore_check(req, *spec, json_is_object(ref) ? ref : NULL, json_string_value(dir), ret);
}

/* A multi-node job needs `want` Slurm nodes up (docs/multinode.md, "A node
 * down at submit"): sinfo is asked, for at most CLUSTER_SINFO_TIMEOUT_MS of
 * this HTTP thread. More than the cluster has: 422; fewer up: 409 naming
 * the nodes that are down; sinfo
 * failing or silent: 503 saying so. Without slurm_srun the job fails at
 * start as before. Nodes that go down after this are the start's concern
 * (srun --immediate). Returns true, or replies and sets *ret. */
static bool nodes_up(api_request *req, int want, enum MHD_Result *ret)
{
	const char *srun = req->cfg->slurm_srun;
	if (!srun || !*srun)
		return true;
	cluster_nodes cn;
	char why[600] = "";
	int rc = cluster_sinfo(srun, req->cfg->slurm_conf, CLUSTER_SINFO_TIMEOUT_MS, &cn, why, sizeof why);
	if (rc) {
		*ret = api_reply_problem(req, API_P_UNAVAILABLE, "resources.nodes",
					 "cannot check which Slurm nodes are up for a %d-node job: %s", want, why);
		return false;
	}
	if (cn.up >= want)
		return true;
	if (want > cn.total) /* can never start here: the spec is what is wrong */
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "resources.nodes",
					 "asks for %d nodes; the Slurm cluster has %d (%d up%s%s)", want, cn.total,
					 cn.up, cn.ndown ? "; not usable: " : "", cn.down);
	else
		*ret = api_reply_problem(req, API_P_NODES_UNAVAILABLE, "resources.nodes",
					 "asks for %d nodes; %d of the cluster's %d %s up; not usable: %s "
					 "(resume them, e.g. scontrol update nodename=<node> state=resume, "
					 "or ask for fewer nodes)",
					 want, cn.up, cn.total, cn.up == 1 ? "is" : "are", cn.down);
	return false;
}

/* bf16 needs compute capability 8.0 (A100, H100, H200): a job asking for it
 * where fewer GPUs than it needs can do it (a V100 is 7.0) would be
 * answered 201 and then fail at its workers' start, so it is 422 here with
 * what to use instead. Multi-node jobs run on Slurm's nodes, whose GPUs
 * this machine does not see. Returns true, or replies 422 and sets *ret. */
static bool precision_fits(api_request *req, const json_t *spec, enum MHD_Result *ret)
{
	const json_t *res = json_object_get(spec, "resources");
	json_t *nodes = json_object_get(res, "nodes");
	json_t *g = json_object_get(res, "gpus");
	const char *kind = json_string_value(json_object_get(res, "device"));
	if (!json_is_true(json_object_get(json_object_get(spec, "training_args"), "bf16")) ||
	    (json_is_integer(nodes) && json_integer_value(nodes) > 1) || (kind && strcmp(kind, "cpu") == 0))
		return true;
	json_int_t want = json_is_integer(g) ? json_integer_value(g) : 1;
	json_int_t able = 0;
	const device *old = NULL;
	for (size_t i = 0; i < req->cfg->n_devices; i++) {
		const device *d = &req->cfg->devices[i];
		if (d->kind != DEVICE_CUDA)
			continue;
		if (d->cc_major == 0 || d->cc_major >= 8) /* 0: NVML did not say */
			able++;
		else if (!old)
			old = d;
	}
	if (!old || able >= want)
		return true;
	*ret = api_reply_problem(req, API_P_INVALID_SPEC, "training_args.bf16",
				 "bf16 needs compute capability 8.0 or newer; %s %d (%s) is %d.%d and this "
				 "machine has %lld GPU%s that can (the job asks for %lld): use fp16 (with "
				 "dynamic loss scaling) or fp32",
				 "GPU", old->index, old->name, old->cc_major, old->cc_minor, (long long)able,
				 able == 1 ? "" : "s", (long long)want);
	return false;
}

/* A job on more than one of this machine's GPUs reduces its gradients with
 * NCCL; where the daemon found none it can load at start (common/nccl_lib.h),
 * such a job would be answered 201 and then fail at its workers' start, so
 * it is 422 here naming what to install. Multi-node jobs run on Slurm's
 * nodes, whose libraries this machine does not see. Returns true, or replies
 * 422 and sets *ret. */
static bool nccl_fits(api_request *req, const json_t *spec, enum MHD_Result *ret)
{
	const json_t *res = json_object_get(spec, "resources");
	json_t *nodes = json_object_get(res, "nodes");
	json_t *g = json_object_get(res, "gpus");
	const char *kind = json_string_value(json_object_get(res, "device"));
	json_int_t want = json_is_integer(g) ? json_integer_value(g) : 1;
	if (req->cfg->nccl_version || want < 2 || (json_is_integer(nodes) && json_integer_value(nodes) > 1) ||
	    (kind && strcmp(kind, "cpu") == 0))
		return true;
	bool gpus = false;
	for (size_t i = 0; i < req->cfg->n_devices; i++)
		gpus |= req->cfg->devices[i].kind == DEVICE_CUDA;
	if (!gpus) /* CPU workers reduce over shared memory */
		return true;
	*ret = api_reply_problem(req, API_P_INVALID_SPEC, "resources.gpus",
				 "a %lld-GPU job reduces its gradients with NCCL, which this host cannot load "
				 "(%s): install NCCL 2.14 or newer (pip install nvidia-nccl-cu12, or NVIDIA's "
				 "libnccl2 package) and restart bertd, or set bertd's nccl_path to its "
				 "libnccl.so.2; or ask for 1 GPU",
				 (long long)want, req->cfg->nccl_problem ? req->cfg->nccl_problem : "not found");
	return false;
}

/* The vocab sha256 in the manifest of ready dataset `name` (under the first
 * data root, where bertd-prepare writes) into hex; "" when unreadable. */
static void dataset_vocab_sha(api_request *req, const char *name, char hex[65])
{
	char path[PATH_MAX + 128];
	snprintf(path, sizeof path, "%s/datasets/%s/manifest.json",
		 req->cfg->n_data_roots ? req->cfg->data_roots[0] : ".", name);
	json_t *m = json_load_file(path, 0, NULL);
	const char *sha = json_string_value(json_object_get(json_object_get(m, "vocab"), "sha256"));
	snprintf(hex, 65, "%s", sha ? sha : "");
	json_decref(m);
}

/* A mixture's components (jobspec checked names, proportions and
 * duplicates): each must exist, and the ready ones must share one vocab,
 * since a token id must mean the same word in every batch (one still
 * preparing is checked when the job starts: its loaders refuse another
 * vocab). Returns true, or replies 422 naming dataset[i].name. */
static bool mixture_exists(api_request *req, json_t *mix, enum MHD_Result *ret)
{
	char first_sha[65] = "", field[48];
	size_t first = 0, i;
	json_t *e;
	json_array_foreach(mix, i, e) {
		const char *name = json_string_value(json_object_get(e, "name"));
		store_dataset ds;
		int rc = store_dataset_get_by_name(req->st, name, &ds);
		snprintf(field, sizeof field, "dataset[%zu].name", i);
		if (rc == -ENOENT) {
			*ret = api_reply_problem(req, API_P_INVALID_SPEC, field,
						 "no dataset \"%s\" (create one with POST /v1/datasets; "
						 "GET /v1/datasets lists them)", name);
			return false;
		}
		if (rc < 0) {
			*ret = api_reply_store_error(req, rc, "looking up the dataset failed");
			return false;
		}
		bool ready = ds.state == DATASET_READY;
		store_dataset_free(&ds);
		if (!ready)
			continue;
		char sha[65];
		dataset_vocab_sha(req, name, sha);
		if (!sha[0])
			continue;
		if (!first_sha[0]) {
			memcpy(first_sha, sha, sizeof sha);
			first = i;
		} else if (strcmp(sha, first_sha) != 0) {
			*ret = api_reply_problem(req, API_P_INVALID_SPEC, field,
						 "dataset \"%s\" has another vocab than dataset[%zu] (vocab sha256 "
						 "%.12s vs %.12s): the datasets of a mixture must share one vocab",
						 name, first, sha, first_sha);
			return false;
		}
	}
	return true;
}

/* What the job needs must exist, or it would be answered 201 and fail a
 * moment later: the dataset must be known (one still preparing is fine, the
 * job waits for it) and resources.gpus must fit the machine. Returns true,
 * or replies 422 naming the field and what exists, and sets *ret. */
static bool needs_exist(api_request *req, const json_t *spec, enum MHD_Result *ret)
{
	json_t *g = json_object_get(json_object_get(spec, "resources"), "gpus");
	json_t *nodes = json_object_get(json_object_get(spec, "resources"), "nodes");
	json_int_t want = json_is_integer(g) ? json_integer_value(g) : 1;
	size_t have = req->cfg->n_devices;
	/* several nodes: Slurm places the ranks, not this machine (docs/multinode.md) */
	if (!(json_is_integer(nodes) && json_integer_value(nodes) > 1) && want > (json_int_t)have) {
		const char *what = have && req->cfg->devices[0].kind == DEVICE_CUDA ? "GPU" : "CPU worker slot";
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "resources.gpus",
					 "asks for %lld devices; this machine has %zu (%s%s, see GET /v1/devices)",
					 (long long)want, have, what, have == 1 ? "" : "s");
		return false;
	}
	json_t *mix = json_object_get(spec, "dataset");
	if (json_is_array(mix) && !mixture_exists(req, mix, ret))
		return false;
	const char *name = json_is_array(mix) ? NULL : json_string_value(mix);
	store_dataset ds;
	int rc = json_is_array(mix) ? 0 : name ? store_dataset_get_by_name(req->st, name, &ds) : -ENOENT;
	if (rc == 0) {
		if (!json_is_array(mix))
			store_dataset_free(&ds);
		return json_is_integer(nodes) && json_integer_value(nodes) > 1
			       ? nodes_up(req, (int)json_integer_value(nodes), ret)
			       : true;
	}
	if (rc != -ENOENT) {
		*ret = api_reply_store_error(req, rc, "looking up the dataset failed");
		return false;
	}
	/* Name what exists, so a typo is obvious (bounded: the first few). */
	char known[256] = "";
	store_dataset *all = NULL;
	size_t n = 0, used = 0;
	if (store_dataset_list(req->st, &all, &n) == 0) {
		for (size_t i = 0; i < n && used + 4 < sizeof known; i++) {
			int w = snprintf(known + used, sizeof known - used, "%s\"%s\"", i ? ", " : "", all[i].name);
			if (w < 0 || (size_t)w >= sizeof known - used) {
				snprintf(known + used, sizeof known - used, ", ...");
				break;
			}
			used += (size_t)w;
		}
		store_datasets_free(all, n);
	}
	*ret = api_reply_problem(req, API_P_INVALID_SPEC, "dataset",
				 "no dataset \"%s\"; existing: %s (create one with POST /v1/datasets)",
				 name ? name : "", n ? known : "none");
	return false;
}

/* A submission waiting for its group commit (store_job_insert_async): what
 * its reply needs, alive from jobs_create to submit_free. */
typedef struct submit {
	store_insert ins;
	store_job job;
	struct MHD_Connection *conn;
	json_t *spec;
	char *spec_text, *body, *key;
	char *note; /* an event to add once the job is stored, or NULL */
	char owner[TOKENS_NAME_MAX + 1]; /* request_owner's, copied; "" not known */
	char id[21], hash[65];
} submit;

static void submit_free(void *arg)
{
	submit *sb = arg;
	json_decref(sb->spec);
	free(sb->spec_text);
	free(sb->body);
	free(sb->key);
	free(sb->note);
	free(sb->ins.prev_hash);
	free(sb->ins.prev_response);
	free(sb->ins.prev_job_id);
	free(sb);
}

/* A new id, the job row and the 201 body that goes with it. */
static int submit_prepare(submit *sb)
{
	int rc = make_id(sb->id);
	if (rc)
		return rc;
	const char *name = json_string_value(json_object_get(sb->spec, "name"));
	json_t *prio = json_object_get(sb->spec, "priority");
	int64_t now = now_ms();
	sb->job = (store_job){
		.id = sb->id,
		.name = (char *)(name && name[0] ? name : sb->id),
		.spec_json = sb->spec_text,
		.state = JOB_QUEUED,
		.priority = json_is_integer(prio) ? (int)json_integer_value(prio) : 0,
		.created_ms = now,
		.updated_ms = now,
		.owner = sb->owner[0] ? sb->owner : NULL,
	};
	json_t *tags = json_object_get(sb->spec, "tags"), *notes = json_object_get(sb->spec, "notes");
	free(sb->body);
	json_int_t max_steps = json_integer_value(
		json_object_get(json_object_get(sb->spec, "training_args"), "max_steps"));
	sb->body = dump_line(json_pack("{s:s, s:s, s:s, s:i, s:o, s:o, s:n, s:n, s:i, s:n, s:o, s:o, "
				       "s:o, s:[], s:{s:i, s:I}, s:n, s:s, s:O}",
				       "id", sb->job.id, "name", sb->job.name, "state", "queued",
				       "priority", sb->job.priority,
				       "created_at", time_json(now), "updated_at", time_json(now),
				       "started_at", "finished_at", "restart_count", 0,
				       "failure_reason",
				       "tags", json_is_array(tags) ? json_incref(tags) : json_array(),
				       "notes", json_is_string(notes) ? json_incref(notes) : json_null(),
				       "owner", sb->owner[0] ? json_string(sb->owner) : json_null(),
				       "devices", "progress", "step", 0,
				       "max_steps", max_steps, "last_checkpoint", "diagnosis",
				       "no telemetry yet", "spec", sb->spec));
	if (!sb->body)
		return -ENOMEM;
	sb->ins = (store_insert){.job = &sb->job, .idem_key = sb->key,
				 .idem_hash = sb->key ? sb->hash : NULL,
				 .response_json = sb->key ? sb->body : NULL};
	return 0;
}

/* The commit thread's word: the submission's result is in sb->ins. */
static void submit_done(store_insert *ins, void *arg)
{
	(void)ins;
	api_conn_resume(((submit *)arg)->conn);
}

/* The reply, once the commit that holds the job (or its failure) is known. */
static enum MHD_Result submit_reply(api_request *req, void *arg)
{
	submit *sb = arg;
	char location[64];
	int rc = sb->ins.rc;
	/* -EEXIST without a previous key: the random id was taken (2^-64 odds
	 * per job): again with a new one, here and waiting */
	for (int attempt = 1; rc == -EEXIST && !sb->ins.prev_hash && attempt < 4; attempt++) {
		if ((rc = submit_prepare(sb)) != 0)
			break;
		rc = store_job_insert(req->st, &sb->job, sb->ins.idem_key, sb->ins.idem_hash,
				      sb->ins.response_json, &sb->ins.prev_hash,
				      &sb->ins.prev_response, &sb->ins.prev_job_id);
	}
	const char *prev_hash = sb->ins.prev_hash, *prev_resp = sb->ins.prev_response;
	const char *prev_id = sb->ins.prev_job_id;
	if (rc == 0) {
		snprintf(location, sizeof location, "/v1/jobs/%s", sb->id);
		if (api_add_header(req, MHD_HTTP_HEADER_LOCATION, location))
			return MHD_NO;
		const char *name = json_string_value(json_object_get(sb->spec, "name"));
		log_info("job %s submitted (%s)", sb->id, name ? name : "");
		int nrc = sb->note ? store_job_note(req->st, sb->id, sb->note) : 0;
		if (nrc < 0)
			log_warn("job %s: cannot add its event \"%s\": %s", sb->id, sb->note, strerror(-nrc));
		telemetry_job_submitted();
		return api_reply_raw(req, MHD_HTTP_CREATED, "application/json", sb->body,
				     strlen(sb->body));
	}
	if (rc == -EEXIST && prev_hash) {
		if (strcmp(prev_hash, sb->hash) != 0)
			return api_reply_problem(req, API_P_IDEMPOTENCY_REUSE, "Idempotency-Key",
						 "this key was first used with a different body (for job "
						 "%s); use a new key for a new job",
						 prev_id ? prev_id : "?");
		if (!prev_resp || !prev_id)
			return api_reply_problem(req, API_P_INTERNAL, NULL,
						 "the stored answer for this key is incomplete");
		snprintf(location, sizeof location, "/v1/jobs/%s", prev_id);
		if (api_add_header(req, MHD_HTTP_HEADER_LOCATION, location) ||
		    api_add_header(req, "Idempotent-Replayed", "true"))
			return MHD_NO;
		return api_reply_raw(req, MHD_HTTP_CREATED, "application/json", prev_resp,
				     strlen(prev_resp));
	}
	return api_reply_store_error(req, rc < 0 ? rc : -EIO, "storing the job failed");
}

enum MHD_Result jobs_create(api_request *req)
{
	enum MHD_Result ret;
	json_t *in = NULL, *spec = NULL;
	char *spec_text = NULL, *note = NULL;
	char detail[256];
	int rc;

	const char *key = api_header(req, "Idempotency-Key");
	if (key && !idem_key_ok(key)) {
		ret = api_reply_problem(req, API_P_INVALID_PARAMETER, "Idempotency-Key",
					"Idempotency-Key must be 1..%d printable ASCII characters "
					"without spaces", IDEM_KEY_MAX);
		goto out;
	}
	if (req->body_len == 0) {
		ret = api_reply_problem(req, API_P_BAD_REQUEST, NULL,
					"the body must be a job spec (a JSON object)");
		goto out;
	}
	rc = api_json_parse(req->body, req->body_len, API_JSON_MAX_DEPTH, &in, detail,
			    sizeof detail);
	if (rc) {
		ret = api_reply_problem(req, rc == -E2BIG ? API_P_JSON_TOO_DEEP : API_P_MALFORMED_JSON,
					NULL, "%s", detail);
		goto out;
	}
	if (json_is_object(in) && !init_from_resolve(req, in, true, &ret))
		goto out;
	jobspec_error err = {0};
	if (jobspec_normalize(in, &spec, &err)) {
		ret = api_reply_problem(req,
					err.status == 400 ? API_P_MALFORMED_SPEC : API_P_INVALID_SPEC,
					err.field, "%s", err.detail[0] ? err.detail : "invalid job spec");
		goto out;
	}
	if (!init_from_resolve(req, spec, false, &ret) || !init_from_model(req, in, &spec, &note, &ret) ||
	    !needs_exist(req, spec, &ret) ||
	    !jobs_resolve_epochs(req, spec, &ret))
		goto out;
	if (!precision_fits(req, spec, &ret) || !nccl_fits(req, spec, &ret))
		goto out;
	/* profiler.rules: the thresholds belong to the rules (docs/diagnosis.md) */
	diag_config dcfg;
	char dfield[160], ddetail[160];
	if (diag_config_parse(json_object_get(json_object_get(spec, "profiler"), "rules"), &dcfg, dfield,
			      sizeof dfield, ddetail, sizeof ddetail) < 0) {
		ret = api_reply_problem(req, API_P_INVALID_SPEC, dfield, "%s", ddetail);
		goto out;
	}
	/* After every check of the spec: an invalid spec is the client's to fix
	 * (422) whatever the disk; a valid one is refused over the ceiling. */
	retention_ceiling ceil;
	if (req->cfg->retention && retention_over_ceiling(req->cfg->retention, &ceil) == 1) {
		ret = api_reply_problem(req, API_P_DB_FULL, ceil.key,
					"the disk-usage ceiling is %llu %s and %llu are in use; delete "
					"jobs (DELETE /v1/jobs/{id}) or raise %s", (unsigned long long)ceil.ceiling,
					ceil.unit, (unsigned long long)ceil.used, ceil.key);
		goto out;
	}
	spec_text = api_json_dumps(spec, false);
	if (!spec_text) {
		ret = api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
		goto out;
	}
	/* The digest is of the bytes sent: a retry is the same request only if
	 * it is byte-identical, which is what client retry loops produce. */
	submit *sb = calloc(1, sizeof *sb);
	if (!sb || (key && !(sb->key = strdup(key)))) {
		free(sb);
		ret = api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
		goto out;
	}
	sha256_hex(req->body, req->body_len, sb->hash);
	sb->conn = req->conn;
	snprintf(sb->owner, sizeof sb->owner, "%s", request_owner(req) ? request_owner(req) : "");
	sb->spec = spec;
	sb->spec_text = spec_text;
	sb->note = note;
	spec = NULL;
	spec_text = NULL;
	note = NULL;
	if ((rc = submit_prepare(sb)) != 0) {
		submit_free(sb);
		ret = api_reply_store_error(req, rc, "storing the job failed");
		goto out;
	}
	/* The 201 goes out once the group commit that holds the job is done;
	 * meanwhile the connection is suspended and its thread serves others. */
	api_defer(req, submit_reply, sb, submit_free);
	if ((rc = store_job_insert_async(req->st, &sb->ins, submit_done, sb)) < 0) {
		sb->ins.rc = rc;
		api_conn_resume(req->conn);
	}
	ret = MHD_YES;
out:
	json_decref(in);
	json_decref(spec);
	free(spec_text);
	free(note);
	return ret;
}

/* ------------------------------------------------------------ list */

static const char b64url[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* Cursors are base64url (no padding) of the decimal seq: opaque to clients,
 * so the paging basis can change without breaking the contract. */
static void cursor_encode(int64_t seq, char out[40])
{
	char dec[24];
	int n = snprintf(dec, sizeof dec, "%lld", (long long)seq);
	size_t o = 0;
	for (int i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)(unsigned char)dec[i] << 16;
		int take = n - i < 3 ? n - i : 3;
		if (take > 1)
			v |= (uint32_t)(unsigned char)dec[i + 1] << 8;
		if (take > 2)
			v |= (unsigned char)dec[i + 2];
		for (int k = 0; k <= take; k++)
			out[o++] = b64url[(v >> (18 - 6 * k)) & 63];
	}
	out[o] = 0;
}

static int cursor_decode(const char *s, int64_t *seq)
{
	size_t n = strlen(s);
	char dec[24];
	size_t d = 0;
	if (n == 0 || n > 28 || n % 4 == 1)
		return -EINVAL;
	for (size_t i = 0; i < n; i += 4) {
		uint32_t v = 0;
		size_t take = n - i < 4 ? n - i : 4;
		for (size_t k = 0; k < 4; k++) {
			uint32_t six = 0;
			if (k < take) {
				const char *p = strchr(b64url, s[i + k]);
				if (!p || !s[i + k])
					return -EINVAL;
				six = (uint32_t)(p - b64url);
			}
			v = v << 6 | six;
		}
		for (size_t k = 0; k + 1 < take; k++)
			dec[d++] = (char)(v >> (16 - 8 * k));
	}
	dec[d] = 0;
	if (d == 0 || d > 18 || dec[0] == '0')
		return -EINVAL;
	int64_t v = 0;
	for (size_t i = 0; i < d; i++) {
		if (dec[i] < '0' || dec[i] > '9')
			return -EINVAL;
		v = v * 10 + (dec[i] - '0');
	}
	char again[40];
	cursor_encode(v, again);
	if (strcmp(again, s) != 0)
		return -EINVAL; /* non-canonical spelling: not one we handed out */
	*seq = v;
	return 0;
}

struct list_query {
	unsigned state_mask;
	int limit;
	int64_t after_seq; /* with newest: the seq to stay below */
	bool newest;       /* order=desc */
	const char *tag;   /* only jobs carrying this tag; NULL: any */
	const char *owner; /* only jobs of this owner; NULL: any */
	const char *bad_field;
	char detail[256];
};

static int parse_states(const char *v, struct list_query *q)
{
	char buf[256];
	if (strlen(v) >= sizeof buf)
		return -EINVAL;
	strcpy(buf, v);
	char *save = NULL;
	if (!buf[0] || buf[0] == ',' || buf[strlen(buf) - 1] == ',' || strstr(buf, ",,"))
		return -EINVAL;
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		enum job_state s;
		if (job_state_parse(t, &s))
			return -EINVAL;
		q->state_mask |= JOB_MASK(s);
	}
	return 0;
}

/* A tag as the job spec takes it (jobspec's rule, so a filter can name
 * every tag a job can carry and nothing else). */
static bool tag_valid(const char *v)
{
	json_t *one = json_pack("[s]", v), *res = NULL;
	jobspec_error err;
	bool ok = one && jobspec_check_key("tags", one, &res, &err) == 0;
	json_decref(one);
	json_decref(res);
	return ok;
}

#define OWNER_MAX 128
static bool owner_valid(const char *v)
{
	size_t n = strlen(v);
	if (n == 0 || n > OWNER_MAX)
		return false;
	for (; *v; v++)
		if (*v < 0x21 || *v > 0x7e)
			return false;
	return true;
}

static int list_arg(void *cls, const char *key, const char *value)
{
	struct list_query *q = cls;
	if (!key[0])
		return 0; /* "?&limit=5": an empty pair, harmless */
	q->bad_field = key;
	if (strcmp(key, "state") == 0) {
		if (!value || parse_states(value, q)) {
			snprintf(q->detail, sizeof q->detail,
				 "state must be a comma-separated list of queued, starting, "
				 "running, restarting, stopping, completed, failed, canceled; got '%s'",
				 value ? value : "");
			return -EINVAL;
		}
	} else if (strcmp(key, "limit") == 0) {
		char *end = NULL;
		long v = value && value[0] >= '0' && value[0] <= '9' ? strtol(value, &end, 10) : 0;
		if (!end || *end || v < 1 || v > LIST_LIMIT_MAX) {
			snprintf(q->detail, sizeof q->detail, "limit must be an integer in 1..%d",
				 LIST_LIMIT_MAX);
			return -EINVAL;
		}
		q->limit = (int)v;
	} else if (strcmp(key, "cursor") == 0) {
		if (!value || cursor_decode(value, &q->after_seq)) {
			snprintf(q->detail, sizeof q->detail,
				 "cursor is not one this server handed out (use next_cursor as is)");
			return -EINVAL;
		}
	} else if (strcmp(key, "order") == 0) {
		if (!value || (strcmp(value, "asc") && strcmp(value, "desc"))) {
			snprintf(q->detail, sizeof q->detail, "order must be asc or desc; got '%s'",
				 value ? value : "");
			return -EINVAL;
		}
		q->newest = strcmp(value, "desc") == 0;
	} else if (strcmp(key, "tag") == 0) {
		if (!value || !tag_valid(value)) {
			snprintf(q->detail, sizeof q->detail,
				 "tag must be 1 to %d characters of A-Z a-z 0-9 . _ - : / @ + =, starting "
				 "with a letter or digit", JOBSPEC_TAG_MAX);
			return -EINVAL;
		}
		q->tag = value;
	} else if (strcmp(key, "owner") == 0) {
		if (!value || !owner_valid(value)) {
			snprintf(q->detail, sizeof q->detail,
				 "owner must be 1 to %d printable ASCII characters (a token's name)",
				 OWNER_MAX);
			return -EINVAL;
		}
		q->owner = value;
	} else {
		snprintf(q->detail, sizeof q->detail,
			 "unknown query parameter; known: state, limit, cursor, order, tag, owner");
		return -EINVAL;
	}
	q->bad_field = NULL;
	return 0;
}

/* ---- whole pages kept ----
 *
 * A page whose jobs all have kept texts (none running, so none depends on
 * the clock) stays the same bytes until some job is written, and every
 * write of any job moves store_jobs_revision. So the body of such a page
 * is assembled once per (revision, query) and kept as one prepared reply:
 * every client asking for that page at that revision is answered by the
 * server thread that read its request, at once, from that one buffer (no
 * page thread, no store read, no copy). A queued job that changes, starts,
 * or a job submitted or deleted anywhere moves the revision, so the next
 * request reads the page afresh (keys, kept texts) and keeps the new one.
 * PAGE_SLOTS pages at most (about 200 KB each at limit=100), one per slot
 * by the query's hash; a page of an older revision stays until its slot is
 * taken. */
#define PAGE_SLOTS 64

/* What a page is of: the query, and the server (model_dir in the texts). */
typedef struct page_key {
	const api_config *cfg;
	unsigned state_mask;
	int64_t seq_bound;
	bool newest;
	int limit;
	const char *tag, *owner; /* NULL: any */
} page_key;

typedef struct kept_page {
	uint64_t rev;        /* store_jobs_revision before the page's read began */
	page_key k;          /* tag and owner: owned copies */
	api_prepared *body;  /* NULL: the slot is free */
} kept_page;

static kept_page page_cache[PAGE_SLOTS];
static pthread_mutex_t page_mu = PTHREAD_MUTEX_INITIALIZER;

static bool same_str(const char *a, const char *b)
{
	return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static bool page_key_eq(const page_key *a, const page_key *b)
{
	return a->cfg == b->cfg && a->state_mask == b->state_mask && a->seq_bound == b->seq_bound &&
	       a->newest == b->newest && a->limit == b->limit && same_str(a->tag, b->tag) &&
	       same_str(a->owner, b->owner);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	for (const unsigned char *c = p; n--; c++)
		h = (h ^ *c) * 1099511628211ull;
	return h;
}

static size_t page_slot(const page_key *k)
{
	uint64_t h = 1469598103934665603ull;
	h = fnv(h, &k->cfg, sizeof k->cfg);
	h = fnv(h, &k->state_mask, sizeof k->state_mask);
	h = fnv(h, &k->seq_bound, sizeof k->seq_bound);
	h = fnv(h, &k->newest, sizeof k->newest);
	h = fnv(h, &k->limit, sizeof k->limit);
	if (k->tag)
		h = fnv(h, k->tag, strlen(k->tag) + 1);
	h = fnv(h, "|", 1);
	if (k->owner)
		h = fnv(h, k->owner, strlen(k->owner) + 1);
	return (size_t)(h % PAGE_SLOTS);
}

/* The kept body of k's page at revision rev (a reference: the caller
 * api_prepared_puts it), or NULL. */
static api_prepared *page_kept_get(const page_key *k, uint64_t rev)
{
	api_prepared *p = NULL;
	kept_page *e = &page_cache[page_slot(k)];
	pthread_mutex_lock(&page_mu);
	if (e->body && e->rev == rev && page_key_eq(&e->k, k))
		p = api_prepared_ref(e->body);
	pthread_mutex_unlock(&page_mu);
	return p;
}

/* Keeps body (takes a reference) as k's page at revision rev, in place of
 * whatever its slot held. Out of memory: nothing is kept. */
static void page_kept_put(const page_key *k, uint64_t rev, api_prepared *body)
{
	kept_page e = {.rev = rev, .k = *k, .body = body};
	e.k.tag = k->tag ? strdup(k->tag) : NULL;
	e.k.owner = k->owner ? strdup(k->owner) : NULL;
	if ((k->tag && !e.k.tag) || (k->owner && !e.k.owner)) {
		free((char *)e.k.tag);
		free((char *)e.k.owner);
		return;
	}
	api_prepared_ref(body);
	kept_page *slot = &page_cache[page_slot(k)];
	pthread_mutex_lock(&page_mu);
	kept_page old = *slot;
	*slot = e;
	pthread_mutex_unlock(&page_mu);
	api_prepared_put(old.body);
	free((char *)old.k.tag);
	free((char *)old.k.owner);
}

/* ---- list pages read and rendered off the server threads ----
 *
 * Every page is read from the store (its rows, ~1-2 ms for 100 jobs with
 * their specs) and its texts gathered on the page threads, never on the
 * server thread that read the request: that thread's other connections
 * (/v1/healthz above all) would wait behind it. Kept texts are shared; jobs
 * to render (running ones, or the first look at a sweep just submitted:
 * ~0.1-0.3 ms each) are rendered there too. The connection is suspended
 * meanwhile (api_defer), so a server thread only parses requests and sends
 * bodies. */
#define RENDER_THREADS 2
/* How much lower the page threads' CPU priority is than the server
 * threads' (nice, per thread): a page thread reading and rendering never
 * delays a server thread that answers a health probe or sends a kept page
 * on a busy machine; it takes the CPU they leave. */
#define RENDER_NICE 5

/* One page to render: the rows read, their texts (references), the answer. */
typedef struct list_work {
	struct list_work *next;    /* in render_queue */
	struct MHD_Connection *conn;
	store *st;
	const api_config *cfg;
	store_job_filter f;        /* the page asked for; tag and owner point at the copies below */
	char *tag, *owner;         /* owned */
	int64_t seq_bound;
	bool newest;
	int limit;
	store_job *jobs;           /* (n) rows, owned */
	size_t n;
	rtext **texts;             /* (n) owned references, NULL until rendered */
	int64_t next_seq;          /* the page's next cursor, 0: none */
	int rc;                    /* jobs_texts_render's */
	api_prepared *page;        /* the whole body, when the page is kept (a reference) */
} list_work;

static struct {
	pthread_mutex_t mu;
	pthread_cond_t wake;
	list_work *head, *tail;
	bool started; /* a page thread runs */
} render_q = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, false};

static void list_work_free(void *arg)
{
	list_work *w = arg;
	api_prepared_put(w->page);
	for (size_t i = 0; w->texts && i < w->n; i++)
		rtext_put(w->texts[i]);
	free(w->texts);
	store_jobs_free(w->jobs, w->n);
	free(w->tag);
	free(w->owner);
	free(w);
}

/* Drops what a read of w's page gathered. */
static void list_work_reset(list_work *w)
{
	for (size_t i = 0; w->texts && i < w->n; i++)
		rtext_put(w->texts[i]);
	free(w->texts);
	store_jobs_free(w->jobs, w->n);
	w->texts = NULL;
	w->jobs = NULL;
	w->n = 0;
	w->next_seq = 0;
}

static page_key list_work_key(const list_work *w)
{
	return (page_key){.cfg = w->cfg, .state_mask = w->f.state_mask, .seq_bound = w->seq_bound,
			  .newest = w->newest, .limit = w->limit, .tag = w->tag, .owner = w->owner};
}

/* "],\"next_cursor\":...}\n", the end of every page's body. */
static void page_tail(int64_t next_seq, char tail[64])
{
	char cursor[48] = "null";
	if (next_seq > 0) {
		char c[40];
		cursor_encode(next_seq, c);
		snprintf(cursor, sizeof cursor, "\"%s\"", c);
	}
	snprintf(tail, 64, "],\"next_cursor\":%s}\n", cursor);
}

/* Whether w's page (read at revision rev, its texts all there) is the same
 * bytes for as long as the revision stays rev: no running job in it (their
 * diagnosis reads the clock), every job's version known, and no write of
 * any job since the read began. */
static bool page_keepable(const list_work *w, uint64_t rev)
{
	for (size_t i = 0; i < w->n; i++)
		if (!w->texts[i] || w->jobs[i].state == JOB_RUNNING || !w->jobs[i].version)
			return false;
	return store_jobs_revision(w->st) == rev;
}

/* Assembles w's body into one buffer, as list_reply's stream would send
 * it, keeps it as the page at revision rev and sets w->page. Out of
 * memory: nothing kept, the page is streamed. */
static void page_keep(list_work *w, uint64_t rev)
{
	static const char head[] = "{\"jobs\":[";
	char tail[64];
	page_tail(w->next_seq, tail);
	size_t tail_len = strlen(tail), size = sizeof head - 1 + tail_len;
	for (size_t i = 0; i < w->n; i++)
		size += w->texts[i]->len + (i > 0);
	char *body = malloc(size), *at = body;
	if (!body)
		return;
	memcpy(at, head, sizeof head - 1);
	at += sizeof head - 1;
	for (size_t i = 0; i < w->n; i++) {
		if (i)
			*at++ = ',';
		memcpy(at, w->texts[i]->text, w->texts[i]->len);
		at += w->texts[i]->len;
	}
	memcpy(at, tail, tail_len);
	if (!(w->page = api_prepared_create("application/json", body, size)))
		return;
	page_key k = list_work_key(w);
	page_kept_put(&k, rev, w->page);
}

/* The page of w: kept whole at the store's revision, or its rows, the kept
 * texts, the others rendered; sets w->rc (a store error, -ENOMEM, or 0).
 * The page's keys are read first (id, state, version: no spec, no record
 * copied); only when a text is not kept are the whole rows read, and the
 * page made from that read. Pages asked for at once (many clients polling
 * the same first page) are read once: those run after it find the page
 * (or the texts) it kept. */
static void list_work_run(list_work *w)
{
	uint64_t rev = store_jobs_revision(w->st);
	page_key k = list_work_key(w);
	if ((w->page = page_kept_get(&k, rev))) {
		w->rc = 0;
		return;
	}
	int rc = store_job_list_keys(w->st, &w->f, w->seq_bound, w->newest, w->limit, &w->jobs, &w->n,
				     &w->next_seq);
	if (rc == 0 && !(w->texts = calloc(w->n ? w->n : 1, sizeof *w->texts)))
		rc = -ENOMEM;
	if (rc == 0 && jobs_texts_kept(w->jobs, w->n, w->cfg, w->texts)) {
		list_work_reset(w);
		rc = store_job_list_filtered(w->st, &w->f, w->seq_bound, w->newest, w->limit, &w->jobs, &w->n,
					     &w->next_seq);
		if (rc == 0 && !(w->texts = calloc(w->n ? w->n : 1, sizeof *w->texts)))
			rc = -ENOMEM;
		if (rc == 0 && jobs_texts_kept(w->jobs, w->n, w->cfg, w->texts))
			rc = jobs_texts_render(w->st, w->jobs, w->n, w->cfg, w->texts);
	}
	if (rc == 0 && page_keepable(w, rev))
		page_keep(w, rev);
	w->rc = rc;
}

/* A render thread: renders each queued page, then resumes its connection,
 * which is the last it touches of the work (the reply owns it from then). */
static void *render_main(void *arg)
{
	(void)arg;
	/* On Linux the nice value is each thread's own. Failing to lower it is
	 * harmless: the pages are then made at the server threads' priority. */
	id_t self = (id_t)syscall(SYS_gettid);
	errno = 0;
	int nice = getpriority(PRIO_PROCESS, self);
	if (errno == 0 && setpriority(PRIO_PROCESS, self, nice + RENDER_NICE) < 0)
		log_debug("page thread: setpriority: %s", strerror(errno));
	pthread_setname_np(pthread_self(), "bertd-page");
	for (;;) {
		pthread_mutex_lock(&render_q.mu);
		while (!render_q.head)
			pthread_cond_wait(&render_q.wake, &render_q.mu);
		list_work *w = render_q.head;
		render_q.head = w->next;
		if (!render_q.head)
			render_q.tail = NULL;
		pthread_mutex_unlock(&render_q.mu);
		list_work_run(w);
		api_conn_resume(w->conn);
	}
	return NULL;
}

/* Queues w for the render threads (started at the first page): 0, or
 * -EAGAIN when no render thread could be started (render it in place). */
static int render_enqueue(list_work *w)
{
	int rc = 0;
	pthread_mutex_lock(&render_q.mu);
	if (!render_q.started) { /* all of them at the first page (again while none runs) */
		for (int i = 0; i < RENDER_THREADS; i++) {
			pthread_t t;
			pthread_attr_t a;
			pthread_attr_init(&a);
			pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
			if (pthread_create(&t, &a, render_main, NULL) == 0)
				render_q.started = true; /* one is enough to make progress */
			pthread_attr_destroy(&a);
		}
	}
	if (!render_q.started) {
		rc = -EAGAIN;
		goto out;
	}
	w->next = NULL;
	if (render_q.tail)
		render_q.tail->next = w;
	else
		render_q.head = w;
	render_q.tail = w;
	pthread_cond_signal(&render_q.wake);
out:
	pthread_mutex_unlock(&render_q.mu);
	return rc;
}

/* A page's body sent straight from the job texts: {"jobs":[...],
 * "next_cursor":...} as api_reply_json would write it, as pieces (the
 * head, each text, the commas, the tail) copied into the server's send
 * buffer as it goes, so no page-sized buffer is made and copied. */
typedef struct page_body {
	rtext **texts;          /* (n) owned references */
	size_t n;
	size_t npiece, at, off; /* the piece being sent and how far into it */
	uint64_t sent;          /* bytes handed to the server so far */
	char tail[64];          /* ],"next_cursor":...}\n */
	struct {
		const char *p;
		size_t len;
	} piece[];              /* (npiece) */
} page_body;

static void page_body_free(void *cls)
{
	page_body *b = cls;
	for (size_t i = 0; i < b->n; i++)
		rtext_put(b->texts[i]);
	free(b->texts);
	free(b);
}

static ssize_t page_body_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	page_body *b = cls;
	if (pos != b->sent)
		return API_STREAM_ERROR; /* the server reads a body once, in order */
	size_t got = 0;
	while (got < max && b->at < b->npiece) {
		size_t k = b->piece[b->at].len - b->off;
		if (k > max - got)
			k = max - got;
		memcpy(buf + got, b->piece[b->at].p + b->off, k);
		got += k;
		b->off += k;
		if (b->off == b->piece[b->at].len) {
			b->at++;
			b->off = 0;
		}
	}
	if (got == 0)
		return API_STREAM_END;
	b->sent += got;
	return (ssize_t)got;
}

static enum MHD_Result list_reply(api_request *req, void *arg)
{
	list_work *w = arg;
	if (w->rc == 0 && w->page)
		return api_reply_prepared(req, MHD_HTTP_OK, w->page);
	int rc = w->rc;
	for (size_t i = 0; rc == 0 && i < w->n; i++)
		if (!w->texts[i])
			rc = -ENOMEM;
	if (rc < 0 && rc != -ENOMEM)
		return api_reply_store_error(req, rc, "listing jobs failed");
	if (!w->texts)
		rc = -ENOMEM;
	size_t npiece = 2 + (w->n ? 2 * w->n - 1 : 0);
	page_body *b = rc == 0 ? calloc(1, sizeof *b + npiece * sizeof b->piece[0]) : NULL;
	if (!b)
		return api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
	page_tail(w->next_seq, b->tail);
	static const char head[] = "{\"jobs\":[";
	uint64_t size = 0;
	size_t k = 0;
	b->piece[k].p = head;
	b->piece[k++].len = sizeof head - 1;
	for (size_t i = 0; i < w->n; i++) {
		if (i) {
			b->piece[k].p = ",";
			b->piece[k++].len = 1;
		}
		b->piece[k].p = w->texts[i]->text;
		b->piece[k++].len = w->texts[i]->len;
	}
	b->piece[k].p = b->tail;
	b->piece[k++].len = strlen(b->tail);
	b->npiece = k;
	for (size_t i = 0; i < k; i++)
		size += b->piece[i].len;
	/* the texts are the body's now */
	b->texts = w->texts;
	b->n = w->n;
	w->texts = NULL;
	api_stream st = {.content_type = "application/json", .size = size, .block = 64 * 1024,
			 .read = page_body_read, .free = page_body_free, .cls = b};
	return api_reply_stream(req, MHD_HTTP_OK, &st);
}

enum MHD_Result jobs_list(api_request *req)
{
	struct list_query q = {.limit = LIST_LIMIT_DEFAULT};
	if (api_query_each(req, list_arg, &q))
		return api_reply_problem(req, API_P_INVALID_PARAMETER, q.bad_field, "%s", q.detail);
	list_work *w = calloc(1, sizeof *w);
	if (!w)
		return api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
	*w = (list_work){.conn = req->conn, .st = req->st, .cfg = req->cfg, .seq_bound = q.after_seq,
			 .newest = q.newest, .limit = q.limit};
	if ((q.tag && !(w->tag = strdup(q.tag))) || (q.owner && !(w->owner = strdup(q.owner)))) {
		list_work_free(w);
		return api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
	}
	w->f = (store_job_filter){.state_mask = q.state_mask, .tag = w->tag, .owner = w->owner};
	/* A kept page is answered here and now: the one cheap case. */
	page_key k = list_work_key(w);
	api_prepared *page = page_kept_get(&k, store_jobs_revision(req->st));
	if (page) {
		list_work_free(w);
		enum MHD_Result ret = api_reply_prepared(req, MHD_HTTP_OK, page);
		api_prepared_put(page);
		return ret;
	}
	/* The reply (list_reply) comes when a page thread resumes us. */
	api_defer(req, list_reply, w, list_work_free);
	if (render_enqueue(w) < 0) {
		list_work_run(w);
		api_conn_resume(req->conn);
	}
	return MHD_YES;
}

/* ------------------------------------------------------------ one job */

enum MHD_Result jobs_get(api_request *req)
{
	const char *id = req->args.v[0];
	if (!id_plausible(id))
		return no_such_job(req, id);
	return reply_job(req, MHD_HTTP_OK, id);
}

enum MHD_Result jobs_cancel(api_request *req)
{
	const char *id = req->args.v[0];
	const unsigned running = JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING) |
				 JOB_MASK(JOB_RESTARTING);
	enum job_state cur = JOB_QUEUED;
	enum MHD_Result ret;
	int rc;
	char reason[TOKENS_NAME_MAX + 40], stopping[TOKENS_NAME_MAX + 40];
	if (!id_plausible(id))
		return no_such_job(req, id);
	if (!may_act_on_job(req, id, &ret))
		return ret;
	const char *by = request_owner(req) ? request_owner(req) : "user";
	snprintf(reason, sizeof reason, "canceled by %s", by);
	snprintf(stopping, sizeof stopping, "cancel requested by %s", by);
	/* Each step is a compare-and-set; if the scheduler moved the job in
	 * between, look again. Bounded: every retry follows a real transition
	 * by someone else, and the state machine only moves forward. */
	for (int tries = 0; tries < 8; tries++) {
		rc = store_job_transition(req->st, id, JOB_MASK(JOB_QUEUED), JOB_CANCELED, reason,
					  &cur);
		if (rc == 0) {
			log_info("job %s canceled while queued", id);
			telemetry_job_finished(JOB_CANCELED);
			return reply_job(req, MHD_HTTP_OK, id);
		}
		if (rc != -EBUSY)
			return store_failed(req, rc, id, "canceling job");
		if (job_state_is_terminal(cur))
			return api_reply_problem(req, API_P_JOB_STATE_CONFLICT, NULL,
						 "job %s is already %s", id, job_state_name(cur));
		if (cur == JOB_STOPPING)
			return reply_job(req, MHD_HTTP_ACCEPTED, id);
		if (JOB_MASK(cur) & running) {
			rc = store_job_stop_request(req->st, id, running, request_owner(req), stopping, &cur);
			if (rc == 0) {
				log_info("job %s stopping on user request", id);
				return reply_job(req, MHD_HTTP_ACCEPTED, id);
			}
			if (rc != -EBUSY)
				return store_failed(req, rc, id, "canceling job");
		}
	}
	return api_reply_problem(req, API_P_UNAVAILABLE, NULL,
				 "job %s kept changing state; try again", id);
}

/* ?keep_files: true keeps <state_dir>/jobs/<id>/ on disk; anything else
 * but false is a 400 naming the parameter. */
static bool keep_files_param(api_request *req, bool *keep, enum MHD_Result *ret)
{
	const char *v = api_query(req, "keep_files");
	*keep = false;
	if (!v || strcmp(v, "false") == 0 || strcmp(v, "0") == 0)
		return true;
	if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0) {
		*keep = true;
		return true;
	}
	*ret = api_reply_problem(req, API_P_INVALID_PARAMETER, "keep_files",
				 "keep_files must be true or false, not \"%s\"", v);
	return false;
}

/* The row goes at once; the directory is renamed aside first (so a job
 * that cannot be deleted keeps it) and removed by the retention thread,
 * never on this thread: GET /v1/system counts it under disk.deleting until
 * it is gone, and a restart finishes a removal a crash interrupted. */
enum MHD_Result jobs_delete(api_request *req)
{
	const char *id = req->args.v[0];
	static const char *const known[] = {"keep_files", NULL};
	enum MHD_Result ret;
	bool keep;
	if (!api_query_known(req, known, &ret) || !keep_files_param(req, &keep, &ret))
		return ret;
	if (!id_plausible(id))
		return no_such_job(req, id);
	store_job j = {0};
	int rc = store_job_get(req->st, id, &j);
	bool final = rc == 0 && job_state_is_terminal(j.state);
	char what[64];
	snprintf(what, sizeof what, "job %s", id);
	bool allowed = rc != 0 || api_may_act_on(req, j.owner, what, &ret);
	store_job_free(&j);
	if (!allowed)
		return ret;
	if (rc < 0 && rc != -ENOENT)
		return store_failed(req, rc, id, "deleting job");
	int moved = 0;
	if (final && !keep && req->cfg->retention &&
	    (moved = retention_detach(req->cfg->retention, id)) < 0)
		return api_reply_problem(req, API_P_INTERNAL, NULL,
					 "job %s: cannot move its directory aside for removal: %s", id,
					 strerror(-moved));
	rc = store_job_delete(req->st, id);
	if (moved == 1)
		retention_detach_end(req->cfg->retention, id, rc == 0);
	if (rc == 0) {
		/* its events go with it: the daemon log keeps who deleted it */
		log_info("job %s deleted by %s%s", id, request_owner(req) ? request_owner(req) : "user",
			 keep ? " (files kept)" : moved == 1 ? "; removing its files" : "");
		return api_reply_empty(req, MHD_HTTP_NO_CONTENT);
	}
	if (rc == -EBUSY) {
		store_job cur = {0};
		const char *state = "not finished";
		if (store_job_get(req->st, id, &cur) == 0)
			state = job_state_name(cur.state);
		enum MHD_Result r = api_reply_problem(req, API_P_JOB_STATE_CONFLICT, NULL,
						      "job %s is %s; only completed, failed or canceled "
						      "jobs can be deleted (cancel it first)", id, state);
		store_job_free(&cur);
		return r;
	}
	return store_failed(req, rc, id, "deleting job");
}

enum MHD_Result jobs_events(api_request *req)
{
	const char *id = req->args.v[0];
	store_event *ev = NULL;
	size_t n = 0;
	enum MHD_Result ret;
	static const char *const known[] = {"since", "follow", NULL};
	bool follow, given;
	int64_t since;
	if (!api_query_known(req, known, &ret) || !follow_param(req, &follow, &ret) ||
	    !follow_start(req, "since", follow, &since, &given, &ret))
		return ret;
	if (!id_plausible(id))
		return no_such_job(req, id);
	int rc = store_job_events(req->st, id, &ev, &n);
	if (rc)
		return store_failed(req, rc, id, "loading events");
	if (follow) { /* the job exists: stream (follow.c) from event since + 1 */
		store_events_free(ev, n);
		return follow_events(req, since);
	}
	json_t *arr = json_array();
	for (size_t i = (size_t)since; arr && i < n; i++) {
		json_t *e = follow_event_json(&ev[i], (int64_t)i + 1);
		if (json_array_append_new(arr, e)) {
			json_decref(arr);
			arr = NULL;
		}
	}
	store_events_free(ev, n);
	return api_reply_json(req, MHD_HTTP_OK, arr ? json_pack("{s:o}", "events", arr) : NULL);
}

/* ------------------------------------------------------------ change */

/* Whether job id may become "preemptible": true (a multi-node job may not:
 * jobspec.h's JOBSPEC_MULTINODE_NOT_PREEMPTIBLE); false with *ret the
 * answer (422 naming the field, or the store's failure). */
static bool preemptible_allowed(api_request *req, const char *id, enum MHD_Result *ret)
{
	store_job j = {0};
	int rc = store_job_get(req->st, id, &j);
	if (rc == -ENOENT)
		return true; /* the change answers 404 */
	if (rc < 0) {
		*ret = store_failed(req, rc, id, "changing job");
		return false;
	}
	json_t *spec = j.spec_json ? json_loads(j.spec_json, 0, NULL) : NULL;
	json_t *nodes = json_object_get(json_object_get(spec, "resources"), "nodes");
	bool multinode = json_is_integer(nodes) && json_integer_value(nodes) > 1;
	json_decref(spec);
	store_job_free(&j);
	if (multinode)
		*ret = api_reply_problem(req, API_P_INVALID_REQUEST, "preemptible", "%s",
					 JOBSPEC_MULTINODE_NOT_PREEMPTIBLE);
	return !multinode;
}

/* PATCH /v1/jobs/{id}: a merge-patch-like body {"priority", "name", "tags",
 * "notes", "preemptible"} (each optional; null clears tags and notes) changes a job that
 * is not finished. Every key is validated as the job spec validates it
 * (jobspec_check_key) before anything is written; the store then applies
 * all of them in one transaction that refuses a finished job, so a cancel
 * racing the change either comes first (409) or sees the changed job. */
enum MHD_Result jobs_patch(api_request *req)
{
	const char *id = req->args.v[0];
	enum MHD_Result ret;
	json_t *in = NULL, *name = NULL, *prio = NULL, *tags = NULL, *notes = NULL, *preempt = NULL;
	char *tags_text = NULL, *changed = NULL;
	char detail[256];
	if (!id_plausible(id))
		return no_such_job(req, id);
	if (!may_act_on_job(req, id, &ret))
		return ret;
	if (req->body_len == 0)
		return api_reply_problem(req, API_P_BAD_REQUEST, NULL,
					 "the body must be a JSON object with any of priority, name, "
					 "tags, notes, preemptible");
	int rc = api_json_parse(req->body, req->body_len, API_JSON_MAX_DEPTH, &in, detail,
				sizeof detail);
	if (rc)
		return api_reply_problem(req, rc == -E2BIG ? API_P_JSON_TOO_DEEP : API_P_MALFORMED_JSON,
					 NULL, "%s", detail);
	if (!json_is_object(in)) {
		ret = api_reply_problem(req, API_P_BAD_REQUEST, NULL,
					"the body must be a JSON object with any of priority, name, "
					"tags, notes, preemptible");
		goto out;
	}
	const char *key;
	size_t klen;
	json_t *v;
	json_object_keylen_foreach(in, key, klen, v) {
		json_t **slot = NULL;
		if (klen == strlen(key)) /* a key holding a NUL is no key of ours */
			slot = !strcmp(key, "priority") ? &prio : !strcmp(key, "name") ? &name
			     : !strcmp(key, "tags") ? &tags : !strcmp(key, "notes") ? &notes
			     : !strcmp(key, "preemptible") ? &preempt : NULL;
		if (!slot) {
			ret = api_reply_problem(req, API_P_INVALID_REQUEST, key,
						"unknown key; a job's priority, name, tags, notes and "
						"preemptible can be changed, nothing else");
			goto out;
		}
		jobspec_error err = {0};
		if (jobspec_check_key(key, v, slot, &err) < 0) {
			ret = err.status == 500
				? api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory")
				: api_reply_problem(req, API_P_INVALID_REQUEST, err.field, "%s", err.detail);
			goto out;
		}
	}
	if (json_is_true(preempt) && !preemptible_allowed(req, id, &ret))
		goto out;
	if (tags && !(tags_text = json_dumps(tags, JSON_COMPACT))) {
		ret = api_reply_problem(req, API_P_INTERNAL, NULL, "out of memory");
		goto out;
	}
	store_job_change c = {
		.name = name ? json_string_value(name) : NULL,
		.set_priority = prio != NULL,
		.priority = prio ? (int)json_integer_value(prio) : 0,
		.tags_json = tags_text,
		.set_notes = notes != NULL,
		.notes = json_string_value(notes), /* NULL for null: cleared */
		.set_preemptible = preempt != NULL,
		.preemptible = json_is_true(preempt),
		.by = request_owner(req),
	};
	enum job_state cur = JOB_QUEUED;
	rc = store_job_change_apply(req->st, id, &c, &changed, &cur);
	if (rc == -EBUSY)
		ret = api_reply_problem(req, API_P_JOB_STATE_CONFLICT, NULL,
					"job %s is already %s; a finished job cannot be changed", id,
					job_state_name(cur));
	else if (rc < 0)
		ret = store_failed(req, rc, id, "changing job");
	else
		ret = reply_job(req, MHD_HTTP_OK, id);
out:
	json_decref(in);
	json_decref(name);
	json_decref(prio);
	json_decref(tags);
	json_decref(notes);
	json_decref(preempt);
	free(tags_text);
	free(changed);
	return ret;
}
