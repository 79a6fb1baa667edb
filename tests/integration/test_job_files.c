/* Job files that go away: DELETE /v1/jobs/{id} removes the job directory
 * (never following a symlink out of it) unless ?keep_files=true, a removal
 * a crash interrupted is finished at the next start, the retention policy
 * drops old finished jobs' checkpoints and keeps their exports, the disk
 * ceiling refuses submissions with 507, GET /v1/system shows each job's
 * disk use (compared with du(1)), and with shared_group a real job's files
 * are group-readable in setgid directories of that group. */
#include <errno.h>
#include <grp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "it_store.h"
#include "it_util.h"

#define DEADLINE_S 240
#define HOLD "--schedule", "false"
#define SPEC_OK "{\"name\":\"it-job\",\"dataset\":\"wikitext2\"}"
#define SPEC_BAD "{\"name\":\"it-job\",\"dataset\":\"wikitext2\",\"training_args\":{\"learning_rate\":-1}}"
#define JOB_A "job-00000000000000a1"   /* completed: deleted */
#define JOB_B "job-00000000000000b2"   /* completed: deleted with keep_files */
#define JOB_Q "job-00000000000000c3"   /* queued: never touched */

static bool exists(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static bool exists(const char *fmt, ...)
{
	char p[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(p, sizeof p, fmt, ap);
	va_end(ap);
	struct stat st;
	return lstat(p, &st) == 0;
}

static void put(const char *dir, const char *rel, size_t bytes)
{
	char p[600];
	snprintf(p, sizeof p, "%s/%s", dir, rel);
	for (char *s = strchr(p + strlen(dir) + 1, '/'); s; s = strchr(s + 1, '/')) {
		*s = 0;
		mkdir(p, 0700);
		*s = '/';
	}
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	for (size_t i = 0; i < bytes; i++) /* not sparse, not constant */
		fputc((int)((i * 2654435761u) >> 13) & 0xff, f);
	fclose(f);
}

/* Seeds the store with jobs (id, final?) and each a directory as a
 * training run leaves it. */
static void seed(bertd *d, const char *const *ids, const bool *final, size_t n)
{
	store *st = NULL;
	assert_int_equal(it_store_seed_dataset(d, &st), 0);
	char dir[400];
	snprintf(dir, sizeof dir, "%s/jobs", d->state_dir);
	mkdir(dir, 0700);
	for (size_t i = 0; i < n; i++) {
		store_job j = {.id = (char *)ids[i], .name = (char *)ids[i],
			       .spec_json = "{\"dataset\":\"wikitext2\"}", .created_ms = 1, .updated_ms = 1};
		assert_int_equal(store_job_insert(st, &j, NULL, NULL, NULL, NULL, NULL, NULL), 0);
		if (final[i]) {
			assert_int_equal(store_job_transition(st, j.id, JOB_MASK(JOB_QUEUED), JOB_RUNNING,
							      NULL, NULL), 0);
			assert_int_equal(store_job_transition(st, j.id, JOB_MASK(JOB_RUNNING), JOB_COMPLETED,
							      "seeded by the test", NULL), 0);
		}
		snprintf(dir, sizeof dir, "%s/jobs/%s", d->state_dir, ids[i]);
		mkdir(dir, 0700);
		put(dir, "export/model.safetensors", 40000);
		put(dir, "checkpoints/ckpt-10/params.safetensors", 70000);
		put(dir, "logs/worker-0.log", 3000);
		put(dir, "tensorboard/events.out.tfevents.1.host.1.0", 2000);
		char ck[500];
		snprintf(ck, sizeof ck, "%s/checkpoints/ckpt-10", dir);
		store_checkpoint c = {.step = 10, .path = ck, .bytes = 70000};
		assert_int_equal(store_checkpoint_insert(st, ids[i], &c), 0);
	}
	store_close(st);
}

static it_fx *start_seeded(const char *const *ids, const bool *final, size_t n, const char *const *extra)
{
	it_fx *f = it_daemon_start(&(it_daemon_opts){.plain = true, .deferred = true}, 0);
	assert_non_null(f);
	seed(&f->d, ids, final, n);
	if (it_daemon_run(f, &(it_daemon_opts){.plain = true, .extra = extra}) != 0) {
		bertd_print_log(&f->d);
		fail_msg("bertd did not start");
	}
	return f;
}

static long del(const bertd *d, const char *id, const char *query)
{
	char path[200];
	snprintf(path, sizeof path, "/v1/jobs/%s%s", id, query);
	http_resp r;
	assert_int_equal(http_do(d, "DELETE", path, NULL, 0, NULL, H_AUTH, &r), 0);
	long s = r.status;
	if (s >= 400 && r.json)
		assert_non_null(json_object_get(r.json, "type"));
	http_resp_free(&r);
	return s;
}

/* GET /v1/system's "disk" once a pass that began after this call is done
 * (passes counted twice over: one may have been under way). */
static json_t *disk_after_pass(const bertd *d)
{
	json_t *s = it_get_json(d, "/v1/system");
	json_t *disk = json_object_get(s, "disk");
	assert_non_null(disk);
	json_int_t p0 = json_integer_value(json_object_get(disk, "passes"));
	json_decref(s);
	for (int i = 0; i < DEADLINE_S * 10; i++) {
		s = it_get_json(d, "/v1/system");
		disk = json_object_get(s, "disk");
		if (json_integer_value(json_object_get(disk, "passes")) >= p0 + 2) {
			json_incref(disk);
			json_decref(s);
			return disk;
		}
		json_decref(s);
		it_pause_ms(100);
	}
	bertd_print_log(d);
	fail_msg("no retention pass in %d s", DEADLINE_S);
	return NULL;
}

static void wait_gone(const bertd *d, const char *path)
{
	for (int i = 0; i < DEADLINE_S * 10; i++) {
		struct stat st;
		if (lstat(path, &st) < 0 && errno == ENOENT)
			return;
		it_pause_ms(100);
	}
	bertd_print_log(d);
	fail_msg("%s still there after %d s", path, DEADLINE_S);
}

static json_int_t du_bytes(const char *dir)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "du -s -B1 '%s'", dir);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	long long b = -1;
	assert_int_equal(fscanf(p, "%lld", &b), 1);
	pclose(p);
	return (json_int_t)b;
}

static void test_delete_and_keep(void **state)
{
	(void)state;
	const char *ids[] = {JOB_A, JOB_B, JOB_Q};
	const bool final[] = {true, true, false};
	const char *extra[] = {HOLD, "--retention-interval-s", "1", NULL};
	it_fx *f = start_seeded(ids, final, 3, extra);
	bertd *d = &f->d;
	char adir[400], out_file[300], out_dir[300], p[600];
	snprintf(adir, sizeof adir, "%s/jobs/%s", d->state_dir, JOB_A);
	/* links out of the job directory: to a file and to a directory */
	snprintf(out_file, sizeof out_file, "%s/outside.txt", d->root);
	it_write_file(out_file, "must survive\n");
	snprintf(out_dir, sizeof out_dir, "%s/outside", d->root);
	mkdir(out_dir, 0700);
	snprintf(p, sizeof p, "%s/inside.txt", out_dir);
	it_write_file(p, "must survive too\n");
	snprintf(p, sizeof p, "%s/export/escape.txt", adir);
	assert_int_equal(symlink(out_file, p), 0);
	snprintf(p, sizeof p, "%s/escape-dir", adir);
	assert_int_equal(symlink(out_dir, p), 0);

	/* per-job disk use, as du(1) measures the directories */
	json_t *disk = disk_after_pass(d);
	json_t *jobs = json_object_get(disk, "jobs");
	assert_int_equal(json_array_size(jobs), 3);
	for (size_t i = 0; i < 3; i++) {
		json_t *j = json_array_get(jobs, i);
		snprintf(p, sizeof p, "%s/jobs/%s", d->state_dir, it_jstr(j, "id"));
		assert_int_equal(json_integer_value(json_object_get(j, "bytes")), du_bytes(p));
		assert_true(json_integer_value(json_object_get(j, "bytes")) >= 115000);
	}
	json_decref(disk);

	assert_int_equal(del(d, JOB_A, "?keep_files=perhaps"), 400);
	assert_true(exists("%s", adir));
	/* a job that is not final keeps its files and its row: 409 as before */
	assert_int_equal(del(d, JOB_Q, ""), 409);
	assert_true(exists("%s/jobs/%s/checkpoints/ckpt-10", d->state_dir, JOB_Q));

	assert_int_equal(del(d, JOB_A, ""), 204);
	wait_gone(d, adir);
	snprintf(p, sizeof p, "%s/jobs/.deleting-%s", d->state_dir, JOB_A);
	wait_gone(d, p);
	char *s = it_slurp(out_file, NULL);
	assert_non_null(s);
	assert_string_equal(s, "must survive\n");
	free(s);
	assert_true(exists("%s/inside.txt", out_dir));
	http_resp r;
	assert_int_equal(http_get(d, "/v1/jobs/" JOB_A, &r), 0);
	assert_int_equal(r.status, 404);
	http_resp_free(&r);

	assert_int_equal(del(d, JOB_B, "?keep_files=true"), 204);
	assert_int_equal(http_get(d, "/v1/jobs/" JOB_B, &r), 0);
	assert_int_equal(r.status, 404);
	http_resp_free(&r);
	disk = disk_after_pass(d);
	assert_true(exists("%s/jobs/%s/export/model.safetensors", d->state_dir, JOB_B));
	assert_true(exists("%s/jobs/%s/checkpoints/ckpt-10/params.safetensors", d->state_dir, JOB_B));
	jobs = json_object_get(disk, "jobs"); /* B kept (its files), A gone */
	assert_int_equal(json_array_size(jobs), 2);
	assert_string_equal(it_jstr(json_array_get(jobs, 0), "id"), JOB_B);
	assert_true(json_is_false(json_object_get(json_array_get(jobs, 0), "deleting")));
	assert_string_equal(it_jstr(json_array_get(jobs, 1), "id"), JOB_Q);
	assert_int_equal(json_integer_value(json_object_get(disk, "deleting")), 0);
	json_decref(disk);
	assert_int_equal(it_daemon_stop(f), 0);
}

/* A crash after the directory was moved aside but before its row went:
 * the next start removes both. */
static void test_crash_mid_delete(void **state)
{
	(void)state;
	const char *ids[] = {JOB_A};
	const bool final[] = {true};
	it_fx *f = it_daemon_start(&(it_daemon_opts){.plain = true, .deferred = true}, 0);
	assert_non_null(f);
	bertd *d = &f->d;
	seed(d, ids, final, 1);
	char from[400], to[400];
	snprintf(from, sizeof from, "%s/jobs/%s", d->state_dir, JOB_A);
	snprintf(to, sizeof to, "%s/jobs/.deleting-%s", d->state_dir, JOB_A);
	assert_int_equal(rename(from, to), 0);
	const char *extra[] = {HOLD, NULL};
	assert_int_equal(it_daemon_run(f, &(it_daemon_opts){.plain = true, .extra = extra}), 0);
	wait_gone(d, to);
	http_resp r;
	for (int i = 0; i < DEADLINE_S * 10; i++) {
		assert_int_equal(http_get(d, "/v1/jobs/" JOB_A, &r), 0);
		long st = r.status;
		http_resp_free(&r);
		if (st == 404)
			break;
		assert_int_equal(st, 200);
		it_pause_ms(100);
	}
	assert_int_equal(http_get(d, "/v1/jobs/" JOB_A, &r), 0);
	assert_int_equal(r.status, 404);
	http_resp_free(&r);
	assert_int_equal(it_daemon_stop(f), 0);
}

/* retention_checkpoint_days: a finished job's checkpoints go once it is
 * that old (0: at once), its export stays; a job not finished keeps all. */
static void test_retention(void **state)
{
	(void)state;
	const char *ids[] = {JOB_A, JOB_Q};
	const bool final[] = {true, false};
	const char *young[] = {HOLD, "--retention-interval-s", "1", "--retention-checkpoint-days", "1", NULL};
	it_fx *f = start_seeded(ids, final, 2, young);
	bertd *d = &f->d;
	char ck[400];
	snprintf(ck, sizeof ck, "%s/jobs/%s/checkpoints", d->state_dir, JOB_A);
	json_t *disk = disk_after_pass(d); /* finished seconds ago: not a day old */
	assert_int_equal(json_integer_value(json_object_get(disk, "checkpoints_removed")), 0);
	json_decref(disk);
	assert_true(exists("%s/ckpt-10/params.safetensors", ck));
	assert_int_equal(bertd_stop(d), 0);

	const char *old[] = {HOLD, "--retention-interval-s", "1", "--retention-checkpoint-days", "0", NULL};
	assert_int_equal(it_daemon_run(f, &(it_daemon_opts){.plain = true, .extra = old}), 0);
	wait_gone(d, ck);
	disk = disk_after_pass(d);
	assert_int_equal(json_integer_value(json_object_get(disk, "checkpoints_removed")), 1);
	assert_int_equal(json_integer_value(json_object_get(disk, "deleting")), 0);
	json_decref(disk);
	assert_true(exists("%s/jobs/%s/export/model.safetensors", d->state_dir, JOB_A));
	assert_true(exists("%s/jobs/%s/logs/worker-0.log", d->state_dir, JOB_A));
	assert_true(exists("%s/jobs/%s/checkpoints/ckpt-10/params.safetensors", d->state_dir, JOB_Q));
	json_t *cks = it_get_json(d, "/v1/jobs/" JOB_A "/checkpoints");
	assert_int_equal(json_array_size(json_object_get(cks, "checkpoints")), 0);
	json_decref(cks);
	assert_int_equal(bertd_stop(d), 0);

	/* retention_keep_exports = false: the export goes too, the logs stay */
	const char *all[] = {HOLD, "--retention-interval-s", "1", "--retention-checkpoint-days", "0",
			     "--retention-keep-exports", "false", NULL};
	assert_int_equal(it_daemon_run(f, &(it_daemon_opts){.plain = true, .extra = all}), 0);
	char ex[400];
	snprintf(ex, sizeof ex, "%s/jobs/%s/export", d->state_dir, JOB_A);
	wait_gone(d, ex);
	json_decref(disk_after_pass(d));
	assert_true(exists("%s/jobs/%s/logs/worker-0.log", d->state_dir, JOB_A));
	assert_true(exists("%s/jobs/%s/export/model.safetensors", d->state_dir, JOB_Q));
	assert_int_equal(it_daemon_stop(f), 0);
}

/* disk_ceiling_bytes: 507 insufficient-storage naming the key, the
 * ceiling and the use; deleting a job brings the use under it again. */
static void test_ceiling(void **state)
{
	(void)state;
	const char *ids[] = {JOB_A};
	const bool final[] = {true};
	const char *extra[] = {HOLD, "--retention-interval-s", "1", "--disk-ceiling-bytes", "65536", NULL};
	it_fx *f = start_seeded(ids, final, 1, extra);
	bertd *d = &f->d;
	http_resp r;
	/* an invalid spec is the client's to fix first: 422 naming its field,
	 * whatever the disk */
	assert_int_equal(http_post_json(d, "/v1/jobs", SPEC_BAD, &r), 0);
	if (r.status != 422)
		fail_msg("invalid spec over the ceiling: %ld %s", r.status, r.body);
	assert_string_equal(it_jstr(r.json, "field"), "training_args.learning_rate");
	http_resp_free(&r);
	assert_int_equal(http_post_json(d, "/v1/jobs", SPEC_OK, &r), 0);
	if (r.status != 507)
		fail_msg("submit over the ceiling: %ld %s", r.status, r.body);
	assert_string_equal(it_jstr(r.json, "type"), "urn:bertd:problem:insufficient-storage");
	assert_string_equal(it_jstr(r.json, "field"), "disk_ceiling_bytes");
	const char *detail = it_jstr(r.json, "detail");
	assert_non_null(strstr(detail, "65536"));
	char used[32];
	json_t *disk = disk_after_pass(d);
	snprintf(used, sizeof used, "%lld",
		 (long long)json_integer_value(json_object_get(disk, "jobs_bytes")));
	json_decref(disk);
	if (!strstr(detail, used))
		fail_msg("detail \"%s\" does not name the use %s", detail, used);
	http_resp_free(&r);

	assert_int_equal(del(d, JOB_A, ""), 204);
	for (int i = 0;; i++) {
		disk = disk_after_pass(d);
		json_int_t b = json_integer_value(json_object_get(disk, "jobs_bytes"));
		json_decref(disk);
		if (b < 65536)
			break;
		assert_true(i < 50);
	}
	assert_int_equal(http_post_json(d, "/v1/jobs", SPEC_OK, &r), 0);
	assert_int_equal(r.status, 201);
	http_resp_free(&r);
	assert_int_equal(bertd_stop(d), 0);

	/* disk_ceiling_percent: 1% of a file system holding these files is
	 * reached (the percent rounds up) */
	const char *pct[] = {HOLD, "--disk-ceiling-percent", "1", NULL};
	assert_int_equal(it_daemon_run(f, &(it_daemon_opts){.plain = true, .extra = pct}), 0);
	assert_int_equal(http_post_json(d, "/v1/jobs", SPEC_BAD, &r), 0);
	if (r.status != 422)
		fail_msg("invalid spec over the percent ceiling: %ld %s", r.status, r.body);
	http_resp_free(&r);
	assert_int_equal(http_post_json(d, "/v1/jobs", SPEC_OK, &r), 0);
	if (r.status != 507)
		fail_msg("submit over the percent ceiling: %ld %s", r.status, r.body);
	assert_string_equal(it_jstr(r.json, "field"), "disk_ceiling_percent");
	assert_non_null(strstr(it_jstr(r.json, "detail"), "percent of the file system"));
	http_resp_free(&r);
	assert_int_equal(it_daemon_stop(f), 0);
}

static void check_shared(const char *path, gid_t gid, bool dir)
{
	struct stat st;
	assert_int_equal(lstat(path, &st), 0);
	if (st.st_gid != gid)
		fail_msg("%s: group %u, want %u", path, (unsigned)st.st_gid, (unsigned)gid);
	if (!(st.st_mode & S_IRGRP) || (st.st_mode & (S_IWGRP | S_IROTH | S_IWOTH)))
		fail_msg("%s: mode %o, want group-readable, not group-writable, nothing for others", path,
			 (unsigned)st.st_mode & 07777);
	if (dir && (!(st.st_mode & S_ISGID) || !(st.st_mode & S_IXGRP)))
		fail_msg("%s: mode %o, want setgid and group-searchable", path, (unsigned)st.st_mode & 07777);
}

/* shared_group (the test's own group): a real job's logs, TensorBoard
 * events and export are readable by the group, in setgid directories. */
static void test_shared_group(void **state)
{
	(void)state;
	/* by name when the group has one (a container may have only numbers) */
	struct group *g = getgrgid(getgid());
	gid_t gid = getgid();
	char gname[64];
	snprintf(gname, sizeof gname, "%s", g ? g->gr_name : "");
	if (!g)
		snprintf(gname, sizeof gname, "%u", (unsigned)gid);
	const char *extra[] = {"--shared-group", gname, NULL};
	it_daemon_opts o = {.cpu_slots = "1", .dataset = "shakes", .corpus = "shakes.txt",
			    .corpus_lines = 400, .vocab_size = 200, .wait_ready = true, .extra = extra};
	it_fx *f = it_daemon_start(&o, DEADLINE_S);
	assert_non_null(f);
	bertd *d = &f->d;
	char *spec = it_job_spec("shared", "shakes", "training_args.per_device_train_batch_size", "4",
				 "training_args.max_steps", "4", "training_args.logging_steps", "2",
				 "training_args.save_steps", "100", "training_args.learning_rate", "null",
				 "training_args.warmup_steps", "null", NULL);
	char *id = it_submit(d, spec);
	free(spec);
	json_t *j = it_wait_completed(d, id, DEADLINE_S);
	json_decref(j);
	char p[600], jd[400];
	struct stat st;
	assert_int_equal(stat(d->state_dir, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0710);
	snprintf(p, sizeof p, "%s/jobs", d->state_dir);
	check_shared(p, gid, true);
	snprintf(jd, sizeof jd, "%s/jobs/%s", d->state_dir, id);
	check_shared(jd, gid, true);
	const char *dirs[] = {"logs", "export", "tensorboard"};
	for (size_t i = 0; i < 3; i++) {
		snprintf(p, sizeof p, "%s/%s", jd, dirs[i]);
		check_shared(p, gid, true);
	}
	snprintf(p, sizeof p, "%s/logs/worker-0.log", jd);
	check_shared(p, gid, false);
	snprintf(p, sizeof p, "%s/export/model.safetensors", jd);
	check_shared(p, gid, false);
	snprintf(p, sizeof p, "%s/export/config.json", jd);
	check_shared(p, gid, false);
	/* the token stays the owner's */
	snprintf(p, sizeof p, "%s/token", d->state_dir);
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	free(id);
	assert_int_equal(it_daemon_stop(f), 0);
}

/* A group that does not exist stops the start, naming the key. */
static void test_shared_group_unknown(void **state)
{
	(void)state;
	it_fx *f = it_daemon_start(&(it_daemon_opts){.plain = true, .deferred = true}, 0);
	assert_non_null(f);
	char log_path[300];
	snprintf(log_path, sizeof log_path, "%s/bad-group.log", f->d.root);
	const char *args[] = {"--state-dir", f->d.state_dir, "--port", "0", "--config", "/dev/null",
			      "--shared-group", "no-such-group-bertd-test", NULL};
	int st = it_run_bertd_to_exit(args, log_path, 30);
	char *log = it_slurp(log_path, NULL);
	assert_non_null(log);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 1 || !strstr(log, "shared_group no-such-group-bertd-test"))
		fail_msg("status 0x%x, want exit 1 naming shared_group:\n%s", st, log);
	free(log);
	assert_int_equal(it_daemon_stop(f), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_delete_and_keep),
		cmocka_unit_test(test_crash_mid_delete),
		cmocka_unit_test(test_retention),
		cmocka_unit_test(test_ceiling),
		cmocka_unit_test(test_shared_group),
		cmocka_unit_test(test_shared_group_unknown),
	};
	return IT_RUN(tests, NULL, NULL);
}
