/* bertd-loader — one batch-producing process of a job: maps the dataset,
 * opens the job's ring segment, and loops claim -> build -> publish until
 * the job ends (ring shutdown), its parent dies, or it is told to stop.
 *
 * Single-threaded, no GPU, no SQLite. Batches are pure functions of their
 * number (mlm.h), so any number of these can run side by side and any of them
 * may be killed: the consumer has the lost batch rebuilt (ring.h).
 *
 * Two ways to run it:
 *   --job job.json [--index i --count L]   as the daemon starts it
 *       (docs/formats.md): dataset, MLM options and ring geometry
 *       come from the job file (batchjob.h); the segment is created or
 *       attached (ring_open), so loaders and workers may start in any order.
 *   --ring NAME (--dataset DIR | --raw DIR...) [MLM options]   by hand or
 *       from a benchmark: the segment must exist; T and the batch geometry
 *       come from it.
 *   --job job.json --write-batch N --out FILE   writes global batch N of
 *       the job (the slot its ring would carry) to FILE and exits, without
 *       a ring: how a test or a user sees exactly what a step trained on.
 *
 * Exit codes are common/exitcodes.h's: 0 job ended / SIGTERM / parent gone,
 * 1 internal (retryable), 2 bad configuration, 5 data error. On a non-zero
 * exit under the daemon it first sends {"type":"error"} on fd 3.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/exitcodes.h"
#include "common/chan.h"
#include "common/log.h"
#include "common/msg.h"
#include "loader/batchjob.h"
#include "loader/mlm.h"
#include "loader/rawcorpus.h"
#include "loader/ring.h"
#include "loader/shard.h"

#define MAX_RAW 64

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

typedef struct build_ctx {
	const mlm_dataset *ds;
	const ring_params *p;
	const batchjob *bj; /* NULL in --raw mode */
	const batchjob_data *data; /* the job's datasets (a mixture's too); NULL in --raw mode */
} build_ctx;

static int build(void *ctx, uint64_t global, void *slot)
{
	build_ctx *b = ctx;
	if (b->bj)
		batchjob_simulated_delay(b->bj);
	if (b->data)
		return batchjob_batch_build(b->data, &b->p->layout, ring_world(b->p), b->p->M, global, slot);
	return mlm_batch_build(b->ds, &b->p->layout, ring_world(b->p), b->p->M, global, slot);
}

/* --write-batch: builds global batch n of the job as its ring would carry
 * it and writes that slot to path (docs/formats.md "Batch slots"). */
static int write_batch(const mlm_dataset *ds, const batchjob *bj, uint64_t n, const char *path)
{
	const ring_params *p = &bj->ring;
	void *slot = NULL;
	int status = BERTD_EXIT_OK;
	if (posix_memalign(&slot, BATCH_ALIGN, p->layout.slot_bytes) != 0) {
		log_error("out of memory for a %u-byte slot", p->layout.slot_bytes);
		return BERTD_EXIT_FAILURE;
	}
	int rc = mlm_batch_build(ds, &p->layout, ring_world(p), p->M, n, slot);
	if (rc) {
		log_error("cannot build batch %llu: %s", (unsigned long long)n, strerror(-rc));
		status = rc == -EINVAL ? BERTD_EXIT_BAD_CONFIG : BERTD_EXIT_DATA;
		goto out;
	}
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(slot, 1, p->layout.slot_bytes, f) != p->layout.slot_bytes || fflush(f) != 0) {
		log_error("cannot write %s: %s", path, strerror(errno));
		status = BERTD_EXIT_FAILURE;
	}
	if (f && fclose(f) != 0 && status == BERTD_EXIT_OK) {
		log_error("cannot write %s: %s", path, strerror(errno));
		status = BERTD_EXIT_FAILURE;
	}
out:
	free(slot);
	return status;
}

/* Tells the daemon why we fail, when fd 3 is its socket. */
static void report_error(const char *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report_error(const char *code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_error("%s", msg);
	struct stat st;
	if (fstat(3, &st) != 0 || !S_ISSOCK(st.st_mode))
		return;
	json_t *m = json_pack("{s:s, s:s, s:s}", "type", "error", "code", code, "message", msg);
	if (m) {
		msg_send(3, m);
		json_decref(m);
	}
}

static void usage(FILE *to)
{
	fprintf(to,
		"usage: bertd-loader --job FILE [--index I --count L]\n"
		"       bertd-loader --ring NAME (--dataset DIR | --raw DIR [--raw DIR ...]) [options]\n"
		"  --job FILE              job file written by the daemon (job.json)\n"
		"  --ring NAME             existing ring segment (e.g. /bertd-<job id>)\n"
		"  --dataset DIR           prepared dataset (manifest.json + shards)\n"
		"  --raw DIR               pre-tokenized rawcorpus directory, one per shard\n"
		"  --seed N (42)  --max-pred N  --mlm-probability F (0.15)  --mask-replace-prob F (0.8)\n"
		"  --random-replace-prob F (0.1)  --short-seq-prob F (0.1)  --nsp\n"
		"  --whole-word-mask       needs --vocab with --raw (## pieces continue a word)\n"
		"  --vocab FILE            vocab.txt for --raw\n"
		"  --log-level L           error|warn|info|debug\n"
		"       bertd-loader --job FILE --write-batch N --out PATH\n"
		"  --write-batch N         write global batch N (step s, micro k, rank r of G:\n"
		"                          N = (s*M + k)*G + r) as one batch slot to PATH, then exit\n");
}

typedef struct opts {
	const char *job, *ring, *dataset, *vocab, *out;
	long long write_batch; /* -1: run as a producer */
	const char *raw[MAX_RAW];
	int n_raw, have_pred;
	mlm_config cfg;
} opts;

static int parse(int argc, char **argv, opts *o)
{
	static const struct option lo[] = {
		{"job", required_argument, 0, 'j'},      {"index", required_argument, 0, 'i'},
		{"count", required_argument, 0, 'c'},    {"ring", required_argument, 0, 'r'},
		{"dataset", required_argument, 0, 'D'},  {"raw", required_argument, 0, 'd'},
		{"seed", required_argument, 0, 's'},     {"max-pred", required_argument, 0, 'p'},
		{"mlm-probability", required_argument, 0, 1}, {"mask-replace-prob", required_argument, 0, 2},
		{"random-replace-prob", required_argument, 0, 3}, {"short-seq-prob", required_argument, 0, 4},
		{"nsp", no_argument, 0, 5},              {"whole-word-mask", no_argument, 0, 6},
		{"vocab", required_argument, 0, 7},      {"log-level", required_argument, 0, 8},
		{"write-batch", required_argument, 0, 9}, {"out", required_argument, 0, 10},
		{"help", no_argument, 0, 'h'},           {0, 0, 0, 0},
	};
	mlm_config_defaults(&o->cfg, 128);
	o->write_batch = -1;
	int c;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		char *end = NULL;
		switch (c) {
		case 'j': o->job = optarg; break;
		case 'i': case 'c': strtol(optarg, &end, 10); break; /* informational */
		case 'r': o->ring = optarg; break;
		case 'D': o->dataset = optarg; break;
		case 'd':
			if (o->n_raw == MAX_RAW) {
				log_error("at most %d --raw shards", MAX_RAW);
				return -1;
			}
			o->raw[o->n_raw++] = optarg;
			break;
		case 's': o->cfg.seed = strtoull(optarg, &end, 10); break;
		case 'p': o->cfg.max_pred = (uint32_t)strtoul(optarg, &end, 10); o->have_pred = 1; break;
		case 1: o->cfg.mlm_probability = strtof(optarg, &end); break;
		case 2: o->cfg.mask_replace_prob = strtof(optarg, &end); break;
		case 3: o->cfg.random_replace_prob = strtof(optarg, &end); break;
		case 4: o->cfg.short_seq_prob = strtof(optarg, &end); break;
		case 5: o->cfg.nsp = 1; break;
		case 6: o->cfg.whole_word_mask = 1; break;
		case 7: o->vocab = optarg; break;
		case 8: {
			enum log_level lvl;
			if (log_level_parse(optarg, &lvl)) {
				log_error("bad --log-level %s", optarg);
				return -1;
			}
			log_set_level(lvl);
			break;
		}
		case 9:
			o->write_batch = strtoll(optarg, &end, 10);
			if (o->write_batch < 0)
				end = optarg; /* refused below as a bad number */
			break;
		case 10: o->out = optarg; break;
		case 'h': usage(stdout); exit(0);
		default: return -1;
		}
		if (end && (*end || end == optarg)) {
			log_error("bad number '%s'", optarg);
			return -1;
		}
	}
	int manual = o->ring && ((o->dataset != NULL) != (o->n_raw > 0));
	int dump_ok = (o->write_batch >= 0) == (o->out != NULL) && (o->write_batch < 0 || o->job);
	if (optind != argc || (o->job != NULL) == (o->ring != NULL) || (o->ring && !manual) || !dump_ok) {
		usage(stderr);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	pid_t parent = getppid(); /* first thing: compared after prctl below */
	log_init("bertd-loader", LOG_LVL_INFO);
	opts o = {0};
	if (parse(argc, argv, &o) != 0)
		return BERTD_EXIT_BAD_CONFIG;

	/* A loader of a daemon's job (BERTD_CHANNEL set) outlives the daemon,
	 * as its workers do, and leaves an exit record for a daemon that was
	 * not there to see it end (common/chan.h). Otherwise it dies with the
	 * process that spawned it; comparing getppid with its value at start
	 * closes the window where it died before prctl (not "ppid == 1": the
	 * daemon may itself be PID 1 in a container). SIGTERM (not KILL) so an
	 * unfinished claim is handed back. */
	const char *chan_base = getenv(CHAN_ENV);
	chan ch;
	chan_open(&ch, -1, chan_base, false, "loader", 0);
	signal(SIGPIPE, SIG_IGN); /* a report to a daemon that is gone is EPIPE, not death */
	if (!chan_base && (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)) {
		log_error("parent is gone; not starting");
		return BERTD_EXIT_OK;
	}
	struct sigaction sa = {.sa_handler = on_signal}; /* no SA_RESTART: futex waits return */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);

	int status = BERTD_EXIT_OK, rc;
	ring *r = NULL;
	batchjob bj;
	batchjob_data data = {0};
	rawcorpus raws[MAX_RAW];
	corpus_view views[MAX_RAW];
	int n_raw_open = 0;
	shard_dataset *sd = NULL;
	uint8_t *bits = NULL;
	mlm_dataset *manual_ds = NULL;
	const mlm_dataset *ds;

	if (o.job) {
		rc = batchjob_load(o.job, &bj);
		if (rc == 0)
			rc = batchjob_ring_from_env(&bj);
		if (rc) {
			report_error("bad_config", "cannot use job file %s: %s", o.job, strerror(-rc));
			status = BERTD_EXIT_BAD_CONFIG;
			goto out;
		}
		rc = batchjob_data_open(&bj, &data);
		if (rc) {
			report_error(rc == -EINVAL ? "bad_config" : "data", "dataset %s unusable: %s",
				     bj.dataset_dir, strerror(-rc));
			status = rc == -EINVAL ? BERTD_EXIT_BAD_CONFIG : BERTD_EXIT_DATA;
			goto out;
		}
		ds = data.ds;
		if (o.write_batch >= 0) {
			status = write_batch(ds, &bj, (uint64_t)o.write_batch, o.out);
			goto out;
		}
		rc = ring_open(&r, bj.shm_name, &bj.ring);
		if (rc) {
			report_error(rc == -ESTALE ? "bad_config" : "internal", "cannot open ring %s: %s",
				     bj.shm_name, strerror(-rc));
			status = rc == -ESTALE ? BERTD_EXIT_BAD_CONFIG : BERTD_EXIT_FAILURE;
			goto out;
		}
	} else {
		rc = ring_attach(&r, o.ring);
		if (rc) {
			report_error("bad_config", "cannot attach ring %s: %s", o.ring, strerror(-rc));
			status = BERTD_EXIT_BAD_CONFIG;
			goto out;
		}
		const ring_params *p = ring_get_params(r);
		o.cfg.max_seq_len = p->layout.T;
		if (!o.have_pred)
			o.cfg.max_pred = p->layout.P;
		if (o.cfg.max_pred != p->layout.P) {
			report_error("bad_config", "--max-pred %u disagrees with the ring's slots (P=%u)",
				     o.cfg.max_pred, p->layout.P);
			status = BERTD_EXIT_BAD_CONFIG;
			goto out;
		}
		const corpus_view *vs = views;
		uint32_t nv = 0;
		const char *vocab = o.vocab;
		if (o.dataset) {
			rc = shard_dataset_open(o.dataset, &sd);
			if (rc) {
				report_error("data", "dataset %s unusable: %s", o.dataset, strerror(-rc));
				status = BERTD_EXIT_DATA;
				goto out;
			}
			vs = sd->views;
			nv = (uint32_t)sd->n_shards;
			if (!vocab)
				vocab = sd->vocab_path;
		} else {
			for (; n_raw_open < o.n_raw; n_raw_open++) {
				rc = rawcorpus_open(&raws[n_raw_open], o.raw[n_raw_open]);
				if (rc) {
					report_error("data", "%s unusable: %s", o.raw[n_raw_open], strerror(-rc));
					status = BERTD_EXIT_DATA;
					goto out;
				}
				views[n_raw_open] = raws[n_raw_open].view;
			}
			nv = (uint32_t)o.n_raw;
		}
		if (o.cfg.whole_word_mask) {
			bits = vocab ? batchjob_continuation_bitmap(vocab, vs[0].vocab_size) : NULL;
			if (!bits) {
				report_error("bad_config", "--whole-word-mask needs a readable vocab (--vocab)");
				status = BERTD_EXIT_BAD_CONFIG;
				goto out;
			}
			o.cfg.is_continuation = bits;
		}
		if (p->job_tag != 0 && p->job_tag != mlm_config_digest(&o.cfg)) {
			report_error("bad_config", "MLM options disagree with the job that made ring %s", o.ring);
			status = BERTD_EXIT_BAD_CONFIG;
			goto out;
		}
		rc = mlm_dataset_create(&manual_ds, vs, nv, &o.cfg);
		if (rc) {
			status = rc == -EINVAL ? BERTD_EXIT_BAD_CONFIG : BERTD_EXIT_DATA;
			report_error(rc == -EINVAL ? "bad_config" : "data", "cannot index the dataset: %s",
				     strerror(-rc));
			goto out;
		}
		ds = manual_ds;
		mlm_stats st;
		mlm_dataset_stats(ds, &st);
		if (st.n_samples < p->layout.B) {
			report_error("data", "dataset has %llu sequences, fewer than one batch of %u",
				     (unsigned long long)st.n_samples, p->layout.B);
			status = BERTD_EXIT_DATA;
			goto out;
		}
	}
	mlm_stats st;
	mlm_dataset_stats(ds, &st);
	log_info("%llu sequences/epoch, pad fraction %.3f, %llu empty documents skipped, index %.1f MiB, "
		 "%llu of %llu tokens dropped in each epoch%s",
		 (unsigned long long)st.n_samples, st.pad_fraction, (unsigned long long)st.n_empty_docs,
		 (double)st.index_bytes / 1048576.0, (unsigned long long)st.n_tokens_truncated,
		 (unsigned long long)st.n_tokens_corpus,
		 st.n_tokens_truncated ? " (mlm.drop_long_sentences)" : "");
	build_ctx bc = {.ds = ds, .p = ring_get_params(r), .bj = o.job ? &bj : NULL,
			.data = o.job ? &data : NULL};
	rc = ring_produce(r, build, &bc, &g_stop);
	if (rc == -EINTR) {
		log_info("stopping on signal");
	} else if (rc == -EAGAIN) {
		report_error("internal", "ring has no free producer entry");
		status = BERTD_EXIT_FAILURE;
	} else if (rc == -EBADMSG || rc == -ENODATA) {
		report_error("data", "cannot build batches: %s", strerror(-rc));
		status = BERTD_EXIT_DATA;
	} else if (rc) {
		report_error("internal", "loader stopped: %s", strerror(-rc));
		status = BERTD_EXIT_FAILURE;
	}
out:
	ring_detach(r);
	mlm_dataset_destroy(manual_ds);
	free(bits);
	for (int i = 0; i < n_raw_open; i++)
		rawcorpus_close(&raws[i]);
	if (sd)
		shard_dataset_close(sd);
	if (o.job)
		batchjob_data_close(&data);
	chan_close(&ch, status);
	return status;
}
