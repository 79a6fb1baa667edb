/* jobdata — what a job produced: GET /v1/jobs/{id}/metrics (the logged time
 * series), /checkpoints and /logs (the tail of a worker's or loader's log
 * file); and, for POST /v1/jobs, the run length from its dataset's size
 * (jobs_resolve_epochs). Read-only; logs are read from
 * <state_dir>/jobs/<id>/logs, never from a path the client names. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/follow.h"
#include "api/handlers.h"
#include "api/http.h"
#include "common/jobspec.h"
#include "daemon/store.h"

#define METRICS_LIMIT_MAX 10000
#define LOG_TAIL_MAX 10000
#define LOG_READ_MAX (4u << 20) /* bytes of a log file's end considered */

static int query_int(api_request *req, const char *name, long long lo, long long hi, long long def,
		     long long *out)
{
	const char *v = api_query(req, name);
	if (!v) {
		*out = def;
		return 0;
	}
	char *end;
	errno = 0;
	long long x = strtoll(v, &end, 10);
	if (errno || end == v || *end || x < lo || x > hi)
		return -EINVAL;
	*out = x;
	return 0;
}

/* 404 for unknown jobs, so the sub-resources agree with GET /v1/jobs/{id}. */
static bool job_exists(api_request *req, enum MHD_Result *ret)
{
	store_job j;
	int rc = store_job_get(req->st, req->args.v[0], &j);
	if (rc == 0) {
		store_job_free(&j);
		return true;
	}
	if (rc == -ENOENT)
		*ret = api_reply_problem(req, API_P_JOB_NOT_FOUND, NULL, "no job %s", req->args.v[0]);
	else
		*ret = api_reply_store_error(req, rc, "loading job failed");
	return false;
}

bool jobs_resolve_epochs(api_request *req, json_t *spec, enum MHD_Result *ret)
{
	json_t *ta = json_object_get(spec, "training_args");
	if (json_integer_value(json_object_get(ta, "max_steps")) != -1)
		return true;
	jobspec_epoch_source src = {0};
	store_dataset ds;
	/* a mixture's epoch is the largest-proportion component's epoch over
	 * its proportion (docs/jobspec.md#mixtures): count that component's
	 * totals scaled up by 1/proportion */
	json_t *mix = json_object_get(spec, "dataset");
	const char *name = json_string_value(mix);
	double scale = 1.0;
	size_t i;
	json_t *e;
	json_array_foreach(mix, i, e) {
		double p = json_real_value(json_object_get(e, "proportion"));
		if (i == 0 || p > 1.0 / scale) {
			scale = 1.0 / p;
			name = json_string_value(json_object_get(e, "name"));
		}
	}
	int rc = name ? store_dataset_get_by_name(req->st, name, &ds) : -ENOENT;
	if (rc < 0 && rc != -ENOENT) {
		*ret = api_reply_store_error(req, rc, "looking up the dataset failed");
		return false;
	}
	if (rc == 0) {
		json_t *stats = ds.state == DATASET_READY && ds.stats_json
					? json_loads(ds.stats_json, 0, NULL) : NULL;
		json_t *tok = json_object_get(stats, "tokens"), *sen = json_object_get(stats, "sentences");
		if (json_is_integer(tok) && json_integer_value(tok) > 0)
			src.tokens = (uint64_t)json_integer_value(tok);
		if (json_is_integer(sen) && json_integer_value(sen) > 0)
			src.sentences = (uint64_t)json_integer_value(sen);
		json_t *docs = json_object_get(stats, "documents");
		if (json_is_integer(docs) && json_integer_value(docs) > 0)
			src.documents = (uint64_t)json_integer_value(docs);
		json_decref(stats);
		store_dataset_free(&ds);
		src.tokens = (uint64_t)llround((double)src.tokens * scale);
		src.sentences = (uint64_t)llround((double)src.sentences * scale);
	}
	jobspec_error err = {0};
	if (jobspec_resolve_epochs(spec, &src, &err) < 0) {
		*ret = api_reply_problem(req, err.status == 500 ? API_P_INTERNAL : API_P_INVALID_SPEC,
					 err.field, "%s", err.detail);
		return false;
	}
	return true;
}

enum MHD_Result jobs_metrics(api_request *req)
{
	enum MHD_Result ret;
	long long since, limit;
	static const char *const known[] = {"since_step", "limit", NULL};
	if (!api_query_known(req, known, &ret))
		return ret;
	if (query_int(req, "since_step", -1, INT64_MAX, -1, &since) < 0)
		return api_reply_problem(req, API_P_INVALID_PARAMETER, "since_step", "must be an integer >= -1");
	if (query_int(req, "limit", 1, METRICS_LIMIT_MAX, 1000, &limit) < 0)
		return api_reply_problem(req, API_P_INVALID_PARAMETER, "limit", "must be an integer in 1..%d",
					 METRICS_LIMIT_MAX);
	if (!job_exists(req, &ret))
		return ret;
	store_metric *m = NULL;
	size_t n = 0;
	int rc = store_metric_list(req->st, req->args.v[0], since, (int)limit, &m, &n);
	if (rc < 0)
		return api_reply_store_error(req, rc, "reading metrics failed");
	json_t *arr = json_array();
	for (size_t i = 0; i < n; i++) {
		json_t *o = json_loads(m[i].values_json, 0, NULL);
		if (!json_is_object(o)) {
			json_decref(o);
			o = json_object();
		}
		char t[32];
		api_time_format(m[i].time_ms, t);
		json_object_set_new(o, "step", json_integer(m[i].step));
		json_object_set_new(o, "time", json_string(t));
		json_array_append_new(arr, o);
	}
	json_t *body = json_pack("{s:o, s:o}", "metrics", arr, "next_since_step",
				 n == (size_t)limit ? json_integer(m[n - 1].step) : json_null());
	store_metrics_free(m, n);
	return api_reply_json(req, MHD_HTTP_OK, body);
}

enum MHD_Result jobs_checkpoints(api_request *req)
{
	enum MHD_Result ret;
	static const char *const known[] = {NULL};
	if (!api_query_known(req, known, &ret) || !job_exists(req, &ret))
		return ret;
	store_checkpoint *c = NULL;
	size_t n = 0;
	int rc = store_checkpoint_list(req->st, req->args.v[0], &c, &n);
	if (rc < 0)
		return api_reply_store_error(req, rc, "reading checkpoints failed");
	json_t *arr = json_array();
	for (size_t i = 0; i < n; i++) {
		char t[32];
		api_time_format(c[i].created_ms, t);
		json_array_append_new(arr, json_pack("{s:I, s:s, s:I, s:s}", "step", (json_int_t)c[i].step,
						     "path", c[i].path, "bytes", (json_int_t)c[i].bytes,
						     "created_at", t));
	}
	store_checkpoints_free(c, n);
	return api_reply_json(req, MHD_HTTP_OK, json_pack("{s:o}", "checkpoints", arr));
}

/* How many worker ranks (resources.gpus) and loader processes
 * (training_args.dataloader_num_workers) the job runs: which log files it
 * can have. Returns true, or replies (404, 500) and sets *ret. */
static bool job_processes(api_request *req, long long *ranks, long long *loaders,
			  enum MHD_Result *ret)
{
	store_job j;
	int rc = store_job_get(req->st, req->args.v[0], &j);
	if (rc == -ENOENT) {
		*ret = api_reply_problem(req, API_P_JOB_NOT_FOUND, NULL, "no job %s", req->args.v[0]);
		return false;
	}
	if (rc < 0) {
		*ret = api_reply_store_error(req, rc, "loading job failed");
		return false;
	}
	/* normalized again, as the supervisor does: a spec stored by an older
	 * bertd lacks keys added since */
	json_t *stored = j.spec_json ? json_loads(j.spec_json, 0, NULL) : NULL, *spec = NULL;
	jobspec_error jerr;
	if (stored && jobspec_normalize(stored, &spec, &jerr) < 0)
		spec = NULL;
	json_decref(stored);
	json_t *g = json_object_get(json_object_get(spec, "resources"), "gpus");
	json_t *l = json_object_get(json_object_get(spec, "training_args"), "dataloader_num_workers");
	bool ok = json_is_integer(g) && json_is_integer(l);
	if (ok) {
		*ranks = json_integer_value(g);
		*loaders = json_integer_value(l);
	} else {
		*ret = api_reply_problem(req, API_P_INTERNAL, NULL, "job %s has an unreadable spec", j.id);
	}
	json_decref(spec);
	store_job_free(&j);
	return ok;
}

enum MHD_Result jobs_logs(api_request *req)
{
	enum MHD_Result ret;
	long long rank, loader, tail;
	static const char *const known[] = {"rank", "loader", "tail", "follow", "offset", NULL};
	bool follow, has_offset;
	int64_t offset;
	if (!api_query_known(req, known, &ret) || !follow_param(req, &follow, &ret) ||
	    !follow_start(req, "offset", follow, &offset, &has_offset, &ret))
		return ret;
	if (has_offset && !follow)
		return api_reply_problem(req, API_P_INVALID_PARAMETER, "offset",
					 "offset is where a follow stream starts: add follow=1 "
					 "(without it, tail picks the lines)");
	if (api_query(req, "offset") && api_query(req, "tail"))
		return api_reply_problem(req, API_P_INVALID_PARAMETER, "offset",
					 "give tail or offset, not both");
	if (query_int(req, "rank", 0, 4095, 0, &rank) < 0)
		return api_reply_problem(req, API_P_INVALID_PARAMETER, "rank", "must be an integer in 0..4095");
	if (query_int(req, "loader", -1, 4095, -1, &loader) < 0)
		return api_reply_problem(req, API_P_INVALID_PARAMETER, "loader", "must be an integer in 0..4095");
	if (query_int(req, "tail", 1, LOG_TAIL_MAX, 200, &tail) < 0)
		return api_reply_problem(req, API_P_INVALID_PARAMETER, "tail", "must be an integer in 1..%d",
					 LOG_TAIL_MAX);
	long long ranks, loaders;
	if (!job_processes(req, &ranks, &loaders, &ret))
		return ret;
	/* A log the job can never have is the client's mistake, not an empty log. */
	if (loader >= 0 && loaders == 0)
		return api_reply_problem(req, API_P_INVALID_PARAMETER, "loader",
					 "job %s runs no loader processes (dataloader_num_workers is 0)",
					 req->args.v[0]);
	if (loader >= loaders)
		return api_reply_problem(req, API_P_INVALID_PARAMETER, "loader",
					 "job %s runs %lld loader process%s (0..%lld)", req->args.v[0],
					 loaders, loaders == 1 ? "" : "es", loaders - 1);
	if (loader < 0 && rank >= ranks)
		return api_reply_problem(req, API_P_INVALID_PARAMETER, "rank",
					 "job %s has %lld rank%s (0..%lld)", req->args.v[0], ranks,
					 ranks == 1 ? "" : "s", ranks - 1);
	char path[1400];
	if (loader >= 0)
		snprintf(path, sizeof path, "%s/jobs/%s/logs/loader-%lld.log", req->cfg->state_dir,
			 req->args.v[0], loader);
	else
		snprintf(path, sizeof path, "%s/jobs/%s/logs/worker-%lld.log", req->cfg->state_dir,
			 req->args.v[0], rank);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0)
		st.st_size = 0; /* not started yet: an empty log */
	if (has_offset && offset > (int64_t)st.st_size) {
		if (fd >= 0)
			close(fd);
		return api_reply_problem(req, API_P_INVALID_PARAMETER, "offset",
					 "the log has %lld bytes: offset must be at most that",
					 (long long)st.st_size);
	}
	if (fd < 0 && !follow)
		return api_reply_raw(req, MHD_HTTP_OK, "text/plain; charset=utf-8", "", 0);
	char *buf = NULL;
	size_t len = 0;
	off_t start = 0;
	if (fd >= 0 && !has_offset && st.st_size > 0) {
		start = st.st_size > (off_t)LOG_READ_MAX ? st.st_size - (off_t)LOG_READ_MAX : 0;
		len = (size_t)(st.st_size - start);
		buf = malloc(len + 1);
		ssize_t got = buf ? pread(fd, buf, len, start) : -1;
		len = got > 0 ? (size_t)got : 0;
	}
	if (fd >= 0)
		close(fd);
	/* keep the last `tail` lines */
	size_t begin = len, lines = 0;
	while (begin > 0) {
		if (buf[begin - 1] == '\n' && begin != len && ++lines == (size_t)tail)
			break;
		begin--;
	}
	if (follow) { /* stream from offset, else from those lines (follow.c) */
		free(buf);
		return follow_logs(req, path, has_offset ? offset : (int64_t)start + (int64_t)begin);
	}
	ret = api_reply_raw(req, MHD_HTTP_OK, "text/plain; charset=utf-8", buf ? buf + begin : "", len - begin);
	free(buf);
	return ret;
}
