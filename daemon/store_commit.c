/* store_commit — job submissions, committed in groups: store_job_insert and
 * store_job_insert_async queue their inserts, one commit thread per store
 * writes each group in one transaction (one fsync), every insert in its
 * own savepoint, and hands each caller its own result.
 *
 * Must never: acknowledge an insert (0) before the commit that holds its
 * rows, let one member's -EEXIST fail the others, or block the commit
 * thread on anything but the database.
 */
#include "daemon/store_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "common/log.h"

/* ---- job inserts ---- */

enum { PREV_HASH, PREV_RESPONSE, PREV_JOB_ID, PREV_COUNT };

typedef struct job_insert {
	const store_job *job;
	const char *idem_key, *idem_hash, *response_json;
	int64_t t;
	char *prev[PREV_COUNT]; /* what an existing idempotency key recorded */
	int rc;                 /* its result in a group */
} job_insert;

static int idem_read(sqlite3_stmt *st, void *ctx)
{
	char **prev = ctx;
	int rc = 0;
	for (int i = 0; i < PREV_COUNT && rc == 0; i++)
		rc = store_dup_col(st, i, &prev[i]);
	return rc;
}

static int job_insert_txn(store *s, void *ctx)
{
	job_insert *c = ctx;
	const store_job *j = c->job;
	int rc;
	if (c->idem_key) {
		rc = store_sql_exec(s, "SELECT request_hash, response_json, job_id FROM idempotency_keys "
				       "WHERE key = ?1", ARGS(ARG_TEXT(c->idem_key)), idem_read, c->prev);
		if (rc != 0)
			return rc < 0 ? rc : -EEXIST;
	}
	if ((rc = store_sql_exec(s, "INSERT INTO jobs (id, name, spec_json, state, priority, created_ms, "
				    "updated_ms, owner) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7)",
				 ARGS(ARG_TEXT(j->id), ARG_TEXT(j->name), ARG_TEXT(j->spec_json),
				      ARG_TEXT(job_state_name(JOB_QUEUED)), ARG_I64(j->priority),
				      ARG_I64(c->t), ARG_TEXT(j->owner)), NULL, NULL)) < 0 ||
	    (rc = store_job_tags_sync(s, j->id)) < 0 ||
	    (rc = store_event_insert(s, j->id, c->t, JOB_QUEUED, JOB_QUEUED, "submitted")) < 0)
		return rc;
	if (!c->idem_key)
		return 0;
	rc = store_sql_exec(s, "INSERT INTO idempotency_keys (key, request_hash, job_id, response_json, "
			       "created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
			    ARGS(ARG_TEXT(c->idem_key), ARG_TEXT(c->idem_hash), ARG_TEXT(j->id),
				 ARG_TEXT(c->response_json), ARG_I64(c->t)), NULL, NULL);
	return rc < 0 ? rc : 0;
}

/* A group: ins[0..n) in one write transaction. Each insert runs in its own
 * savepoint, so one that finds its key or id taken (-EEXIST, its own
 * result) is undone alone; any other failure, or of the COMMIT, is the
 * whole group's and becomes every member's result: no member is
 * acknowledged unless the commit that holds its rows succeeded. */
typedef struct insert_group {
	job_insert **ins;
	size_t n;
} insert_group;

static int insert_group_txn(store *s, void *ctx)
{
	insert_group *g = ctx;
	for (size_t i = 0; i < g->n; i++) {
		job_insert *c = g->ins[i];
		int rc = store_exec_sql(s, "SAVEPOINT job_insert");
		if (rc < 0)
			return rc;
		rc = job_insert_txn(s, c);
		if (rc == -EEXIST) {
			if ((rc = store_exec_sql(s, "ROLLBACK TO job_insert")) < 0 ||
			    (rc = store_exec_sql(s, "RELEASE job_insert")) < 0)
				return rc;
			c->rc = -EEXIST;
			continue;
		}
		if (rc < 0)
			return rc;
		if ((rc = store_exec_sql(s, "RELEASE job_insert")) < 0)
			return rc;
		c->rc = 0;
		store_job_touch(s, c->job->id);
	}
	return 0;
}

static void insert_group_run(store *s, job_insert **ins, size_t n)
{
	insert_group g = {.ins = ins, .n = n};
	int rc = store_in_txn(s, TXN_WRITE, insert_group_txn, &g);
	for (size_t i = 0; rc < 0 && i < n; i++) {
		ins[i]->rc = rc;
		for (int k = 0; k < PREV_COUNT; k++) {
			free(ins[i]->prev[k]);
			ins[i]->prev[k] = NULL;
		}
	}
}

int store_job_insert_group(store *s, store_insert *ins, size_t n)
{
	if (!s || (n && !ins))
		return -EINVAL;
	job_insert *c = calloc(n ? n : 1, sizeof *c);
	job_insert **p = calloc(n ? n : 1, sizeof *p);
	size_t m = 0;
	if (!c || !p) {
		free(c);
		free(p);
		return -ENOMEM;
	}
	int64_t t = store_now_ms();
	for (size_t i = 0; i < n; i++) {
		const store_job *j = ins[i].job;
		ins[i].prev_hash = ins[i].prev_response = ins[i].prev_job_id = NULL;
		if (!j || !j->id || !j->name || !j->spec_json ||
		    (ins[i].idem_key && (!ins[i].idem_hash || !ins[i].response_json))) {
			ins[i].rc = -EINVAL;
			continue;
		}
		c[i] = (job_insert){.job = j, .idem_key = ins[i].idem_key, .idem_hash = ins[i].idem_hash,
				    .response_json = ins[i].response_json,
				    .t = j->created_ms > 0 ? j->created_ms : t};
		p[m++] = &c[i];
	}
	insert_group_run(s, p, m);
	int rc = 0;
	for (size_t i = 0; i < n; i++) {
		if (!c[i].job)
			continue;
		ins[i].rc = c[i].rc;
		if (c[i].rc < 0 && c[i].rc != -EEXIST)
			rc = c[i].rc;
		if (c[i].rc == -EEXIST && c[i].prev[PREV_HASH]) {
			ins[i].prev_hash = c[i].prev[PREV_HASH];
			ins[i].prev_response = c[i].prev[PREV_RESPONSE];
			ins[i].prev_job_id = c[i].prev[PREV_JOB_ID];
		} else {
			for (int k = 0; k < PREV_COUNT; k++)
				free(c[i].prev[k]);
		}
	}
	free(c);
	free(p);
	return rc;
}

/* One insert in the queue: on its caller's stack (store_job_insert, which
 * waits for done) or on the heap (store_job_insert_async: the committer
 * hands the result to done_fn and frees it). */
typedef struct insert_item {
	job_insert c;
	store *h;                /* the handle it came through: its wait applies */
	store_insert *ins;       /* async: where the result goes */
	store_insert_done *done_fn;
	void *arg;
	bool done;               /* sync: the result is in c */
	struct insert_item *next;
} insert_item;

/* The largest group one transaction writes. */
#define GROUP_MAX 256

/* Copies c's result into the caller's store_insert (prevs handed over). */
static void insert_result(job_insert *c, store_insert *ins)
{
	ins->rc = c->rc;
	ins->prev_hash = ins->prev_response = ins->prev_job_id = NULL;
	if (c->rc == -EEXIST && c->prev[PREV_HASH]) {
		ins->prev_hash = c->prev[PREV_HASH];
		ins->prev_response = c->prev[PREV_RESPONSE];
		ins->prev_job_id = c->prev[PREV_JOB_ID];
	} else {
		for (int k = 0; k < PREV_COUNT; k++)
			free(c->prev[k]);
	}
	for (int k = 0; k < PREV_COUNT; k++)
		c->prev[k] = NULL;
	if (c->rc == 0)
		log_info("job %s: (new) -> %s (submitted)", c->job->id, job_state_name(JOB_QUEUED));
}

static void *committer_main(void *arg)
{
	insert_queue *q = arg;
	insert_item *batch[GROUP_MAX];
	job_insert *cs[GROUP_MAX];
	pthread_mutex_lock(&q->mu);
	for (;;) {
		while (!q->head && !q->stopping)
			pthread_cond_wait(&q->work, &q->mu);
		if (!q->head)
			break; /* stopping, and everything queued is written */
		size_t n = 0;
		for (insert_item *it = q->head; it && n < GROUP_MAX; it = it->next)
			batch[n++] = it;
		q->head = batch[n - 1]->next;
		if (!q->head)
			q->tail = NULL;
		pthread_mutex_unlock(&q->mu);
		for (size_t i = 0; i < n; i++)
			cs[i] = &batch[i]->c;
		insert_group_run(batch[0]->h, cs, n);
		size_t waiting = 0; /* sync items, moved to batch[0..waiting) */
		for (size_t i = 0; i < n; i++) {
			insert_item *it = batch[i];
			if (!it->done_fn) {
				batch[waiting++] = it;
				continue;
			}
			insert_result(&it->c, it->ins);
			it->done_fn(it->ins, it->arg);
			free(it);
		}
		pthread_mutex_lock(&q->mu);
		/* A waiter that sees done returns and its item is gone: last. */
		for (size_t i = 0; i < waiting; i++)
			batch[i]->done = true;
		pthread_cond_broadcast(&q->done);
	}
	pthread_mutex_unlock(&q->mu);
	return NULL;
}

/* Queues it (under nothing); starts the committer on first use. -ENOMEM
 * (it is not queued) when the thread cannot start. */
static int insert_enqueue(store *s, insert_item *it)
{
	insert_queue *q = s->queue;
	pthread_mutex_lock(&q->mu);
	if (!q->started) {
		if (pthread_create(&q->thread, NULL, committer_main, q) != 0) {
			pthread_mutex_unlock(&q->mu);
			log_error("store: cannot start the commit thread");
			return -ENOMEM;
		}
		q->started = true;
	}
	it->next = NULL;
	if (q->tail)
		q->tail->next = it;
	else
		q->head = it;
	q->tail = it;
	pthread_cond_signal(&q->work);
	pthread_mutex_unlock(&q->mu);
	return 0;
}

/* Stops the committer after it wrote everything queued (store_close). */
void store_insert_queue_stop(insert_queue *q)
{
	pthread_mutex_lock(&q->mu);
	q->stopping = true;
	pthread_cond_signal(&q->work);
	bool started = q->started;
	pthread_mutex_unlock(&q->mu);
	if (started)
		pthread_join(q->thread, NULL);
}

static bool insert_args_ok(const store_job *job, const char *idem_key, const char *idem_hash,
			   const char *response_json)
{
	return job && job->id && job->name && job->spec_json &&
	       (!idem_key || (idem_hash && response_json));
}

int store_job_insert_async(store *s, store_insert *ins, store_insert_done *done, void *arg)
{
	if (!s || !ins || !done || !insert_args_ok(ins->job, ins->idem_key, ins->idem_hash,
						   ins->response_json))
		return -EINVAL;
	insert_item *it = calloc(1, sizeof *it);
	if (!it)
		return -ENOMEM;
	const store_job *j = ins->job;
	it->c = (job_insert){.job = j, .idem_key = ins->idem_key, .idem_hash = ins->idem_hash,
			     .response_json = ins->response_json,
			     .t = j->created_ms > 0 ? j->created_ms : store_now_ms()};
	it->h = s;
	it->ins = ins;
	it->done_fn = done;
	it->arg = arg;
	int rc = insert_enqueue(s, it);
	if (rc < 0)
		free(it);
	return rc;
}

int store_job_insert(store *s, const store_job *job,
		     const char *idem_key, const char *idem_hash, const char *response_json,
		     char **prev_hash, char **prev_response, char **prev_job_id)
{
	char **want[PREV_COUNT] = {prev_hash, prev_response, prev_job_id};
	for (int i = 0; i < PREV_COUNT; i++)
		if (want[i])
			*want[i] = NULL;
	if (!insert_args_ok(job, idem_key, idem_hash, response_json))
		return -EINVAL;
	insert_item it = {.c = {.job = job, .idem_key = idem_key, .idem_hash = idem_hash,
				.response_json = response_json,
				/* the API stamps its 201 with created_ms */
				.t = job->created_ms > 0 ? job->created_ms : store_now_ms()},
			  .h = s};
	job_insert *c = &it.c;
	if (insert_enqueue(s, &it) == 0) {
		insert_queue *q = s->queue;
		pthread_mutex_lock(&q->mu);
		while (!it.done)
			pthread_cond_wait(&q->done, &q->mu);
		pthread_mutex_unlock(&q->mu);
	} else {
		insert_group_run(s, &c, 1); /* no committer: a group of one, here */
	}
	int rc = c->rc;
	if (rc == 0)
		log_info("job %s: (new) -> %s (submitted)", job->id, job_state_name(JOB_QUEUED));
	/* The key's record goes out only with the -EEXIST it caused: -EEXIST
	 * with the prevs left NULL means the job id was taken. */
	bool replay = rc == -EEXIST && c->prev[PREV_HASH];
	for (int i = 0; i < PREV_COUNT; i++) {
		if (replay && want[i]) {
			*want[i] = c->prev[i];
			c->prev[i] = NULL;
		}
		free(c->prev[i]);
	}
	return rc;
}
