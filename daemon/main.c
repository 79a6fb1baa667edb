/* bertd — the daemon's main: wires config, log, store, API and the event
 * loop together, and owns process-wide decisions (exit codes, signals,
 * systemd notifications). Does no work of its own beyond that.
 *
 * Exit codes (common/exitcodes.h, bertd_daemon_exit): 0 clean shutdown; 1
 * bad configuration; 2 startup failure (state dir, database, token, bind);
 * 3 the state dir is locked by another bertd (nothing of it was touched);
 * 4 the job database is damaged (quick_check at start); 5 the running jobs
 * were left running for the next bertd to adopt (a restart under systemd,
 * or SIGQUIT; supervisor_shutdown_detach, daemon/adopt.c).
 *
 * SIGHUP reloads the configuration (reload.h; the hooks are setup_reload's).
 * SIGTERM asks systemd whether it is a restart's (sdunit.h), which leaves
 * the jobs running, as SIGQUIT does; SIGTERM otherwise, and SIGINT, stop
 * the jobs with a checkpoint.
 *
 * `bertd backup FILE [options]` copies the job database of the state dir
 * the options name (a running daemon's too) into FILE and exits. `bertd
 * export CHECKPOINT_DIR OUT_DIR` runs bertd-worker's export mode. `bertd
 * token add|list|revoke` manages the API tokens (daemon/token_cmd.h).
 */
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <time.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "api/api.h"
#include "api/tls.h"
#include "common/exitcodes.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/nccl_lib.h"
#include "daemon/config.h"
#include "daemon/devices.h"
#include "daemon/loop.h"
#include "daemon/reload.h"
#include "daemon/retention.h"
#include "daemon/sdunit.h"
#include "daemon/store.h"
#include "daemon/supervisor.h"
#include "daemon/token_cmd.h"
#include "daemon/tokens.h"

extern char **environ;

typedef struct daemon_ctx {
	config cfg;
	store *st;
	store *api_st; /* the API's view of st: waits api_db_wait_ms, not the default */
	store *ret_st; /* the retention thread's view of st */
	retention *ret; /* job directories' removal, retention policy, disk use */
	api_server *api;
	supervisor *sup;
	device *devs;
	size_t ndev;
	loop *lp;
	int sigfd, timerfd;
	uint64_t watchdog_usec; /* 0 = systemd watchdog off */
	uint64_t ticks;
	char addr_path[1100];
	int lockfd; /* OFD lock on <state_dir>/bertd.lock, held for our life */
	tokens *tok; /* the API's tokens; outlives the API server; tokens_reload(tok) re-reads them */
	reload *rl; /* SIGHUP: the configuration in force and who applies it */
	bool restart; /* the SIGTERM is a restart's (sdunit.h): leave the jobs running */
	bool detach;  /* SIGQUIT: exit leaving the jobs running (an upgrade by hand) */
} daemon_ctx;

/* SIGHUP: reload the configuration, telling systemd while it runs
 * (RELOADING=1 ... READY=1), whatever the outcome: a refused reload leaves
 * the daemon running as it was. */
static void do_reload(daemon_ctx *d)
{
	char why[1400];
	sd_notify(0, "RELOADING=1\nSTATUS=reloading the configuration");
	int rc = reload_run(d->rl, why, sizeof why);
	if (rc < 0)
		sd_notifyf(0, "READY=1\nSTATUS=reload refused, configuration unchanged: %s",
			   rc == -EINVAL ? why : strerror(-rc));
	else
		sd_notify(0, "READY=1\nSTATUS=configuration reloaded");
}

static void on_signal(loop *l, int fd, uint32_t events, void *arg)
{
	(void)events;
	struct signalfd_siginfo si;
	while (read(fd, &si, sizeof si) == (ssize_t)sizeof si) {
		daemon_ctx *d = arg;
		if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
			log_info("received %s, shutting down", si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
			/* systemd sends SIGTERM for a stop and for a restart alike */
			d->restart = si.ssi_signo == SIGTERM && sdunit_stop_is_restart();
			sd_notify(0, d->restart ? "STOPPING=1\nSTATUS=restarting" : "STOPPING=1\nSTATUS=shutting down");
			loop_stop(l);
		} else if (si.ssi_signo == SIGQUIT) {
			/* the exit that leaves jobs running, for a restart or an upgrade */
			log_info("received SIGQUIT, exiting and leaving running jobs to the next daemon");
			sd_notify(0, "STOPPING=1\nSTATUS=exiting, jobs left running");
			d->detach = true;
			loop_stop(l);
		} else if (si.ssi_signo == SIGHUP) {
			log_info("received SIGHUP, reloading the configuration");
			do_reload(d);
		}
	}
}

static void publish_status(daemon_ctx *d)
{
	int64_t counts[JOB_STATE_COUNT];
	if (store_job_counts(d->st, counts) < 0)
		return;
	int64_t active = 0;
	for (int s = JOB_STARTING; s <= JOB_STOPPING; s++)
		active += counts[s];
	sd_notifyf(0, "STATUS=%lld queued, %lld active, %lld completed, %lld failed",
		   (long long)counts[JOB_QUEUED], (long long)active,
		   (long long)counts[JOB_COMPLETED], (long long)counts[JOB_FAILED]);
}

/* The daemon's cron: once a second. Keeps the systemd watchdog fed and the
 * status line current; later the scheduler and supervisor hang off it too. */
static void on_tick(loop *l, int fd, uint32_t events, void *arg)
{
	(void)l;
	(void)events;
	daemon_ctx *d = arg;
	uint64_t expirations;
	if (read(fd, &expirations, sizeof expirations) != (ssize_t)sizeof expirations)
		return;
	d->ticks += expirations;
	if (d->watchdog_usec)
		sd_notify(0, "WATCHDOG=1");
	supervisor_tick(d->sup);
	if (d->ticks % 3600 == 1) {
		/* Idempotency keys answer retries for a day, then are forgotten. */
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		int64_t day_ago = (int64_t)ts.tv_sec * 1000 - 24LL * 3600 * 1000;
		int64_t removed = 0;
		if (store_idem_prune(d->st, day_ago, &removed) == 0 && removed > 0)
			log_info("forgot %lld idempotency key(s) older than a day", (long long)removed);
	}
	if (d->ticks % 5 == 1)
		publish_status(d);
}

static int setup_signals(daemon_ctx *d)
{
	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	sigaddset(&mask, SIGQUIT);
	if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
		return -errno;
	signal(SIGPIPE, SIG_IGN);
	d->sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (d->sigfd < 0)
		return -errno;
	return loop_add(d->lp, d->sigfd, EPOLLIN, on_signal, d);
}

static int setup_timer(daemon_ctx *d)
{
	d->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (d->timerfd < 0)
		return -errno;
	/* Tick at 1 s, or faster if systemd's watchdog wants pings sooner. */
	long long period_ns = 1000000000LL;
	if (sd_watchdog_enabled(0, &d->watchdog_usec) > 0 && d->watchdog_usec / 2 * 1000 < (uint64_t)period_ns)
		period_ns = (long long)(d->watchdog_usec / 2 * 1000);
	struct itimerspec its = {
		.it_interval = {period_ns / 1000000000LL, period_ns % 1000000000LL},
		.it_value = {period_ns / 1000000000LL, period_ns % 1000000000LL},
	};
	if (timerfd_settime(d->timerfd, 0, &its, NULL) < 0)
		return -errno;
	return loop_add(d->lp, d->timerfd, EPOLLIN, on_tick, d);
}

/* Writes <state_dir>/bertd.addr so scripts and tests find the bound port. */
static int write_addr_file(daemon_ctx *d, int port)
{
	char line[160];
	const char *host = d->cfg.listen;
	bool v6 = strchr(host, ':') != NULL;
	snprintf(line, sizeof line, "%s://%s%s%s:%d\n", d->cfg.tls_cert[0] ? "https" : "http", v6 ? "[" : "",
		 host, v6 ? "]" : "", port);
	snprintf(d->addr_path, sizeof d->addr_path, "%s/bertd.addr", d->cfg.state_dir);
	return fs_write_atomic(d->addr_path, line, strlen(line), 0644);
}

/* What an operator does about a damaged database, said where bertd stops. */
static void say_how_to_recover(const char *db_path, const char *why)
{
	log_error("the job database %s is damaged (%s). bertd will not start on it: it could "
		  "acknowledge jobs it then loses. To recover, either restore a backup (one made "
		  "by 'bertd backup FILE'): remove %s-wal and %s-shm and copy the backup to %s; "
		  "or salvage what is readable: 'sqlite3 %s .recover | sqlite3 %s.recovered', check "
		  "it with PRAGMA integrity_check, keep the damaged file aside and move the "
		  "recovered one into its place. Steps: docs/operations.md",
		  db_path, why, db_path, db_path, db_path, db_path, db_path);
}

/* bertd backup FILE [options]: the options find the state dir as for the
 * daemon; the daemon may be running (store_backup reads one snapshot). */
static int backup_main(int argc, char **argv)
{
	if (argc < 3 || argv[2][0] == '-') {
		fprintf(stderr, "usage: %s backup FILE [--state-dir DIR | --config FILE ...]\n"
				"copies <state_dir>/bertd.db (WAL included) into the new file FILE\n",
			argv[0]);
		return BERTD_DAEMON_EXIT_CONFIG;
	}
	const char *dst = argv[2];
	argv[2] = argv[0]; /* config_load sees "PROG [options]" */
	config cfg;
	int rc = config_load(&cfg, argc - 2, argv + 2, environ, stdout, stderr);
	if (rc == 1)
		return BERTD_DAEMON_EXIT_OK;
	if (rc < 0)
		return BERTD_DAEMON_EXIT_CONFIG;
	char db_path[1100], why[1400];
	snprintf(db_path, sizeof db_path, "%s/bertd.db", cfg.state_dir);
	rc = store_backup(db_path, dst, why, sizeof why);
	if (rc == STORE_E_DAMAGED) {
		say_how_to_recover(db_path, why);
		return BERTD_DAEMON_EXIT_DB_DAMAGED;
	}
	if (rc < 0) {
		log_error("backup failed: %s", why[0] ? why : strerror(-rc));
		return BERTD_DAEMON_EXIT_STARTUP;
	}
	log_info("backed up %s to %s (integrity_check ok)", db_path, dst);
	return BERTD_DAEMON_EXIT_OK;
}

/* bertd export CHECKPOINT_DIR OUT_DIR [--dataset DIR]: the HuggingFace
 * model of a checkpoint on disk, made by the bertd-worker beside this
 * binary in its export mode (worker/convert.h), as the daemon's
 * GET /v1/jobs/{id}/checkpoints/{step}/export does; bertd runs no model
 * code itself. */
static int export_main(int argc, char **argv)
{
	if (!(argc == 4 || (argc == 6 && strcmp(argv[4], "--dataset") == 0)) || argv[2][0] == '-') {
		fprintf(stderr, "usage: %s export CHECKPOINT_DIR OUT_DIR [--dataset DATASET_DIR]\n"
				"writes the HuggingFace model of a bertd checkpoint (config.json, model.safetensors,\n"
				"vocab.txt, tokenizer files) into the new directory OUT_DIR; the vocab is the job's\n"
				"dataset's (found from <job>/job.json, or --dataset)\n",
			argv[0]);
		return BERTD_DAEMON_EXIT_CONFIG;
	}
	char bin[1100];
	ssize_t n = readlink("/proc/self/exe", bin, sizeof bin - 32);
	bin[n > 0 ? n : 0] = 0;
	char *slash = strrchr(bin, '/');
	snprintf(slash ? slash + 1 : bin, 32, "bertd-worker");
	char *wargv[] = {bin, "--export", argv[2], argv[3], argc == 6 ? argv[4] : NULL, argc == 6 ? argv[5] : NULL,
			 NULL};
	execv(bin, wargv);
	log_error("cannot run %s: %s", bin, strerror(errno));
	return BERTD_DAEMON_EXIT_STARTUP;
}

/* ---- what a reload applies (reload.h's hooks) ---- */

static void apply_log(void *arg, const config *next, void *staged)
{
	(void)arg;
	(void)staged;
	enum log_level lvl = LOG_LVL_INFO;
	log_level_parse(next->log_level, &lvl); /* config_load checked it */
	log_set_level(lvl);
}

static void apply_api_limits(void *arg, const config *next, void *staged)
{
	(void)staged;
	daemon_ctx *d = arg;
	api_server_set_limits(d->api, next->max_body_bytes, (unsigned)next->per_ip_limit,
			      (unsigned)next->request_timeout_s);
}

static void apply_supervisor(void *arg, const config *next, void *staged)
{
	(void)staged;
	daemon_ctx *d = arg;
	supervisor_set_limits(d->sup, next->stop_timeout_s * 1000, next->stall_timeout_s * 1000,
			      !next->schedule);
	if (next->schedule != reload_config(d->rl)->schedule)
		log_warn("schedule = %s: %s", next->schedule ? "true" : "false",
			 next->schedule ? "queued jobs start again" : "jobs are queued but none is started");
}

static void apply_retention(void *arg, const config *next, void *staged)
{
	(void)staged;
	daemon_ctx *d = arg;
	retention_config rc = {
		.checkpoint_days = next->retention_checkpoint_days,
		.keep_exports = next->retention_keep_exports,
		.interval_s = next->retention_interval_s,
		.ceiling_bytes = next->disk_ceiling_bytes,
		.ceiling_percent = next->disk_ceiling_percent,
	};
	retention_set_policy(d->ret, &rc);
}

/* The certificate and key are read again on every reload (renewed files
 * keep their names); switching between HTTPS and plain HTTP is refused. */
static int check_tls(void *arg, const config *running, const config *next, void **staged, char *why,
		     size_t cap)
{
	(void)arg;
	if (!running->tls_cert[0] != !next->tls_cert[0]) {
		snprintf(why, cap, "tls_cert: turning HTTPS %s needs a restart (systemctl restart bertd)",
			 next->tls_cert[0] ? "on" : "off");
		return -EINVAL;
	}
	if (!next->tls_cert[0])
		return 0;
	return api_tls_creds_load((api_tls_creds **)staged, next->tls_cert, next->tls_key, why, cap);
}

static void apply_tls(void *arg, const config *next, void *staged)
{
	daemon_ctx *d = arg;
	if (staged && api_server_set_tls(d->api, staged) == 0)
		log_info("reload: serving the certificate %s", next->tls_cert);
}

static void discard_tls(void *arg, void *staged)
{
	(void)arg;
	api_tls_creds_free(staged);
}

/* The token files, read again now (they are also read again by the first
 * request after they change, so this hook has nothing to check first). A
 * file that cannot be used refuses its tokens until it is fixed (tokens.h);
 * the error is logged. */
static void apply_tokens(void *arg, const config *next, void *staged)
{
	(void)next;
	(void)staged;
	daemon_ctx *d = arg;
	int rc = tokens_reload(d->tok);
	if (rc < 0)
		log_error("reload: the token files %s and %s: %s (their tokens are refused until fixed)",
			  d->cfg.token_file, d->cfg.tokens_file, strerror(-rc));
}

static int setup_reload(daemon_ctx *d, int argc, char **argv)
{
	int rc;
	const reload_hook hooks[] = {
		{.name = "log", .apply = apply_log},
		{.name = "api limits", .apply = apply_api_limits, .arg = d},
		{.name = "supervisor", .apply = apply_supervisor, .arg = d},
		{.name = "retention", .apply = apply_retention, .arg = d},
		{.name = "tls", .check = check_tls, .apply = apply_tls, .discard = discard_tls, .arg = d},
		{.name = "tokens", .apply = apply_tokens, .arg = d},
	};
	if ((rc = reload_create(&d->rl, &d->cfg, argc, argv, NULL)) < 0)
		return rc;
	for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; i++)
		if ((rc = reload_register(d->rl, &hooks[i])) < 0)
			return rc;
	return 0;
}

int main(int argc, char **argv)
{
	daemon_ctx d = {.sigfd = -1, .timerfd = -1, .lockfd = -1};
	log_init("bertd", LOG_LVL_INFO);
	if (argc > 1 && strcmp(argv[1], "backup") == 0)
		return backup_main(argc, argv);
	if (argc > 1 && strcmp(argv[1], "export") == 0)
		return export_main(argc, argv);
	if (argc > 1 && strcmp(argv[1], "token") == 0)
		return token_cmd_main(argc, argv, environ);
	int rc = config_load(&d.cfg, argc, argv, environ, stdout, stderr);
	if (rc == 1)
		return BERTD_DAEMON_EXIT_OK;
	if (rc < 0)
		return BERTD_DAEMON_EXIT_CONFIG;
	enum log_level lvl = LOG_LVL_INFO;
	log_level_parse(d.cfg.log_level, &lvl);
	log_set_level(lvl);
	/* the key nccl_path, wherever it was set, as the variable the NCCL
	 * search and the workers read (before any thread starts) */
	if (d.cfg.nccl_path[0])
		setenv(NCCL_LIB_ENV, d.cfg.nccl_path, 1);
	else
		unsetenv(NCCL_LIB_ENV);

	int exit_code = BERTD_DAEMON_EXIT_STARTUP;
	/* With a shared group, what jobs write is group-readable (0640 files,
	 * 0750 directories) and job directories carry the group (setgid);
	 * the database and the token stay in the state dir, which the group
	 * may pass through but not list. */
	gid_t shared_gid = (gid_t)-1;
	if (d.cfg.shared_group[0]) {
		struct group *g = getgrnam(d.cfg.shared_group);
		char *end;
		long n = strtol(d.cfg.shared_group, &end, 10);
		if (g)
			shared_gid = g->gr_gid;
		else if (!*end && n >= 0)
			shared_gid = (gid_t)n;
		else {
			log_error("shared_group %s: no such group", d.cfg.shared_group);
			exit_code = BERTD_DAEMON_EXIT_CONFIG;
			goto out;
		}
	}
	umask(shared_gid == (gid_t)-1 ? 077 : 027);
	if ((rc = fs_mkdir_p(d.cfg.state_dir, 0700)) < 0) {
		log_error("cannot create state_dir %s: %s", d.cfg.state_dir, strerror(-rc));
		goto out;
	}
	if (shared_gid != (gid_t)-1 && (rc = retention_share_dirs(d.cfg.state_dir, shared_gid)) < 0) {
		log_error("shared_group %s: cannot give %s/jobs to the group: %s (bertd must be a "
			  "member of it)", d.cfg.shared_group, d.cfg.state_dir, strerror(-rc));
		goto out;
	}
	/* Before anything else is written there: a second bertd on the same
	 * state dir would share the database and, on exit, delete the first
	 * one's bertd.addr. */
	char lock_path[1100];
	pid_t holder = 0;
	snprintf(lock_path, sizeof lock_path, "%s/bertd.lock", d.cfg.state_dir);
	if ((rc = fs_lock_pidfile(lock_path, 0644, &d.lockfd, &holder)) < 0) {
		if (rc == -EWOULDBLOCK && holder > 0)
			log_error("state_dir %s is in use by another bertd (pid %ld, lock %s); "
				  "stop it or give this one another --state-dir",
				  d.cfg.state_dir, (long)holder, lock_path);
		else if (rc == -EWOULDBLOCK)
			log_error("state_dir %s is in use by another bertd (pid unknown, lock %s); "
				  "stop it or give this one another --state-dir",
				  d.cfg.state_dir, lock_path);
		else
			log_error("cannot lock state_dir %s (%s): %s", d.cfg.state_dir, lock_path,
				  strerror(-rc));
		if (rc == -EWOULDBLOCK)
			exit_code = BERTD_DAEMON_EXIT_LOCKED;
		goto out;
	}
	if (!d.cfg.data_roots[0] && (rc = fs_mkdir_p(d.cfg.roots[0], 0750)) < 0) {
		log_error("cannot create data root %s: %s", d.cfg.roots[0], strerror(-rc));
		goto out;
	}
	/* A configured root may be mounted later, so this only warns; GET
	 * /v1/system shows the same check as it stands at request time. */
	for (size_t i = 0; i < d.cfg.n_roots; i++) {
		char why[1400];
		if (config_root_check(d.cfg.roots[i], i == 0, why, sizeof why) < 0)
			log_warn("%s", why);
	}
	char db_path[1100];
	snprintf(db_path, sizeof db_path, "%s/bertd.db", d.cfg.state_dir);
	char why[512] = "";
	rc = store_open(&d.st, db_path);
	if (rc == 0) {
		/* Before anything is acknowledged into it. quick_check reads every
		 * page (not the index contents): 40-100 ms on a 50 MB file of
		 * 10,000 finished jobs with their events and metrics (page cache
		 * warm; cold, about one sequential read of the file). */
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		rc = store_quick_check(d.st, why, sizeof why);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		log_info("quick_check of %s: %s in %.0f ms", db_path, rc == 0 ? "ok" : "failed",
			  (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
	}
	if (rc == STORE_E_DAMAGED) {
		say_how_to_recover(db_path, why[0] ? why : "not a database");
		exit_code = BERTD_DAEMON_EXIT_DB_DAMAGED;
		goto out;
	}
	if (rc < 0) {
		log_error("cannot open the job database %s: %s", db_path, strerror(-rc));
		goto out;
	}
	if ((rc = store_view(&d.api_st, d.st, d.cfg.api_db_wait_ms)) < 0) {
		log_error("store view: %s", strerror(-rc));
		goto out;
	}
	retention_config rcfg = {
		.state_dir = d.cfg.state_dir,
		.checkpoint_days = d.cfg.retention_checkpoint_days,
		.keep_exports = d.cfg.retention_keep_exports,
		.interval_s = d.cfg.retention_interval_s,
		.ceiling_bytes = d.cfg.disk_ceiling_bytes,
		.ceiling_percent = d.cfg.disk_ceiling_percent,
		.shared_gid = shared_gid,
	};
	if ((rc = store_view(&d.ret_st, d.st, d.cfg.api_db_wait_ms)) < 0 ||
	    (rc = retention_create(&d.ret, &rcfg, d.ret_st)) < 0) {
		log_error("retention setup: %s", strerror(-rc));
		goto out;
	}
	bool created = false;
	if ((rc = tokens_open(&d.tok, d.cfg.token_file, d.cfg.tokens_file, true, &created)) < 0) {
		log_error("cannot use token files %s and %s: %s", d.cfg.token_file, d.cfg.tokens_file,
			  strerror(-rc));
		goto out;
	}
	if (created)
		log_info("created API token in %s (mode 0600)", d.cfg.token_file);

	if ((rc = loop_create(&d.lp)) < 0 || (rc = setup_signals(&d)) < 0 || (rc = setup_timer(&d)) < 0) {
		log_error("event loop setup failed: %s", strerror(-rc));
		goto out;
	}

	api_config ac = {
		.listen_addr = d.cfg.listen,
		.port = d.cfg.port,
		.allow_remote = d.cfg.allow_remote,
		.max_body_bytes = d.cfg.max_body_bytes,
		.tokens = d.tok,
		.threads = (unsigned)d.cfg.api_threads,
		.conn_timeout_s = (unsigned)d.cfg.conn_timeout_s,
		.conn_limit = (unsigned)d.cfg.conn_limit,
		.per_ip_limit = (unsigned)d.cfg.per_ip_limit,
		.request_timeout_s = (unsigned)d.cfg.request_timeout_s,
		.conn_memory = d.cfg.conn_memory,
		.follow_max_per_job = (unsigned)d.cfg.follow_max_per_job,
		.follow_max_total = (unsigned)d.cfg.follow_max_total,
		.follow_keepalive_s = (unsigned)d.cfg.follow_keepalive_s,
		.data_roots = (const char *const *)d.cfg.roots,
		.n_data_roots = d.cfg.n_roots,
		.state_dir = d.cfg.state_dir,
		.retention = d.ret,
	};
	if ((rc = devices_discover(d.cfg.devices, d.cfg.cpu_slots, &d.devs, &d.ndev)) < 0) {
		log_error("device discovery failed (devices = %s): %s", d.cfg.devices, strerror(-rc));
		goto out;
	}
	for (size_t i = 0; i < d.ndev; i++)
		if (d.devs[i].kind == DEVICE_CUDA)
			log_info("device %zu: %s (sm_%d%d, %.1f GiB)", i, d.devs[i].name, d.devs[i].cc_major,
				 d.devs[i].cc_minor, (double)d.devs[i].mem_total / (1 << 30));
	if (!d.cfg.schedule)
		log_warn("schedule = false: jobs are queued but none is started");
	if (d.ndev && d.devs[0].kind == DEVICE_CPU)
		log_info("no GPU in use: %zu CPU worker slot(s)", d.ndev);
	char bin_dir[1024];
	if (d.cfg.bin_dir[0]) {
		snprintf(bin_dir, sizeof bin_dir, "%s", d.cfg.bin_dir);
	} else {
		ssize_t n = readlink("/proc/self/exe", bin_dir, sizeof bin_dir - 1);
		bin_dir[n > 0 ? n : 0] = 0;
		char *slash = strrchr(bin_dir, '/');
		if (slash)
			*slash = 0;
	}
	supervisor_config sc = {
		.state_dir = d.cfg.state_dir,
		.bin_dir = bin_dir,
		.dataset_root = d.cfg.roots[0],
		.stop_timeout_ms = d.cfg.stop_timeout_s * 1000,
		.stall_timeout_ms = d.cfg.stall_timeout_s * 1000,
		.hold_queue = !d.cfg.schedule,
		.prepare_concurrency = d.cfg.prepare_concurrency,
		.pass_env = d.cfg.pass_env,
		.slurm_srun = d.cfg.slurm_srun,
		.slurm_conf = d.cfg.slurm_conf,
		.relay_host = d.cfg.relay_host,
		.multinode_comm = d.cfg.multinode_comm,
		.slurm_immediate_s = d.cfg.slurm_immediate_s,
		.relay_timeout_ms = d.cfg.relay_timeout_s * 1000,
		.slurm_gpus_per_node = d.cfg.slurm_gpus_per_node,
	};
	if ((rc = supervisor_create(&d.sup, &sc, d.lp, d.st, d.devs, d.ndev)) < 0) {
		log_error("supervisor setup failed: %s", strerror(-rc));
		goto out;
	}

	/* NCCL, which multi-GPU jobs need: asked once (no CUDA context). The
	 * key reaches the workers as BERTD_NCCL_PATH (childenv's switches), so
	 * they load the library this answer is about. */
	static char nccl_version[32], nccl_path[4096], nccl_problem[1024];
	if (nccl_lib_probe(nccl_version, sizeof nccl_version, nccl_path, sizeof nccl_path, nccl_problem,
			   sizeof nccl_problem) == 0) {
		log_info("NCCL %s (%s)", nccl_version, nccl_path);
		ac.nccl_version = nccl_version;
	} else {
		log_info("no NCCL: %s; multi-GPU jobs are refused", nccl_problem);
		ac.nccl_problem = nccl_problem;
	}
	ac.devices = d.devs;
	ac.n_devices = d.ndev;
	ac.bin_dir = bin_dir;
	ac.slurm_srun = d.cfg.slurm_srun;
	ac.slurm_conf = d.cfg.slurm_conf;
	ac.tls_cert = d.cfg.tls_cert;
	ac.tls_key = d.cfg.tls_key;
	if ((rc = api_server_start(&d.api, &ac, d.api_st)) < 0) {
		if (rc == -EPERM)
			log_error("refusing to listen on %s: not a loopback address (set allow_remote = true)",
				  d.cfg.listen);
		else
			log_error("cannot listen on %s:%d: %s", d.cfg.listen, d.cfg.port, strerror(-rc));
		goto out;
	}
	int port = api_server_port(d.api);
	if ((rc = write_addr_file(&d, port)) < 0) {
		log_error("cannot write %s: %s", d.addr_path, strerror(-rc));
		goto out;
	}
	log_info("bertd %s listening on %s://%s:%d (state %s)", BERTD_VERSION,
		 d.cfg.tls_cert[0] ? "https" : "http", d.cfg.listen, port, d.cfg.state_dir);
	if ((rc = setup_reload(&d, argc, argv)) < 0) {
		log_error("reload setup: %s", strerror(-rc));
		goto out;
	}
	/* The unit's IP filter is a cgroup BPF program bertd cannot read
	 * without privileges, so it cannot tell whether a drop-in opened it;
	 * under systemd (INVOCATION_ID, systemd.exec(5)) it says where to look. */
	if (d.cfg.allow_remote && getenv("INVOCATION_ID"))
		log_info("allow_remote = true under systemd: bertd.service lets only localhost "
			 "reach the API (IPAddressAllow=localhost) unless a drop-in allows other "
			 "networks (systemd/bertd.service.d/remote-listen.conf.example)");
	sd_notifyf(0, "READY=1\nMAINPID=%d", (int)getpid());
	publish_status(&d);

	if ((rc = loop_run(d.lp)) < 0) {
		log_error("event loop failed: %s", strerror(-rc));
		goto out;
	}
	exit_code = BERTD_DAEMON_EXIT_OK;
out:
	api_server_stop(d.api); /* no new work while running jobs drain */
	if (exit_code == BERTD_DAEMON_EXIT_OK && (d.restart || d.detach)) {
		supervisor_shutdown_detach(d.sup);
		log_info("%s: jobs left running for the next bertd to adopt", d.restart ? "restart" : "SIGQUIT");
		exit_code = BERTD_DAEMON_EXIT_DETACHED;
	}
	else
		supervisor_shutdown(d.sup);
	supervisor_destroy(d.sup);
	reload_destroy(d.rl);
	retention_destroy(d.ret);
	tokens_close(d.tok); /* after the API server: its requests check tokens */
	free(d.devs);
	if (d.addr_path[0])
		unlink(d.addr_path);
	if (d.timerfd >= 0)
		close(d.timerfd);
	if (d.sigfd >= 0)
		close(d.sigfd);
	loop_destroy(d.lp);
	store_close(d.api_st);
	store_close(d.ret_st);
	store_close(d.st);
	if (d.lockfd >= 0)
		close(d.lockfd); /* last: everything of ours in the state dir is settled */
	log_info("stopped");
	return exit_code;
}
