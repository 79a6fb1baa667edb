/* download — a job's files as a tar stream: GET /v1/jobs/{id}/export (the
 * HF export of a completed job, or of the last checkpoint of one canceled
 * or stopped by max_runtime_seconds), GET /v1/jobs/{id}/checkpoints/{step}
 * (one complete checkpoint: DONE present) and GET
 * /v1/jobs/{id}/checkpoints/{step}/export (that checkpoint as an HF model,
 * converted on request by a bertd-worker child: daemon/hfexport.h). The
 * archive (tarstream.h) is sized up front (Content-Length), tagged with a
 * strong ETag (If-None-Match answers 304) and read from the files while MHD
 * sends it, so a large model is never loaded into memory. A canceled job
 * that stopped without an export (canceled while queued or restarting,
 * with checkpoints from an earlier attempt) gets one on its first GET
 * /export: its newest checkpoint converted into export/. Reads only
 * <state_dir>/jobs/<id>/ and writes there only a conversion's temporary
 * directory (removed before the reply is sent) and that export/, with the
 * id as the store has it; never a path the client names. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/handlers.h"
#include "api/http.h"
#include "api/tarstream.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "daemon/hfexport.h"
#include "daemon/store.h"

#define BASE_MAX 32        /* bytes of the job's name kept in file names */
#define READ_BLOCK (64 << 10) /* bytes MHD asks the reader for at a time */

/* The job's name made safe for a file name and a Content-Disposition
 * value ([A-Za-z0-9._-], others become '_'), or its id when the name is
 * empty or would start with '.'. */
static void file_base(const store_job *j, char out[BASE_MAX + 1])
{
	const char *src = j->name && j->name[0] && j->name[0] != '.' ? j->name : j->id;
	size_t i = 0;
	for (; src[i] && i < BASE_MAX; i++) {
		char c = src[i];
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			  c == '.' || c == '_' || c == '-';
		out[i] = ok ? c : '_';
	}
	out[i] = 0;
}

/* Whether an If-None-Match value (a '*' or a comma-separated list of
 * entity tags, weak ones "W/"-prefixed) matches etag by the weak comparison
 * RFC 9110 13.1.2 prescribes for it. */
static bool none_match(const char *inm, const char *etag)
{
	size_t el = strlen(etag);
	const char *p = inm;
	while (*p) {
		while (*p == ' ' || *p == '\t' || *p == ',')
			p++;
		if (*p == '*')
			return true;
		if (p[0] == 'W' && p[1] == '/')
			p += 2;
		size_t tl = strcspn(p, ",");
		while (tl > 0 && (p[tl - 1] == ' ' || p[tl - 1] == '\t'))
			tl--;
		if (tl == el && memcmp(p, etag, el) == 0)
			return true;
		p += strcspn(p, ",");
	}
	return false;
}

static ssize_t tar_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
	ssize_t n = tarstream_read(cls, pos, buf, max);
	if (n < 0) {
		/* the headers are gone: all a client sees is a short body */
		log_error("tar stream at byte %llu: %s", (unsigned long long)pos, strerror((int)-n));
		return API_STREAM_ERROR;
	}
	return n > 0 ? n : API_STREAM_END;
}

static void tar_free(void *cls)
{
	tarstream_destroy(cls);
}

/* Replies with dir as <top>.tar: 304 when If-None-Match matches, else 200
 * streaming it. what names the directory in errors ("the export").
 * remove_dir (NULL: none) is removed once the archive's files are open:
 * the stream reads them through its descriptors. */
static enum MHD_Result reply_tar_then(api_request *req, const char *dir, const char *top, const char *what,
				      const char *remove_dir)
{
	tarstream *ts;
	int rc = tarstream_open(&ts, dir, top);
	if (remove_dir)
		fs_remove_tree(remove_dir);
	if (rc < 0)
		return api_reply_problem(req, API_P_INTERNAL, NULL, "reading %s %s failed: %s", what, dir,
					 strerror(-rc));
	const char *etag = tarstream_etag(ts);
	const char *inm = api_header(req, MHD_HTTP_HEADER_IF_NONE_MATCH);
	if (inm && none_match(inm, etag)) {
		enum MHD_Result ret = api_add_header(req, MHD_HTTP_HEADER_ETAG, etag) < 0
			? api_reply_problem(req, API_P_INTERNAL, NULL, "no room for the ETag header")
			: api_reply_empty(req, MHD_HTTP_NOT_MODIFIED);
		tarstream_destroy(ts);
		return ret;
	}
	char disposition[128];
	snprintf(disposition, sizeof disposition, "attachment; filename=\"%s.tar\"", top);
	if (api_add_header(req, MHD_HTTP_HEADER_CONTENT_DISPOSITION, disposition) < 0 ||
	    api_add_header(req, MHD_HTTP_HEADER_ETAG, etag) < 0) {
		tarstream_destroy(ts);
		return api_reply_problem(req, API_P_INTERNAL, NULL, "no room for the headers");
	}
	api_stream s = {
		.content_type = "application/x-tar",
		/* may be kept, but asked about again (If-None-Match) before use */
		.cache_control = "no-cache",
		.size = tarstream_size(ts),
		.block = READ_BLOCK,
		.read = tar_reader,
		.free = tar_free,
		.cls = ts, /* the reply owns ts from here */
	};
	return api_reply_stream(req, MHD_HTTP_OK, &s);
}

static enum MHD_Result reply_tar(api_request *req, const char *dir, const char *top,
				 const char *what)
{
	return reply_tar_then(req, dir, top, what, NULL);
}

/* Loads the job named by the path into *j (store_job_free), or replies
 * (404, 5xx) and sets *ret. */
static bool load_job(api_request *req, store_job *j, enum MHD_Result *ret)
{
	int rc = store_job_get(req->st, req->args.v[0], j);
	if (rc == 0)
		return true;
	if (rc == -ENOENT)
		*ret = api_reply_problem(req, API_P_JOB_NOT_FOUND, NULL, "no job %s", req->args.v[0]);
	else
		*ret = api_reply_store_error(req, rc, "loading job failed");
	return false;
}

/* The newest complete checkpoint (DONE present) of the job directory
 * jobdir, or -1 when none. */
static long long newest_checkpoint(const char *jobdir)
{
	char dir[1500], done[1600];
	snprintf(dir, sizeof dir, "%s/checkpoints", jobdir);
	DIR *d = opendir(dir);
	long long best = -1;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		long long s;
		char tail;
		struct stat sb;
		if (sscanf(e->d_name, "ckpt-%lld%c", &s, &tail) != 1 || s <= best)
			continue;
		snprintf(done, sizeof done, "%s/%s/DONE", dir, e->d_name);
		if (lstat(done, &sb) == 0 && S_ISREG(sb.st_mode))
			best = s;
	}
	if (d)
		closedir(d);
	return best;
}

/* A canceled job without an export: its newest checkpoint converted into
 * <jobdir>/export (hfexport.h), recorded as the job's export. 0, -ENOENT
 * no checkpoint, or the conversion's error (why says it). Two requests at
 * once both convert; the first rename wins and the other is discarded. */
static int export_canceled(api_request *req, const store_job *j, const char *jobdir, const char *exdir, char *why,
			   size_t cap)
{
	long long step = newest_checkpoint(jobdir);
	if (step < 0) {
		snprintf(why, cap, "it has no checkpoint");
		return -ENOENT;
	}
	char ckpt[1500], tmp[1500], out[1520], patch[128];
	snprintf(ckpt, sizeof ckpt, "%s/checkpoints/ckpt-%lld", jobdir, step);
	snprintf(tmp, sizeof tmp, "%s/.export-XXXXXX", jobdir);
	if (!mkdtemp(tmp)) {
		int e = errno;
		snprintf(why, cap, "cannot make a directory for the conversion: %s", strerror(e));
		return -e;
	}
	snprintf(out, sizeof out, "%s/model", tmp);
	int rc = hfexport_checkpoint(req->cfg->bin_dir, ckpt, out, HFEXPORT_TIMEOUT_MS, why, cap);
	if (rc == 0 && rename(out, exdir) < 0 && errno != EEXIST && errno != ENOTEMPTY) {
		int e = errno;
		rc = -e;
		snprintf(why, cap, "rename %s -> %s: %s", out, exdir, strerror(e));
	}
	fs_remove_tree(tmp);
	if (rc == 0) {
		snprintf(patch, sizeof patch, "{\"export\":{\"step\":%lld,\"source\":\"stopped\"}}", step);
		int src = store_job_merge_outcome(req->st, j->id, patch);
		if (src < 0)
			log_warn("job %s: cannot record its export: %s", j->id, strerror(-src));
		log_info("job %s: exported its newest checkpoint (step %lld) on request", j->id, step);
	}
	return rc;
}

enum MHD_Result jobs_export(api_request *req)
{
	enum MHD_Result ret;
	static const char *const known[] = {NULL};
	store_job j;
	if (!api_query_known(req, known, &ret) || !load_job(req, &j, &ret))
		return ret;
	char dir[1400], base[BASE_MAX + 1], top[BASE_MAX + 16];
	snprintf(dir, sizeof dir, "%s/jobs/%s/export", req->cfg->state_dir, j.id);
	file_base(&j, base);
	snprintf(top, sizeof top, "%s-export", base);
	struct stat sb;
	/* canceled (by a user or max_runtime_seconds): the stop checkpoint's
	 * export, when the job got as far as a step; else, made now, its newest
	 * checkpoint's */
	bool has = stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode);
	if (j.state == JOB_CANCELED && !has) {
		char jobdir[1400], why[1400];
		snprintf(jobdir, sizeof jobdir, "%s/jobs/%s", req->cfg->state_dir, j.id);
		int rc = export_canceled(req, &j, jobdir, dir, why, sizeof why);
		if (rc < 0 && rc != -ENOENT) {
			ret = api_reply_problem(req, rc == -EBUSY ? API_P_EXPORT_BUSY
						: rc == -ETIMEDOUT ? API_P_EXPORT_TIMEOUT : API_P_EXPORT_FAILED,
						NULL, "job %s is canceled; exporting its newest checkpoint: %s", j.id, why);
			store_job_free(&j);
			return ret;
		}
		has = rc == 0;
	}
	if (j.state != JOB_COMPLETED && !(j.state == JOB_CANCELED && has))
		ret = api_reply_problem(req, API_P_NOT_FOUND, NULL,
					"job %s is %s: it has no export (the model is exported when the job completes, "
					"or when it is canceled after its first step)",
					j.id, job_state_name(j.state));
	else if (!has)
		ret = api_reply_problem(req, API_P_NOT_FOUND, NULL,
					"job %s is completed but its export %s is gone", j.id, dir);
	else
		ret = reply_tar(req, dir, top, "the export");
	store_job_free(&j);
	return ret;
}

enum MHD_Result jobs_checkpoint_download(api_request *req)
{
	enum MHD_Result ret;
	static const char *const known[] = {NULL};
	const char *s = req->args.v[1];
	char *end;
	errno = 0;
	long long step = strtoll(s, &end, 10);
	if (s[0] < '0' || s[0] > '9' || *end || errno || step < 0)
		return api_reply_problem(req, API_P_INVALID_PARAMETER, "step",
					 "must be a checkpoint's step, a non-negative integer");
	store_job j;
	if (!api_query_known(req, known, &ret) || !load_job(req, &j, &ret))
		return ret;
	char dir[1400], done[1420], base[BASE_MAX + 1], top[BASE_MAX + 32];
	snprintf(dir, sizeof dir, "%s/jobs/%s/checkpoints/ckpt-%lld", req->cfg->state_dir, j.id, step);
	snprintf(done, sizeof done, "%s/DONE", dir);
	file_base(&j, base);
	snprintf(top, sizeof top, "%s-ckpt-%lld", base, step);
	struct stat sb;
	if (lstat(done, &sb) < 0 || !S_ISREG(sb.st_mode))
		ret = api_reply_problem(req, API_P_NOT_FOUND, NULL,
					"job %s (%s) has no complete checkpoint at step %lld "
					"(GET /v1/jobs/%s/checkpoints lists them)",
					j.id, job_state_name(j.state), step, j.id);
	else
		ret = reply_tar(req, dir, top, "the checkpoint");
	store_job_free(&j);
	return ret;
}

/* GET /v1/jobs/{id}/checkpoints/{step}/export: the checkpoint converted by
 * `bertd-worker --export` into <job>/.export-XXXXXX/model, streamed as
 * <name>-ckpt-<step>-export.tar, the temporary directory removed once the
 * archive's files are open. The HTTP thread waits for the conversion, at
 * most HFEXPORT_TIMEOUT_MS, and only HFEXPORT_MAX_RUNNING run at once. */
enum MHD_Result jobs_checkpoint_export(api_request *req)
{
	enum MHD_Result ret;
	static const char *const known[] = {NULL};
	const char *s = req->args.v[1];
	char *end;
	errno = 0;
	long long step = strtoll(s, &end, 10);
	if (s[0] < '0' || s[0] > '9' || *end || errno || step < 0)
		return api_reply_problem(req, API_P_INVALID_PARAMETER, "step",
					 "must be a checkpoint's step, a non-negative integer");
	store_job j;
	if (!api_query_known(req, known, &ret) || !load_job(req, &j, &ret))
		return ret;
	char ckpt[1400], done[1420], tmp[1400], out[1420], why[1400], base[BASE_MAX + 1], top[BASE_MAX + 40];
	snprintf(ckpt, sizeof ckpt, "%s/jobs/%s/checkpoints/ckpt-%lld", req->cfg->state_dir, j.id, step);
	snprintf(done, sizeof done, "%s/DONE", ckpt);
	file_base(&j, base);
	snprintf(top, sizeof top, "%s-ckpt-%lld-export", base, step);
	struct stat sb;
	if (lstat(done, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		ret = api_reply_problem(req, API_P_NOT_FOUND, NULL,
					"job %s (%s) has no complete checkpoint at step %lld "
					"(GET /v1/jobs/%s/checkpoints lists them)",
					j.id, job_state_name(j.state), step, j.id);
		goto out;
	}
	snprintf(tmp, sizeof tmp, "%s/jobs/%s/.export-XXXXXX", req->cfg->state_dir, j.id);
	if (!mkdtemp(tmp)) {
		ret = api_reply_problem(req, API_P_INTERNAL, NULL, "cannot make a directory for the conversion: %s",
					strerror(errno));
		goto out;
	}
	snprintf(out, sizeof out, "%s/model", tmp);
	int rc = hfexport_checkpoint(req->cfg->bin_dir, ckpt, out, HFEXPORT_TIMEOUT_MS, why, sizeof why);
	if (rc < 0) {
		fs_remove_tree(tmp);
		log_warn("job %s: exporting checkpoint %lld: %s", j.id, step, why);
		ret = api_reply_problem(req, rc == -EBUSY ? API_P_EXPORT_BUSY
					: rc == -ETIMEDOUT ? API_P_EXPORT_TIMEOUT : API_P_EXPORT_FAILED,
					NULL, "checkpoint %lld of job %s: %s", step, j.id, why);
		goto out;
	}
	ret = reply_tar_then(req, out, top, "the converted checkpoint", tmp);
out:
	store_job_free(&j);
	return ret;
}
