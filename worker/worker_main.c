/* bertd-worker — one training process of a job: rank r of G, one device.
 *
 * Reads the job file the daemon wrote (docs/formats.md), opens its batches
 * (the job's ring when loaders run, else the dataset, to build them here:
 * dataloader_num_workers = 0, the serial baseline), builds or loads the
 * model, picks the device (device_cpu.c, or device_gpu.c for kind "cuda" in
 * CUDA builds), joins the job's ranks and runs the training loop (loop.c).
 *
 * This file is the process: arguments, the daemon's line (fd 3 and the
 * socket a later daemon adopts it on, common/chan.h; its messages, hello,
 * metrics, checkpoints, errors, go through worker.c),
 * signals, the exit code (common/exitcodes.h).
 * Stopping: a {"type":"stop"} from the daemon (cancel, shutdown), or the
 * line gone for a rank no daemon can adopt, sets stop_requested (a local
 * rank trains on without a daemon, keeping its messages); the loop agrees on it across ranks,
 * rank 0 checkpoints and every rank exits 6. `bertd-worker --export` is
 * the other mode: a checkpoint into an HF model directory (convert.h).
 * Never touches SQLite; never exits from anywhere but main.
 */
#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/exitcodes.h"
#include "common/log.h"
#include "common/msg.h"
#include "loader/batch.h"
#include "loader/batchjob.h"
#include "loader/ring.h"
#include "worker/checkpoint.h"
#include "worker/comm.h"
#include "worker/convert.h"
#include "worker/loop.h"
#include "worker/relay.h"
#include "worker/train.h"
#include "worker/worker.h"

#define DAEMON_FD 3

static const char *jstr(json_t *o, const char *k)
{
	return json_string_value(json_object_get(o, k));
}

/* ---- setup: each step returns 0 or the exit code, already reported ---- */

/* Reads the job file: this rank's directories and device kind (*on_gpu for
 * "cuda" in CUDA builds; any other kind is refused). */
static int open_job(worker *w, const char *job_path, const char **kind, bool *on_gpu)
{
	json_error_t jerr;
	w->job = json_load_file(job_path, JSON_REJECT_DUPLICATES, &jerr);
	if (!w->job)
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG, "cannot read job file %s: %s", job_path,
				   jerr.text);
	if (batchjob_from_json(w->job, &w->bj) < 0)
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG, "job file %s is not usable (see log)", job_path);
	w->world = (int)w->bj.world_size;
	w->checkpoint_dir = jstr(w->job, "checkpoint_dir");
	w->export_dir = jstr(w->job, "export_dir");
	w->resume_from = jstr(w->job, "resume_from");
	*kind = jstr(json_array_get(json_object_get(w->job, "devices"), (size_t)w->rank), "kind");
	if (w->rank >= w->world || !w->checkpoint_dir || !w->export_dir || !*kind)
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG,
				   "job file lacks rank %d's device or its directories", w->rank);
	worker_send(w, json_pack("{s:s, s:i, s:i, s:s, s:i}", "type", "hello", "rank", w->rank, "pid",
				 (int)getpid(), "device", *kind, "proto", CHAN_PROTO));
#ifdef BERTD_CUDA
	*on_gpu = strcmp(*kind, "cuda") == 0;
	const char *built_for = "trains on \"cpu\" or \"cuda\"";
#else
	*on_gpu = false;
	const char *built_for = "was built without CUDA (CPU backend only)";
#endif
	if (strcmp(*kind, "cpu") != 0 && !*on_gpu) /* refuse rather than silently train on the CPU */
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG, "device kind %s: this bertd-worker %s", *kind,
				   built_for);
	if (!*on_gpu && (w->bj.spec.training.bf16 == 1 || w->bj.spec.training.fp16 == 1))
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG,
				   "bf16/fp16 asked for, but this job runs on the CPU backend (fp32 only)");
	return 0;
}

/* The dataset is opened by every rank (its vocab sizes the model); batches
 * come from the ring when loaders run, else are built here. */
static int open_batches(worker *w, const char *exe, const char *job_path)
{
	const batch_layout *l = &w->bj.ring.layout;
	const int M = w->bj.spec.training.gradient_accumulation_steps;
	int rc = batchjob_data_open(&w->bj, &w->data);
	if (rc < 0)
		return worker_fail(w, BERTD_EXIT_DATA, "dataset %s: %s", w->bj.dataset_dir, strerror(-rc));
	if (M > 64)
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG, "gradient_accumulation_steps above 64");
	w->mlm_pos = calloc((size_t)M * l->B * l->P, sizeof(int32_t));
	w->mlm_lab = calloc((size_t)M * l->B * l->P, sizeof(int32_t));
	w->win_ph = calloc(LOOP_WIN_STEPS_MAX, sizeof *w->win_ph);
	if (!w->mlm_pos || !w->mlm_lab || !w->win_ph)
		return worker_fail(w, BERTD_EXIT_OOM, "out of memory for batch buffers");
	if (w->bj.spec.training.dataloader_num_workers == 0 &&
	    posix_memalign(&w->local_slot, BATCH_ALIGN, (size_t)M * l->slot_bytes) != 0)
		return worker_fail(w, BERTD_EXIT_OOM, "out of memory for batch slots");
	w->ring_rank = w->rank;
	if (w->bj.spec.training.dataloader_num_workers > 0 && w->world > 1 && relay_wanted()) {
		char why[300];
		bool first = false;
		if (nodeloaders_plan(&w->bj, w->rank, &w->ring_rank, &first, why, sizeof why) < 0)
			return worker_fail(w, BERTD_EXIT_BAD_CONFIG, "%s", why);
		if (first && nodeloaders_start(&w->nl, &w->bj, exe, job_path, why, sizeof why) < 0)
			return worker_fail(w, BERTD_EXIT_FAILURE, "%s", why);
	}
	if (w->bj.spec.training.dataloader_num_workers > 0 &&
	    (rc = ring_open(&w->rg, w->bj.shm_name, &w->bj.ring)) < 0)
		return worker_fail(w, BERTD_EXIT_DATA, "cannot open the batch ring %s: %s", w->bj.shm_name,
				   strerror(-rc));
	return 0;
}

/* Rank 0 tells the daemon what the job trains on ({"type":"data"},
 * docs/formats.md): the index every rank just built, counted once. */
static void report_data(worker *w)
{
	if (w->rank != 0)
		return;
	mlm_stats st;
	mlm_dataset_stats(w->data.ds, &st);
	worker_send(w, json_pack("{s:s, s:I, s:I, s:I, s:I, s:{s:I}, s:I, s:I, s:I, s:f, s:I}", "type", "data",
				 "sequences_per_epoch", (json_int_t)st.n_samples,
				 "corpus_tokens", (json_int_t)st.n_tokens_corpus,
				 "tokens_per_epoch", (json_int_t)(st.n_tokens_corpus - st.n_tokens_truncated),
				 "tokens_dropped", (json_int_t)st.n_tokens_truncated,
				 "dropped", "long_sentences", (json_int_t)st.n_tokens_truncated,
				 "documents", (json_int_t)st.n_docs,
				 "held_out_documents", (json_int_t)st.n_docs_other,
				 "held_out_tokens", (json_int_t)st.n_tokens_other,
				 "pad_fraction", st.pad_fraction,
				 "longest_sentence", (json_int_t)st.longest_sentence));
}

/* The best checkpoint as the checkpoint resumed from knew it, when that is
 * one of this job's own (init_from_restore "all" resumes from another
 * job's, whose steps name checkpoints that are not here). */
static void resume_best(worker *w)
{
	size_t n = strlen(w->checkpoint_dir);
	if (strncmp(w->resume_from, w->checkpoint_dir, n) != 0 || w->resume_from[n] != '/')
		return;
	json_t *ta = checkpoint_read_training_args(w->resume_from);
	json_t *b = json_object_get(ta, "best_model"), *st = json_object_get(b, "step"), *v = json_object_get(b, "value");
	const char *metric = json_string_value(json_object_get(b, "metric"));
	/* a best by another metric (the spec cannot change, but be sure) is no best */
	if (json_is_integer(st) && json_is_number(v) && metric &&
	    strcmp(metric, w->bj.spec.training.metric_for_best_model) == 0)
		w->best = (best_state){.step = (long)json_integer_value(st), .value = json_number_value(v)};
	json_decref(ta);
}

/* The host trainer: made from the spec (train.c) with what only this process
 * knows (the dataset's vocab, the threads), or resumed from a checkpoint,
 * whose step must be the job's. */
static int make_trainer(worker *w, bool on_gpu, train_config *tc)
{
	char err[512];
	jobspec_model *jm = &w->bj.spec.model;
	const shard_vocab_info *vi = &w->data.shards->vocab;
	if (jm->vocab_size <= 0)
		jm->vocab_size = (int)vi->vocab_size;
	if ((uint32_t)jm->vocab_size < vi->vocab_size)
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG,
				   "model.vocab_size %d is smaller than the dataset's vocab (%u)", jm->vocab_size,
				   vi->vocab_size);
	const char *omp = getenv("OMP_NUM_THREADS");
	int threads = omp && atoi(omp) > 0 ? atoi(omp) : 1;
	if (train_config_from_jobspec(tc, &w->bj.spec, threads, (uint32_t)w->rank, err, sizeof err) < 0)
		return worker_fail(w, BERTD_EXIT_BAD_CONFIG, "%s", err);
	tc->model.pad_token_id = (int)vi->special.pad;
	if (tc->init_from && w->resume_from) /* the model is the checkpoint's; init_from may be gone */
		tc->init_from = w->resume_from;
	int rc = trainer_create(&w->tr, tc, err, sizeof err);
	if (rc < 0)
		return worker_fail(w, rc == -ENOMEM ? BERTD_EXIT_OOM : BERTD_EXIT_BAD_CONFIG, "%s", err);
	if (w->resume_from) {
		if ((rc = trainer_resume(w->tr, w->resume_from, err, sizeof err)) >= 0)
			rc = checkpoint_read_scaler(w->resume_from, &w->ckpt_scaler, err, sizeof err);
		if (rc < 0)
			return worker_fail(w, BERTD_EXIT_DATA, "resuming from %s: %s", w->resume_from, err);
		w->have_ckpt_scaler = rc == 0;
		resume_best(w);
		if (!on_gpu && w->have_ckpt_scaler && w->ckpt_scaler.enabled)
			log_info("the checkpoint's fp16 loss scale (%g) is not used: the CPU backend trains in fp32",
				 (double)w->ckpt_scaler.scale);
	}
	if (w->tr->step != w->bj.start_step)
		return worker_fail(w, BERTD_EXIT_DATA,
				   "checkpoint step %ld disagrees with the job's resume step %lld", w->tr->step,
				   (long long)w->bj.start_step);
	return 0;
}

/* ---- joining the job's ranks (world > 1) ---- */

/* The rendezvous store of the net backend over the daemon connection
 * (daemon/relaykv.h): values travel as hex strings. */
static int kv_set(void *ctx, const char *key, const void *val, size_t len)
{
	worker *w = ctx;
	static const char digits[] = "0123456789abcdef";
	char *hex = malloc(2 * len + 1);
	if (!hex)
		return -ENOMEM;
	for (size_t i = 0; i < len; i++) {
		hex[2 * i] = digits[((const unsigned char *)val)[i] >> 4];
		hex[2 * i + 1] = digits[((const unsigned char *)val)[i] & 15];
	}
	hex[2 * len] = 0;
	int rc = worker_send(w, json_pack("{s:s, s:s, s:s}", "type", "kv_set", "key", key, "value", hex));
	free(hex);
	return rc;
}

static int unhex(int ch)
{
	return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

static int kv_get(void *ctx, const char *key, void *val, size_t cap, size_t *len, int timeout_ms)
{
	worker *w = ctx;
	int rc = worker_send(w, json_pack("{s:s, s:s}", "type", "kv_get", "key", key));
	double deadline = worker_now_s() + timeout_ms / 1000.0;
	while (rc == 0) {
		json_t *m = NULL;
		int left_ms = (int)((deadline - worker_now_s()) * 1000.0);
		rc = worker_await(w, "kv", left_ms > 0 ? left_ms : 0, &m);
		if (rc < 0)
			return rc; /* -ETIMEDOUT: the key was not set in time */
		const char *k = jstr(m, "key"), *hex = jstr(m, "value"), *err = jstr(m, "error");
		if (!k || strcmp(k, key) != 0) { /* an answer to an earlier, abandoned get */
			json_decref(m);
			continue;
		}
		size_t n = hex ? strlen(hex) : 0;
		if (err || !hex || n % 2)
			rc = -EPROTO;
		else if (n / 2 > cap)
			rc = -EMSGSIZE;
		for (size_t i = 0; rc == 0 && i < n / 2; i++) {
			int hi = unhex(hex[2 * i]), lo = unhex(hex[2 * i + 1]);
			if (hi < 0 || lo < 0)
				rc = -EPROTO;
			else
				((unsigned char *)val)[i] = (unsigned char)(hi << 4 | lo);
		}
		if (err)
			log_error("the daemon refused the get of %s: %s", key, err);
		*len = n / 2;
		json_decref(m);
		return rc;
	}
	return rc;
}

/* What decides whether two ranks can share memory: the same kernel
 * (boot_id) and the same /dev/shm (device and inode: a node in its own
 * mount namespace, or a container, has its own). */
static void shm_domain(char *buf, size_t cap)
{
	char boot[64] = "?";
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
	if (f) {
		if (!fgets(boot, sizeof boot, f))
			snprintf(boot, sizeof boot, "?");
		boot[strcspn(boot, "\n")] = 0;
		fclose(f);
	}
	struct stat st = {0};
	stat("/dev/shm", &st);
	snprintf(buf, cap, "%s/%llx/%llx", boot, (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
}

/* Whether every rank of the job is on this rank's host (exchanged through
 * the daemon's key/value map): 1, 0, or a negative errno. */
static int all_on_one_host(worker *w)
{
	char mine[160], key[32], theirs[160];
	shm_domain(mine, sizeof mine);
	snprintf(key, sizeof key, "host/%d", w->rank);
	int rc = kv_set(w, key, mine, strlen(mine));
	int same = 1;
	for (int g = 0; rc == 0 && g < w->world; g++) {
		size_t len = 0;
		snprintf(key, sizeof key, "host/%d", g);
		rc = kv_get(w, key, theirs, sizeof theirs - 1, &len, LOOP_COMM_TIMEOUT_MS);
		if (rc == 0 && (len != strlen(mine) || memcmp(theirs, mine, len) != 0))
			same = 0;
	}
	return rc < 0 ? rc : same;
}

/* The address the net backend listens on: BERTD_COMM_ADDR, else the
 * interface BERTD_COMM_IFACE names, else the local address of the daemon
 * connection (an interface that routes to the head node, where the other
 * ranks' connections go too). */
static int comm_address(worker *w, comm_net_opts *o, char *buf, size_t cap)
{
	const char *addr = getenv("BERTD_COMM_ADDR"), *iface = getenv("BERTD_COMM_IFACE");
	if (addr && *addr) {
		o->bind_addr = addr;
		return 0;
	}
	if (iface && *iface) {
		o->iface = iface;
		return 0;
	}
	struct sockaddr_storage sa;
	socklen_t sl = sizeof sa;
	if (getsockname(w->ch.fd, (struct sockaddr *)&sa, &sl) < 0)
		return -errno;
	if (sa.ss_family != AF_INET && sa.ss_family != AF_INET6)
		return -EAFNOSUPPORT; /* fd 3 is a socketpair: set BERTD_COMM_ADDR */
	int rc = getnameinfo((struct sockaddr *)&sa, sl, buf, (socklen_t)cap, NULL, 0, NI_NUMERICHOST);
	if (rc != 0)
		return -EADDRNOTAVAIL;
	o->bind_addr = buf;
	return 0;
}

/* The network backend's bound on every wait: BERTD_COMM_TIMEOUT_MS from
 * the rank's environment (1 ms .. 1 h; reaches ranks through pass_env),
 * else the loop's LOOP_COMM_TIMEOUT_MS. A rank whose peer was cut off by
 * the network, not killed, waits this long before it exits peer_lost. */
static int net_timeout_ms(void)
{
	const char *t = getenv("BERTD_COMM_TIMEOUT_MS");
	char *end;
	long v = t && *t ? strtol(t, &end, 10) : 0;
	return t && *t && !*end && v > 0 && v <= 3600000 ? (int)v : LOOP_COMM_TIMEOUT_MS;
}

/* The group of the job's ranks (world > 1): the loop's per-step sums, the
 * replica check, eval, the barrier, and the CPU device's gradients. Shared
 * memory when every rank is on this host, the network backend otherwise
 * (docs/multinode.md). pick is the daemon's word in "go" ("auto", "net";
 * "" for a local job), BERTD_COMM=net|shm the worker's own override. */
static int join_ranks(worker *w, const char *pick)
{
	const char *force = getenv("BERTD_COMM");
	bool net = false;
	int rc = 0;
	if (force && *force) {
		if (strcmp(force, "net") != 0 && strcmp(force, "shm") != 0)
			return worker_fail(w, BERTD_EXIT_BAD_CONFIG, "BERTD_COMM=%s: must be net or shm", force);
		net = strcmp(force, "net") == 0;
	} else if (strcmp(pick, "net") == 0) {
		net = true;
	} else if (relay_wanted()) {
		rc = all_on_one_host(w);
		if (rc < 0)
			return worker_fail(w, BERTD_EXIT_PEER_LOST, "finding where the job's ranks run failed: %s",
					   strerror(-rc));
		net = rc == 0;
	}
	if (net) {
		char addr[INET6_ADDRSTRLEN + 8];
		comm_net_opts o = {.timeout_ms = net_timeout_ms()};
		comm_kv kv = {.ctx = w, .set = kv_set, .get = kv_get};
		if ((rc = comm_address(w, &o, addr, sizeof addr)) < 0)
			return worker_fail(w, BERTD_EXIT_BAD_CONFIG,
					   "no address for the network comm backend (%s): set BERTD_COMM_ADDR", strerror(-rc));
		rc = comm_create_net(&w->cm, w->rank, w->world, &kv, &o);
		if (rc == -ENOTSUP)
			return worker_fail(w, BERTD_EXIT_BAD_CONFIG,
					   "the job's ranks are on several hosts and this bertd-worker has no network "
					   "comm backend (built without libgloo-dev)");
		if (rc < 0)
			return worker_fail(w, BERTD_EXIT_PEER_LOST, "joining the %d-rank group over the network (%s) "
					   "failed: %s", w->world, o.bind_addr ? o.bind_addr : o.iface, strerror(-rc));
		log_info("rank %d/%d: comm over the network from %s", w->rank, w->world,
			 o.bind_addr ? o.bind_addr : o.iface);
		return 0;
	}
	char cname[160];
	comm_name_for_job(cname, sizeof cname, w->bj.job_id);
	rc = comm_create_shm(&w->cm, cname, w->rank, w->world, COMM_DEFAULT_MAX_FLOATS, LOOP_COMM_TIMEOUT_MS);
	if (rc < 0)
		return worker_fail(w, BERTD_EXIT_PEER_LOST, "joining the %d-rank group failed: %s", w->world,
				   strerror(-rc));
	return 0;
}

static int parse_args(int argc, char **argv, const char **job_path, int *rank)
{
	static const struct option opts[] = {
		{"job", required_argument, 0, 'j'}, {"rank", required_argument, 0, 'r'},
		{"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
	};
	int c;
	*job_path = NULL;
	*rank = -1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		char *end;
		switch (c) {
		case 'j': *job_path = optarg; break;
		case 'r':
			*rank = (int)strtol(optarg, &end, 10);
			if (*end || *rank < 0)
				return -EINVAL;
			break;
		case 'h':
			printf("usage: bertd-worker --job <job.json> --rank <r>\n"
			       "Runs rank r of a bertd training job; started by the daemon with its\n"
			       "socket on fd 3 (docs/formats.md).\n");
			return 1;
		default: return -EINVAL;
		}
	}
	if (*rank < 0 && relay_wanted()) /* a multi-node rank: srun numbered it */
		*rank = relay_rank();
	return *job_path && *rank >= 0 && optind == argc ? 0 : -EINVAL;
}

#define RELAY_GO_TIMEOUT_MS 120000

/* A multi-node rank (docs/multinode.md): the daemon's relay stands in for
 * fd 3; the daemon answers "go" once every rank on every node has joined
 * with the same dataset. */
static int join_relay(worker *w, const char *job_path, char *comm_pick, size_t cap)
{
	char err[512];
	int fd = relay_connect(job_path, w->rank, err, sizeof err);
	if (fd < 0) {
		log_error("%s", err);
		return BERTD_EXIT_PEER_LOST;
	}
	w->ch.fd = fd;
	w->ch.had_daemon = true;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	/* a daemon restart breaks the relay: the rank trains on, keeps what it
	 * says, and redials the relay the next daemon opens again */
	chan_set_redial(&w->ch, relay_redial, (void *)job_path, relay_redial_bound_ms(), getenv("BERTD_ATTEMPT"));
	json_t *go = NULL;
	int rc = worker_await(w, "go", RELAY_GO_TIMEOUT_MS, &go);
	snprintf(comm_pick, cap, "%s", rc == 0 && jstr(go, "comm") ? jstr(go, "comm") : "auto");
	json_decref(go);
	if (rc < 0)
		return worker_fail(w, BERTD_EXIT_PEER_LOST, "the job's ranks did not all join: %s", strerror(-rc));
	return 0;
}

int main(int argc, char **argv)
{
	char name[32] = "bertd-worker";
	log_init(name, LOG_LVL_INFO);
	worker w = {.last_eval_step = -1, .best = best_none()};
	loop_device dev = {0};
	const char *job_path;
	if (argc > 1 && strcmp(argv[1], "--export") == 0) /* a checkpoint into an HF model (convert.h) */
		return convert_main(argc, argv);
	int rc = parse_args(argc, argv, &job_path, &w.rank);
	if (rc == 1)
		return 0;
	if (rc < 0) {
		fprintf(stderr, "usage: bertd-worker --job <job.json> --rank <r>\n");
		return BERTD_EXIT_BAD_CONFIG;
	}
	snprintf(name, sizeof name, "bertd-worker[%d]", w.rank);
	log_init(name, LOG_LVL_INFO);
	signal(SIGPIPE, SIG_IGN);
	int dfd = -1;
	if (fcntl(DAEMON_FD, F_GETFD) >= 0) {
		dfd = DAEMON_FD;
		fcntl(DAEMON_FD, F_SETFL, fcntl(DAEMON_FD, F_GETFL) | O_NONBLOCK);
	}
	/* a local rank of a daemon's job listens for a later daemon to adopt it
	 * (common/chan.h); a multi-node rank redials its relay instead, and
	 * leaves its exit record in the (shared) job directory's ch/ */
	const char *base = dfd >= 0 && !relay_wanted() ? getenv(CHAN_ENV) : NULL;
	char relay_base[1200];
	if (dfd < 0 && relay_wanted()) {
		const char *slash = strrchr(job_path, '/');
		int dl = slash ? (int)(slash - job_path) : 1;
		snprintf(relay_base, sizeof relay_base, "%.*s/ch/rank-%d", dl, slash ? job_path : ".", w.rank);
		base = relay_base;
	}
	if (chan_open(&w.ch, dfd, base, !relay_wanted(), "worker", w.rank) < 0)
		log_warn("cannot listen on %s.sock: a daemon restart will not adopt this rank", base ? base : "?");

	const char *kind = NULL;
	bool on_gpu = false;
	train_config tc;
	char comm_pick[16] = ""; /* the daemon's choice of data plane, in "go" */
	int code = dfd < 0 && relay_wanted() ? join_relay(&w, job_path, comm_pick, sizeof comm_pick) : 0;
	if (code == 0)
		code = open_job(&w, job_path, &kind, &on_gpu);
	if (code == 0)
		code = open_batches(&w, argv[0], job_path);
	if (code == 0)
		report_data(&w);
	if (code == 0)
		code = make_trainer(&w, on_gpu, &tc);
	/* the host trainer made (or loaded) the weights; a GPU takes them */
#ifdef BERTD_CUDA
	if (code == 0 && on_gpu)
		code = device_gpu_create(&w, &dev);
#endif
	if (code == 0 && !on_gpu)
		code = device_cpu_create(&w, &dev);
	if (code == 0 && w.world > 1)
		code = join_ranks(&w, comm_pick);
	if (code == 0) {
		log_info("rank %d/%d on %s: %d layers, hidden %d, vocab %d, batch %u x %u, accumulation %d, from step %ld",
			 w.rank, w.world, kind, tc.model.num_hidden_layers, tc.model.hidden_size, tc.model.vocab_size,
			 w.bj.ring.layout.B, w.bj.ring.layout.T, w.bj.spec.training.gradient_accumulation_steps,
			 w.tr->step);
		code = loop_run(&w, &dev);
		if (code == BERTD_EXIT_PEER_LOST && w.cm)
			comm_abort(w.cm, -EPIPE);
	}
	if (dev.destroy)
		dev.destroy(dev.ctx, code);
	comm_destroy(w.cm);
	trainer_destroy(w.tr);
	eval_set_destroy(w.eval);
	if (w.rg)
		ring_detach(w.rg);
	nodeloaders_stop(&w.nl);
	free(w.local_slot);
	free(w.mlm_pos);
	free(w.mlm_lab);
	free(w.win_ph);
	batchjob_data_close(&w.data);
	if (relay_wanted()) /* the relay's EOF after this is an exit, not a lost rank */
		worker_send(&w, json_pack("{s:s, s:i}", "type", "bye", "code", code));
	chan_close(&w.ch, code);
	json_decref(w.job);
	return code;
}
