/* bertd-loader — one batch-producing process of a job: maps the dataset,
 * attaches the job's ring segment, and loops claim -> build -> publish until
 * the job ends (ring shutdown), its parent dies, or it is told to stop.
 *
 * Single-threaded, no GPU, no SQLite. Batches are pure functions of their
 * number (mlm.h), so any number of these can run side by side and any of them
 * may be killed: the consumer has the lost batch rebuilt (ring.h).
 *
 * Exit codes (also in docs/formats-batch.md):
 *   0  job ended, or SIGTERM/SIGINT/parent death handled
 *   2  usage error
 *   3  dataset missing or invalid
 *   4  ring segment missing, or its geometry/config disagrees with ours
 *   5  a batch could not be built (reported to the workers through the ring)
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/log.h"
#include "loader/mlm.h"
#include "loader/rawcorpus.h"
#include "loader/ring.h"

enum { EXIT_USAGE = 2, EXIT_DATASET = 3, EXIT_RING = 4, EXIT_BUILD = 5 };

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

typedef struct build_ctx {
	const mlm_dataset *ds;
	const ring_params *p;
} build_ctx;

static int build(void *ctx, uint64_t global, void *slot)
{
	build_ctx *b = ctx;
	return mlm_batch_build(b->ds, &b->p->layout, b->p->G, b->p->M, global, slot);
}

/* Bit v set when line v of vocab.txt starts with "##" (a continuation piece).
 * Caller frees. */
static uint8_t *continuation_bitmap(const char *vocab_path, uint32_t vocab_size)
{
	FILE *f = fopen(vocab_path, "re");
	if (!f) {
		log_error("cannot open vocab %s: %s", vocab_path, strerror(errno));
		return NULL;
	}
	uint8_t *bits = calloc(vocab_size / 8 + 1, 1);
	char line[1024];
	uint32_t id = 0;
	while (bits && fgets(line, sizeof(line), f) && id < vocab_size) {
		if (line[0] == '#' && line[1] == '#')
			bits[id >> 3] |= (uint8_t)(1u << (id & 7));
		id++;
	}
	fclose(f);
	return bits;
}

static void usage(FILE *to)
{
	fprintf(to,
		"usage: bertd-loader --ring NAME --raw DIR [options]\n"
		"  --ring NAME             job ring segment (shm name, e.g. /bertd-job-<id>)\n"
		"  --raw DIR               pre-tokenized corpus (rawcorpus.h), repeatable: one per shard\n"
		"  --seed N                (42)\n"
		"  --max-pred N            max_predictions_per_seq (default ceil(T*5/32))\n"
		"  --mlm-probability F     (0.15)   --mask-replace-prob F (0.8)\n"
		"  --random-replace-prob F (0.1)    --short-seq-prob F (0.1)\n"
		"  --nsp                   BERT sentence pairs + NSP labels\n"
		"  --whole-word-mask       needs --vocab (## pieces continue a word)\n"
		"  --vocab FILE            vocab.txt of the dataset\n"
		"  --log-level L           error|warn|info|debug\n"
		"max_seq_length and the batch geometry come from the ring segment.\n");
}

int main(int argc, char **argv)
{
	log_init("bertd-loader", LOG_LVL_INFO);
	const char *ring_name = NULL, *vocab = NULL;
	const char *raw[64];
	int n_raw = 0;
	mlm_config cfg;
	mlm_config_defaults(&cfg, 128);
	int have_pred = 0;
	static const struct option opts[] = {
		{"ring", required_argument, 0, 'r'},     {"raw", required_argument, 0, 'd'},
		{"seed", required_argument, 0, 's'},     {"max-pred", required_argument, 0, 'p'},
		{"mlm-probability", required_argument, 0, 1}, {"mask-replace-prob", required_argument, 0, 2},
		{"random-replace-prob", required_argument, 0, 3}, {"short-seq-prob", required_argument, 0, 4},
		{"nsp", no_argument, 0, 5},              {"whole-word-mask", no_argument, 0, 6},
		{"vocab", required_argument, 0, 7},      {"log-level", required_argument, 0, 8},
		{"help", no_argument, 0, 'h'},           {0, 0, 0, 0},
	};
	int c;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		char *end = NULL;
		switch (c) {
		case 'r': ring_name = optarg; break;
		case 'd':
			if (n_raw == 64) {
				log_error("at most 64 --raw shards");
				return EXIT_USAGE;
			}
			raw[n_raw++] = optarg;
			break;
		case 's': cfg.seed = strtoull(optarg, &end, 10); break;
		case 'p': cfg.max_pred = (uint32_t)strtoul(optarg, &end, 10); have_pred = 1; break;
		case 1: cfg.mlm_probability = strtof(optarg, &end); break;
		case 2: cfg.mask_replace_prob = strtof(optarg, &end); break;
		case 3: cfg.random_replace_prob = strtof(optarg, &end); break;
		case 4: cfg.short_seq_prob = strtof(optarg, &end); break;
		case 5: cfg.nsp = 1; break;
		case 6: cfg.whole_word_mask = 1; break;
		case 7: vocab = optarg; break;
		case 8: {
			enum log_level lvl;
			if (log_level_parse(optarg, &lvl)) {
				log_error("bad --log-level %s", optarg);
				return EXIT_USAGE;
			}
			log_set_level(lvl);
			break;
		}
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return EXIT_USAGE;
		}
		if (end && *end) {
			log_error("bad number '%s'", optarg);
			return EXIT_USAGE;
		}
	}
	if (!ring_name || n_raw == 0 || optind != argc) {
		usage(stderr);
		return EXIT_USAGE;
	}

	/* Die with the process that spawned us (daemon or worker); the
	 * getppid check closes the window where it died before prctl. */
	if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() == 1) {
		log_error("parent is gone; not starting");
		return 0;
	}
	struct sigaction sa = {.sa_handler = on_signal}; /* no SA_RESTART: futex waits return */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);

	int status = 0;
	ring *r = NULL;
	mlm_dataset *ds = NULL;
	uint8_t *bits = NULL;
	rawcorpus shards[64];
	corpus_view views[64];
	int opened = 0;
	int rc = ring_attach(&r, ring_name);
	if (rc) {
		log_error("cannot attach ring %s: %s", ring_name, strerror(-rc));
		status = EXIT_RING;
		goto out;
	}
	const ring_params *p = ring_get_params(r);
	cfg.max_seq_len = p->layout.T;
	if (!have_pred)
		cfg.max_pred = p->layout.P;
	if (cfg.max_pred != p->layout.P) {
		log_error("--max-pred %u disagrees with the ring's slots (P=%u)", cfg.max_pred, p->layout.P);
		status = EXIT_RING;
		goto out;
	}
	for (; opened < n_raw; opened++) {
		rc = rawcorpus_open(&shards[opened], raw[opened]);
		if (rc) {
			status = EXIT_DATASET;
			goto out;
		}
		views[opened] = shards[opened].view;
	}
	if (cfg.whole_word_mask) {
		if (!vocab) {
			log_error("--whole-word-mask needs --vocab");
			status = EXIT_USAGE;
			goto out;
		}
		bits = continuation_bitmap(vocab, views[0].vocab_size);
		if (!bits) {
			status = EXIT_DATASET;
			goto out;
		}
		cfg.is_continuation = bits;
	}
	if (p->job_tag != 0 && p->job_tag != mlm_config_digest(&cfg)) {
		log_error("MLM options disagree with the job that made ring %s", ring_name);
		status = EXIT_RING;
		goto out;
	}
	rc = mlm_dataset_create(&ds, views, (uint32_t)n_raw, &cfg);
	if (rc) {
		status = rc == -EINVAL ? EXIT_USAGE : EXIT_DATASET;
		goto out;
	}
	mlm_stats st;
	mlm_dataset_stats(ds, &st);
	if (st.n_samples < p->layout.B) {
		log_error("dataset has %llu sequences, fewer than one batch of %u",
			  (unsigned long long)st.n_samples, p->layout.B);
		status = EXIT_DATASET;
		goto out;
	}
	log_info("%llu sequences/epoch, pad fraction %.3f, %llu empty documents skipped",
		 (unsigned long long)st.n_samples, st.pad_fraction, (unsigned long long)st.n_empty_docs);
	build_ctx bc = {.ds = ds, .p = p};
	rc = ring_produce(r, build, &bc, &g_stop);
	if (rc == -EINTR)
		log_info("stopping on signal");
	else if (rc == -EAGAIN)
		status = EXIT_RING, log_error("ring %s has no free producer entry", ring_name);
	else if (rc)
		status = EXIT_BUILD;
out:
	mlm_dataset_destroy(ds);
	free(bits);
	for (int i = 0; i < opened; i++)
		rawcorpus_close(&shards[i]);
	ring_detach(r);
	return status;
}
