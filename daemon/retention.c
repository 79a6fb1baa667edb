/* retention — see retention.h. Every walk here goes through directory file
 * descriptors with AT_SYMLINK_NOFOLLOW / O_NOFOLLOW, so a symbolic link is
 * an entry to count or unlink, never a way out of <state_dir>/jobs. */
#include "daemon/retention.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/log.h"

#define DELETING ".deleting-"
#define DAY_MS (86400LL * 1000)

struct retention {
	retention_config cfg;
	char state_dir[1024];
	char jobs_dir[1100];
	store *st;
	pthread_t th;
	bool started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_mutex_t del_mu;   /* held from retention_detach to retention_detach_end */
	bool stop, kicked;        /* under mu */
	atomic_bool stopping;     /* read by walks between entries */
	retention_usage cur;      /* under mu; the latest pass's numbers */
};

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Removes name (under dfd) and, when it is a directory, everything in it.
 * A link is unlinked, never followed. -EINTR when stopping. */
static int rm_at(int dfd, const char *name, atomic_bool *stopping)
{
	struct stat st;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISDIR(st.st_mode))
		return unlinkat(dfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	DIR *d = fdopendir(fd);
	if (!d) {
		int e = -errno;
		close(fd);
		return e;
	}
	int rc = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (atomic_load(stopping)) {
			rc = -EINTR;
			break;
		}
		int r = rm_at(fd, e->d_name, stopping);
		if (r < 0 && rc == 0)
			rc = r;
		if (r == -EINTR)
			break;
	}
	closedir(d);
	if (rc == 0 && unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		rc = -errno;
	return rc;
}

/* Allocated bytes of name (under dfd) and everything in it; links counted
 * as themselves. Unreadable parts count as what could be read. */
static uint64_t du_at(int dfd, const char *name, atomic_bool *stopping)
{
	struct stat st;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return 0;
	uint64_t sum = (uint64_t)st.st_blocks * 512;
	if (!S_ISDIR(st.st_mode))
		return sum;
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return sum;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return sum;
	}
	struct dirent *e;
	while ((e = readdir(d)) && !atomic_load(stopping))
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			sum += du_at(fd, e->d_name, stopping);
	closedir(d);
	return sum;
}

/* A job id as the store makes them ("job-" and hex); anything else under
 * jobs/ is not a job's directory. */
static bool is_job_name(const char *s)
{
	if (strncmp(s, "job-", 4) != 0 || strlen(s) >= sizeof(((retention_job_use *)0)->id))
		return false;
	for (const char *p = s + 4; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return s[4] != 0;
}

static int cmp_use(const void *a, const void *b)
{
	return strcmp(((const retention_job_use *)a)->id, ((const retention_job_use *)b)->id);
}

/* Measures jobs/ into u (u->jobs caller-owned). */
static void measure(retention *r, retention_usage *u)
{
	memset(u, 0, sizeof *u);
	u->measured_ms = now_ms();
	DIR *d = opendir(r->jobs_dir);
	if (!d)
		return;
	size_t cap = 0;
	struct dirent *e;
	while ((e = readdir(d)) && !atomic_load(&r->stopping)) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		uint64_t b = du_at(dirfd(d), e->d_name, &r->stopping);
		u->total_bytes += b;
		const char *id = e->d_name;
		bool deleting = strncmp(id, DELETING, strlen(DELETING)) == 0;
		if (deleting) {
			u->deleting_bytes += b;
			u->n_deleting++;
			id += strlen(DELETING); /* a whole job's directory is listed as deleting */
		}
		if (!is_job_name(id))
			continue;
		if (u->n_jobs == cap) {
			size_t nc = cap ? 2 * cap : 64;
			retention_job_use *nj = realloc(u->jobs, nc * sizeof *nj);
			if (!nj)
				continue; /* the total still counts it */
			u->jobs = nj;
			cap = nc;
		}
		retention_job_use *j = &u->jobs[u->n_jobs++];
		snprintf(j->id, sizeof j->id, "%s", id);
		j->bytes = b;
		j->deleting = deleting;
	}
	closedir(d);
	if (u->n_jobs)
		qsort(u->jobs, u->n_jobs, sizeof *u->jobs, cmp_use);
}

/* Finishes every .deleting-* entry. The names are listed under del_mu, so
 * none is a directory an API thread has just moved aside and may still move
 * back. In the first pass after a start, one named after a whole job whose
 * row survived a crash loses the row too. */
static void finish_deletions(retention *r, bool first)
{
	char **names = NULL;
	size_t n = 0, cap = 0;
	pthread_mutex_lock(&r->del_mu);
	DIR *d = opendir(r->jobs_dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (strncmp(e->d_name, DELETING, strlen(DELETING)) != 0)
			continue;
		if (n == cap) {
			size_t nc = cap ? 2 * cap : 16;
			char **nn = realloc(names, nc * sizeof *nn);
			if (!nn)
				break;
			names = nn;
			cap = nc;
		}
		if (!(names[n] = strdup(e->d_name)))
			break;
		n++;
	}
	if (d)
		closedir(d);
	pthread_mutex_unlock(&r->del_mu);
	int dfd = open(r->jobs_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	for (size_t i = 0; dfd >= 0 && i < n && !atomic_load(&r->stopping); i++) {
		int rc = rm_at(dfd, names[i], &r->stopping);
		if (rc == -EINTR)
			break;
		if (rc < 0) {
			log_warn("removing %s/%s: %s", r->jobs_dir, names[i], strerror(-rc));
			continue;
		}
		const char *id = names[i] + strlen(DELETING);
		if (first && is_job_name(id) && store_job_delete(r->st, id) == 0)
			log_info("job %s: deletion finished after a restart", id);
		log_debug("removed %s/%s", r->jobs_dir, names[i]);
	}
	if (dfd >= 0)
		close(dfd);
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

/* Renames jobs/<id>/<sub> to jobs/.deleting-<id>.<sub> (then removed by
 * finish_deletions): 1 when it was there. */
static int detach_sub(retention *r, const char *id, const char *sub)
{
	char from[1300], to[1300];
	snprintf(from, sizeof from, "%s/%s/%s", r->jobs_dir, id, sub);
	snprintf(to, sizeof to, "%s/" DELETING "%s.%s", r->jobs_dir, id, sub);
	struct stat st;
	if (lstat(from, &st) < 0 || !S_ISDIR(st.st_mode))
		return 0;
	if (rename(from, to) < 0) {
		log_warn("retention: cannot move %s aside: %s", from, strerror(errno));
		return -errno;
	}
	return 1;
}

/* The policy: checkpoints (and, without keep_exports, the export) of final
 * jobs finished at least checkpoint_days ago are moved aside for removal,
 * their checkpoint rows forgotten. */
static void apply_policy(retention *r)
{
	/* the policy as it is now (a reload may change it between passes) */
	pthread_mutex_lock(&r->mu);
	int days = r->cfg.checkpoint_days;
	bool keep_exports = r->cfg.keep_exports;
	pthread_mutex_unlock(&r->mu);
	if (days < 0)
		return;
	DIR *d = opendir(r->jobs_dir);
	if (!d)
		return;
	int64_t cutoff = now_ms() - (int64_t)days * DAY_MS;
	uint64_t dropped = 0;
	struct dirent *e;
	while ((e = readdir(d)) && !atomic_load(&r->stopping)) {
		if (!is_job_name(e->d_name))
			continue;
		store_job j = {0};
		if (store_job_get(r->st, e->d_name, &j) < 0)
			continue; /* no row: kept with ?keep_files, not ours to judge */
		bool old = job_state_is_terminal(j.state) && j.finished_ms > 0 && j.finished_ms <= cutoff;
		store_job_free(&j);
		if (!old)
			continue;
		if (detach_sub(r, e->d_name, "checkpoints") == 1) {
			dropped++;
			log_info("retention: job %s finished over %d day(s) ago: checkpoints removed",
				 e->d_name, days);
		}
		/* every pass, not only after a move: a crash between the move and
		 * the rows leaves rows of checkpoints no longer there */
		store_checkpoint *cks = NULL;
		size_t n = 0;
		if (store_checkpoint_list(r->st, e->d_name, &cks, &n) == 0) {
			for (size_t i = 0; i < n; i++)
				store_checkpoint_delete(r->st, e->d_name, cks[i].step);
			store_checkpoints_free(cks, n);
		}
		if (!keep_exports && detach_sub(r, e->d_name, "export") == 1)
			log_info("retention: job %s: export removed (retention_keep_exports = false)",
				 e->d_name);
	}
	closedir(d);
	pthread_mutex_lock(&r->mu);
	r->cur.checkpoints_dropped += dropped;
	pthread_mutex_unlock(&r->mu);
}

static void *thread_main(void *arg)
{
	retention *r = arg;
	bool first = true;
	pthread_mutex_lock(&r->mu);
	while (!r->stop) {
		r->kicked = false;
		pthread_mutex_unlock(&r->mu);
		apply_policy(r);
		finish_deletions(r, first);
		first = false;
		retention_usage u;
		measure(r, &u);
		pthread_mutex_lock(&r->mu);
		if (r->stop) {
			free(u.jobs);
			break;
		}
		u.passes = r->cur.passes + 1;
		u.checkpoints_dropped = r->cur.checkpoints_dropped;
		free(r->cur.jobs);
		r->cur = u;
		if (r->kicked)
			continue;
		struct timespec until;
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_sec += r->cfg.interval_s;
		while (!r->stop && !r->kicked)
			if (pthread_cond_timedwait(&r->cv, &r->mu, &until) == ETIMEDOUT)
				break;
	}
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

int retention_create(retention **out, const retention_config *cfg, store *st)
{
	int rc = 0;
	*out = NULL;
	retention *r = calloc(1, sizeof *r);
	if (!r)
		return -ENOMEM;
	r->cfg = *cfg;
	if (r->cfg.interval_s < 1)
		r->cfg.interval_s = 1;
	snprintf(r->state_dir, sizeof r->state_dir, "%s", cfg->state_dir);
	snprintf(r->jobs_dir, sizeof r->jobs_dir, "%s/jobs", cfg->state_dir);
	r->cfg.state_dir = r->state_dir;
	r->st = st;
	atomic_init(&r->stopping, false);
	pthread_mutex_init(&r->mu, NULL);
	pthread_mutex_init(&r->del_mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&r->cv, &ca);
	pthread_condattr_destroy(&ca);
	measure(r, &r->cur);
	/* The thread takes no signals: the daemon reads them from its signalfd,
	 * which works only while every thread blocks them. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = -pthread_create(&r->th, NULL, thread_main, r);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc < 0)
		goto out;
	r->started = true;
	*out = r;
out:
	if (rc < 0)
		retention_destroy(r);
	return rc;
}

void retention_destroy(retention *r)
{
	if (!r)
		return;
	if (r->started) {
		atomic_store(&r->stopping, true);
		pthread_mutex_lock(&r->mu);
		r->stop = true;
		pthread_cond_signal(&r->cv);
		pthread_mutex_unlock(&r->mu);
		pthread_join(r->th, NULL);
	}
	free(r->cur.jobs);
	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->mu);
	pthread_mutex_destroy(&r->del_mu);
	free(r);
}

static int job_paths(retention *r, const char *id, char *dir, char *aside, size_t cap)
{
	if (!is_job_name(id))
		return -EINVAL;
	snprintf(dir, cap, "%s/%s", r->jobs_dir, id);
	snprintf(aside, cap, "%s/" DELETING "%s", r->jobs_dir, id);
	return 0;
}

int retention_detach(retention *r, const char *id)
{
	char dir[1300], aside[1300];
	int rc = job_paths(r, id, dir, aside, sizeof dir);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&r->del_mu);
	if (rename(dir, aside) == 0)
		return 1;
	rc = errno == ENOENT ? 0 : -errno;
	pthread_mutex_unlock(&r->del_mu);
	return rc;
}

void retention_detach_end(retention *r, const char *id, bool row_deleted)
{
	char dir[1300], aside[1300];
	if (job_paths(r, id, dir, aside, sizeof dir) == 0 && !row_deleted && rename(aside, dir) < 0)
		log_error("job %s: cannot move its directory back from %s: %s", id, aside,
			  strerror(errno));
	pthread_mutex_unlock(&r->del_mu);
	if (row_deleted)
		retention_kick(r);
}

void retention_kick(retention *r)
{
	pthread_mutex_lock(&r->mu);
	r->kicked = true;
	pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

void retention_config_get(retention *r, retention_config *out)
{
	pthread_mutex_lock(&r->mu);
	*out = r->cfg;
	pthread_mutex_unlock(&r->mu);
}

void retention_set_policy(retention *r, const retention_config *cfg)
{
	pthread_mutex_lock(&r->mu);
	r->cfg.checkpoint_days = cfg->checkpoint_days;
	r->cfg.keep_exports = cfg->keep_exports;
	r->cfg.interval_s = cfg->interval_s < 1 ? 1 : cfg->interval_s;
	r->cfg.ceiling_bytes = cfg->ceiling_bytes;
	r->cfg.ceiling_percent = cfg->ceiling_percent;
	r->kicked = true; /* a pass under the new policy now */
	pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

int retention_usage_get(retention *r, retention_usage *out)
{
	int rc = 0;
	pthread_mutex_lock(&r->mu);
	*out = r->cur;
	out->jobs = NULL;
	if (r->cur.n_jobs) {
		out->jobs = malloc(r->cur.n_jobs * sizeof *out->jobs);
		if (!out->jobs) {
			out->n_jobs = 0;
			rc = -ENOMEM;
		} else {
			memcpy(out->jobs, r->cur.jobs, r->cur.n_jobs * sizeof *out->jobs);
		}
	}
	pthread_mutex_unlock(&r->mu);
	return rc;
}

int retention_over_ceiling(retention *r, retention_ceiling *c)
{
	pthread_mutex_lock(&r->mu);
	uint64_t u = r->cur.total_bytes;
	uint64_t ceiling_bytes = r->cfg.ceiling_bytes;
	int ceiling_percent = r->cfg.ceiling_percent;
	pthread_mutex_unlock(&r->mu);
	if (ceiling_bytes && u >= ceiling_bytes) {
		*c = (retention_ceiling){.key = "disk_ceiling_bytes", .unit = "bytes of job files",
					 .ceiling = ceiling_bytes, .used = u};
		return 1;
	}
	struct statvfs vs;
	if (ceiling_percent > 0 && statvfs(r->state_dir, &vs) == 0) {
		/* as df counts it: used over what a non-root user could have */
		uint64_t usedb = (uint64_t)(vs.f_blocks - vs.f_bfree);
		uint64_t avail = usedb + (uint64_t)vs.f_bavail;
		uint64_t pct = avail ? (usedb * 100 + avail - 1) / avail : 0;
		if (pct >= (uint64_t)ceiling_percent) {
			*c = (retention_ceiling){.key = "disk_ceiling_percent",
						 .unit = "percent of the file system",
						 .ceiling = (uint64_t)ceiling_percent, .used = pct};
			return 1;
		}
	}
	return 0;
}

/* chown + chmod, each only when it would change something: under a unit
 * with RestrictSUIDSGID=yes, setting the setgid bit is refused, so a jobs
 * directory made setgid beforehand (systemd-tmpfiles, docs/operations.md)
 * must be left as it is. */
static int give(const char *path, gid_t gid, mode_t mode)
{
	struct stat st;
	if (lstat(path, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode))
		return -ENOTDIR;
	if (st.st_gid != gid && chown(path, (uid_t)-1, gid) < 0)
		return -errno;
	if ((st.st_mode & 07777) != mode && chmod(path, mode) < 0)
		return -errno;
	return 0;
}

int retention_share_dirs(const char *state_dir, gid_t gid)
{
	char jobs[1100];
	int rc;
	snprintf(jobs, sizeof jobs, "%s/jobs", state_dir);
	if ((rc = fs_mkdir_p(jobs, 0750)) < 0 || (rc = give(state_dir, gid, 0710)) < 0 ||
	    (rc = give(jobs, gid, 02750)) < 0)
		return rc;
	return 0;
}
