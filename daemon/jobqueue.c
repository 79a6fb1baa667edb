/* jobqueue — see jobqueue.h. The entries are one array sorted by seq; a
 * refresh merges the changed rows (also in seq order) into it in one pass,
 * O(queue + changes), and parses only the changed rows' specs. A whole
 * queue (the first refresh) of more than JOBQUEUE_SLICE rows is parsed a
 * slice per refresh, so no single call holds its caller (the event loop)
 * for the whole queue's parses. */
#include "daemon/jobqueue.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

struct jobqueue {
	jobqueue_entry *e; /* (n,) seq ascending */
	size_t n;
	int64_t rev;       /* store_queue_changes revision the entries are at; 0 none */
	char **names;      /* (nnames,) dataset names the entries refer to */
	int nnames, capnames;
	/* A whole queue being parsed, JOBQUEUE_SLICE rows a refresh: the rows
	 * of one snapshot at pend_rev, parsed up to pend_at (e has room for
	 * npend entries meanwhile). NULL when none. */
	store_queue_row *pend;
	size_t npend, pend_at;
	int64_t pend_rev;
};

int jobqueue_create(jobqueue **out)
{
	*out = calloc(1, sizeof **out);
	return *out ? 0 : -ENOMEM;
}

static void entry_free(jobqueue_entry *e)
{
	free(e->id);
	free(e->datasets);
	memset(e, 0, sizeof *e);
}

/* Forgets every entry and name: the next refresh reads the whole queue. */
static void clear(jobqueue *q)
{
	store_queue_rows_free(q->pend, q->npend);
	q->pend = NULL;
	q->npend = q->pend_at = 0;
	for (size_t i = 0; i < q->n; i++)
		entry_free(&q->e[i]);
	free(q->e);
	q->e = NULL;
	q->n = 0;
	for (int i = 0; i < q->nnames; i++)
		free(q->names[i]);
	free(q->names);
	q->names = NULL;
	q->nnames = q->capnames = 0;
	q->rev = 0;
}

void jobqueue_destroy(jobqueue *q)
{
	if (!q)
		return;
	clear(q);
	free(q);
}

static uint64_t hash_id(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

/* The index of dataset name, added when new; -1 out of memory. */
static int intern(jobqueue *q, const char *name)
{
	for (int i = 0; i < q->nnames; i++)
		if (strcmp(q->names[i], name) == 0)
			return i;
	if (q->nnames == q->capnames) {
		int cap = q->capnames ? q->capnames * 2 : 8;
		char **p = realloc(q->names, (size_t)cap * sizeof *p);
		if (!p)
			return -1;
		q->names = p;
		q->capnames = cap;
	}
	if (!(q->names[q->nnames] = strdup(name)))
		return -1;
	return q->nnames++;
}

/* Row r (in the queue) into *e: what the scheduler needs of its spec, read
 * without validating it (sv_launch_start_job does that, and fails a job
 * whose stored spec is unreadable). -ENOMEM (e left empty). */
static int entry_from_row(jobqueue *q, store_queue_row *r, jobqueue_entry *e)
{
	int rc = 0;
	memset(e, 0, sizeof *e);
	json_t *js = json_loads(r->spec_json, 0, NULL);
	json_t *res = json_object_get(js, "resources");
	json_t *g = json_object_get(res, "gpus");
	e->want = json_is_integer(g) && json_integer_value(g) >= 1 && json_integer_value(g) <= 64
			  ? (int)json_integer_value(g) : 1;
	json_t *nodes = json_object_get(res, "nodes");
	e->multinode = json_is_integer(nodes) && json_integer_value(nodes) > 1;
	json_t *mr = json_object_get(json_object_get(js, "stopping_condition"), "max_runtime_seconds");
	if (json_is_integer(mr) && json_integer_value(mr) > 0 && json_integer_value(mr) < INT64_MAX / 1000)
		e->max_runtime_s = (int64_t)json_integer_value(mr);
	/* "dataset": one name, or a mixture's entries {"name", ...} */
	json_t *ds = json_object_get(js, "dataset");
	size_t nds = json_is_array(ds) ? json_array_size(ds) : json_is_string(ds) ? 1 : 0;
	if (nds && !(e->datasets = malloc(nds * sizeof *e->datasets))) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < nds; i++) {
		const char *name = json_is_array(ds) ? json_string_value(json_object_get(json_array_get(ds, i), "name"))
						     : json_string_value(ds);
		if (!name)
			continue;
		int k = intern(q, name);
		if (k < 0) {
			rc = -ENOMEM;
			goto out;
		}
		e->datasets[e->ndatasets++] = k;
	}
	e->seq = r->seq;
	e->state = r->state;
	e->priority = r->priority;
	e->runtime_ms = r->runtime_ms;
	e->id = r->id; /* taken from the row */
	r->id = NULL;
	e->id_hash = hash_id(e->id);
out:
	json_decref(js);
	if (rc < 0)
		entry_free(e);
	return rc;
}

static bool in_queue(const store_queue_row *r)
{
	return r->spec_json && (r->state == JOB_QUEUED || r->state == JOB_RESTARTING);
}

/* Parses the next JOBQUEUE_SLICE rows of the whole queue being read;
 * after the last, the entries are at its revision. -ENOMEM (q cleared). */
static int parse_slice(jobqueue *q)
{
	size_t end = q->pend_at + JOBQUEUE_SLICE < q->npend ? q->pend_at + JOBQUEUE_SLICE : q->npend;
	for (; q->pend_at < end; q->pend_at++) {
		store_queue_row *r = &q->pend[q->pend_at];
		if (!in_queue(r))
			continue;
		if (entry_from_row(q, r, &q->e[q->n]) < 0) {
			clear(q);
			return -ENOMEM;
		}
		q->n++;
	}
	if (q->pend_at == q->npend) {
		store_queue_rows_free(q->pend, q->npend);
		q->pend = NULL;
		q->npend = q->pend_at = 0;
		q->rev = q->pend_rev;
	}
	return 0;
}

int jobqueue_refresh(jobqueue *q, store *st, size_t *nread)
{
	store_queue_row *rows = NULL;
	size_t nr = 0, n = 0, i = 0, k = 0;
	bool full = false;
	int64_t rev = 0;
	jobqueue_entry *out = NULL;
	if (nread)
		*nread = 0;
	if (q->pend)
		return parse_slice(q);
	int rc = store_queue_changes(st, q->rev, &rows, &nr, &full, &rev);
	if (rc < 0)
		return rc;
	if (nread)
		*nread = nr;
	if (full)
		clear(q);
	if (full && nr > JOBQUEUE_SLICE) { /* parsed over several refreshes */
		if (!(q->e = malloc(nr * sizeof *q->e))) {
			store_queue_rows_free(rows, nr);
			return -ENOMEM;
		}
		q->pend = rows;
		q->npend = nr;
		q->pend_rev = rev;
		return parse_slice(q);
	}
	if (nr == 0) {
		q->rev = rev;
		goto out;
	}
	/* merge: the kept entries and the changed rows, both in seq order */
	out = malloc((q->n + nr) * sizeof *out);
	if (!out) {
		rc = -ENOMEM;
		goto out;
	}
	while (i < q->n || k < nr) {
		if (k == nr || (i < q->n && q->e[i].seq < rows[k].seq)) {
			out[n++] = q->e[i++]; /* unchanged: moved */
			continue;
		}
		if (i < q->n && q->e[i].seq == rows[k].seq)
			entry_free(&q->e[i++]); /* changed: parsed again, or gone */
		if (in_queue(&rows[k]) && (rc = entry_from_row(q, &rows[k], &out[n])) == 0)
			n++;
		k++;
		if (rc < 0)
			break;
	}
	if (rc < 0) { /* out of memory: forget everything, read it all next time */
		for (size_t j = 0; j < n; j++)
			entry_free(&out[j]);
		for (; i < q->n; i++)
			entry_free(&q->e[i]);
		q->n = 0;
		free(out);
		clear(q);
		goto out;
	}
	free(q->e);
	q->e = out;
	q->n = n;
	q->rev = rev;
out:
	store_queue_rows_free(rows, nr);
	return rc;
}

bool jobqueue_loading(const jobqueue *q)
{
	return q->pend != NULL;
}

const jobqueue_entry *jobqueue_entries(const jobqueue *q, size_t *n)
{
	*n = q->n;
	return q->e;
}

long jobqueue_find(const jobqueue *q, const char *id)
{
	uint64_t h = hash_id(id);
	for (size_t i = 0; i < q->n; i++)
		if (q->e[i].id_hash == h && strcmp(q->e[i].id, id) == 0)
			return (long)i;
	return -1;
}

const char *jobqueue_dataset(const jobqueue *q, int i)
{
	return i >= 0 && i < q->nnames ? q->names[i] : NULL;
}

int jobqueue_ndatasets(const jobqueue *q)
{
	return q->nnames;
}

int64_t jobqueue_limit_ms(const jobqueue_entry *e)
{
	if (e->max_runtime_s <= 0)
		return 0;
	int64_t left = e->max_runtime_s * 1000 - e->runtime_ms;
	return left > 0 ? left : 1;
}
