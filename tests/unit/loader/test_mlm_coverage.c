/* mlm on a real paragraph-per-line corpus: every token of the corpus is in
 * the batches of one epoch.
 *
 * The corpus is /usr/share/common-licenses rewritten as PubMed abstracts
 * or Wikipedia extracts are laid out: one long line per paragraph group
 * (about 300 tokens and more, some lines above 510), no blank lines, so each
 * file is one document of long "sentences". bertd-prepare's library makes
 * the dataset with Google's bert-base-uncased vocab; the test then builds
 * every batch of epoch 0 with mlm_batch_build (what a loader writes into a
 * ring slot), undoes the masking from each slot's own labels and positions,
 * and compares the multiset of token ids with the corpus shards': at
 * max_seq_length 128 and 512, full sentences and NSP (NSP's random-next
 * segments B, copies from elsewhere, not counted), at least 99.9% must be
 * there. With mlm.drop_long_sentences the missing tokens must be exactly the
 * ones the index says it dropped, and at 128 they are far above 0.1%, which
 * is what the default packing is measured against.
 */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/fsutil.h"
#include "loader/batch.h"
#include "loader/mlm.h"
#include "loader/prepare.h"
#include "loader/shard.h"

#define LICENSES "/usr/share/common-licenses"

static char tmp[256];
static shard_dataset *g_ds;
static prepare_summary g_sum;

/* Rewrites one license file as lines of at least 1500 bytes: its
 * paragraphs (blank-line separated) joined with spaces, several to a line. */
static int write_long_lines(const char *src, FILE *out)
{
	FILE *in = fopen(src, "r");
	if (!in)
		return -errno;
	char line[4096];
	size_t cur = 0;
	while (fgets(line, sizeof line, in)) {
		size_t n = strcspn(line, "\r\n");
		line[n] = 0;
		size_t b = 0;
		while (line[b] == ' ' || line[b] == '\t')
			b++;
		if (line[b] == 0) { /* paragraph end: end the line once it is long */
			if (cur >= 1500) {
				fputc('\n', out);
				cur = 0;
			}
			continue;
		}
		if (cur)
			fputc(' ', out);
		fputs(line + b, out);
		cur += n - b + 1;
	}
	if (cur)
		fputc('\n', out);
	fclose(in);
	return 0;
}

static int setup(void **state)
{
	(void)state;
	const char *base = getenv("TMPDIR");
	snprintf(tmp, sizeof tmp, "%s/bertd-test-coverage-XXXXXX", base && base[0] ? base : "/tmp");
	if (!mkdtemp(tmp))
		return -1;
	char dir[512], p[1024], q[1024];
	snprintf(dir, sizeof dir, "%s/corpus", tmp);
	mkdir(dir, 0755);
	DIR *d = opendir(LICENSES);
	if (!d)
		return -1;
	struct dirent *e;
	int files = 0;
	while ((e = readdir(d))) {
		struct stat st;
		snprintf(p, sizeof p, "%s/%s", LICENSES, e->d_name);
		if (e->d_name[0] == '.' || lstat(p, &st) != 0 || !S_ISREG(st.st_mode))
			continue; /* the GPL -> GPL-3 links would repeat a file */
		snprintf(q, sizeof q, "%s/%s.txt", dir, e->d_name);
		FILE *out = fopen(q, "w");
		if (!out || write_long_lines(p, out) != 0)
			return -1;
		fclose(out);
		files++;
	}
	closedir(d);
	const char *data = getenv("BERTD_TEST_DATA");
	char vocab[512], outdir[512], msg[512];
	snprintf(vocab, sizeof vocab, "%s/bert-base-uncased-vocab.txt", data ? data : "tests/data");
	snprintf(outdir, sizeof outdir, "%s/ds", tmp);
	const char *in[1] = {dir};
	prepare_opts o = {.inputs = in, .n_inputs = 1, .out_dir = outdir, .vocab_path = vocab,
			  .lowercase = -1, .max_sentence_tokens = 510, .threads = 1, .progress_fd = -1};
	enum prepare_error err;
	if (prepare_run(&o, &g_sum, &err, msg, sizeof msg) < 0) {
		fprintf(stderr, "prepare: %s\n", msg);
		return -1;
	}
	fprintf(stderr, "corpus: %d files, %llu documents, %llu sentences (%llu lines over 126 tokens, %llu over "
			"510, the longest %llu), %llu tokens\n",
		files, (unsigned long long)g_sum.documents, (unsigned long long)g_sum.sentences,
		(unsigned long long)g_sum.sentences_over_126, (unsigned long long)g_sum.sentences_over_510,
		(unsigned long long)g_sum.longest_sentence, (unsigned long long)g_sum.tokens);
	return shard_dataset_open(outdir, &g_ds) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	if (g_ds)
		shard_dataset_close(g_ds);
	fs_remove_tree(tmp);
	return 0;
}

/* Token ids of the corpus shards, counted per id: (vocab_size,) */
static uint64_t *corpus_counts(uint64_t *total)
{
	uint32_t V = g_ds->views[0].vocab_size;
	uint64_t *n = calloc(V, sizeof *n);
	*total = 0;
	for (size_t k = 0; k < g_ds->n_shards; k++) {
		const corpus_view *c = &g_ds->views[k];
		for (uint64_t i = 0; i < c->n_tokens; i++)
			n[corpus_token(c, i)]++;
		*total += c->n_tokens;
	}
	return n;
}

typedef struct coverage {
	uint64_t corpus, covered, samples, dropped_by_index;
} coverage;

/* Builds every batch of epoch 0 and counts the corpus tokens they hold. */
static coverage epoch_coverage(uint32_t T, int nsp, int drop)
{
	coverage cv = {0};
	mlm_config cfg;
	mlm_config_defaults(&cfg, T);
	cfg.nsp = nsp;
	cfg.drop_long_sentences = drop;
	cfg.seed = 7;
	mlm_dataset *ds = NULL;
	assert_int_equal(mlm_dataset_create(&ds, g_ds->views, (uint32_t)g_ds->n_shards, &cfg), 0);
	mlm_stats st;
	mlm_dataset_stats(ds, &st);
	cv.samples = st.n_samples;
	cv.dropped_by_index = st.n_tokens_truncated;
	const uint32_t B = 8, V = g_ds->views[0].vocab_size;
	const corpus_special *sp = &g_ds->views[0].special;
	batch_layout l;
	assert_int_equal(batch_layout_init(&l, B, T, cfg.max_pred), 0);
	uint8_t *slot = aligned_alloc(BATCH_ALIGN, l.slot_bytes);
	uint64_t *want = corpus_counts(&cv.corpus), *got = calloc(V, sizeof *got);
	int32_t *orig = malloc(sizeof(int32_t) * T);
	assert_non_null(slot);
	for (uint64_t n = 0; n * B < st.n_samples; n++) {
		assert_int_equal(mlm_batch_build(ds, &l, 1, 1, n, slot), 0);
		const int32_t *ids = (const int32_t *)(slot + l.off_input_ids);       /* (B, T) */
		const int32_t *tt = (const int32_t *)(slot + l.off_token_type_ids);   /* (B, T) */
		const int32_t *lens = (const int32_t *)(slot + l.off_seq_lens);       /* (B,) */
		const int32_t *pos = (const int32_t *)(slot + l.off_mlm_positions);   /* (B, P) */
		const int32_t *lab = (const int32_t *)(slot + l.off_mlm_labels);      /* (B, P) */
		const int32_t *nspl = (const int32_t *)(slot + l.off_nsp_labels);     /* (B,) */
		const int32_t *npred = (const int32_t *)(slot + l.off_n_pred);        /* (B,) */
		for (uint32_t j = 0; j < B && n * B + j < st.n_samples; j++) {
			/* unmask: the labels are the original ids at their positions */
			memcpy(orig, ids + (size_t)j * T, sizeof(int32_t) * T);
			for (int32_t k = 0; k < npred[j]; k++)
				orig[pos[(size_t)j * l.P + k]] = lab[(size_t)j * l.P + k];
			for (int32_t i = 0; i < lens[j]; i++) {
				uint32_t t = (uint32_t)orig[i];
				if (t == sp->cls || t == sp->sep || t == sp->pad)
					continue; /* never corpus tokens: "[SEP]" in text is [ sep ] */
				if (nsp && nspl[j] == 1 && tt[(size_t)j * T + i] == 1)
					continue; /* random next: a copy of another document's text */
				assert_true(t < V);
				got[t]++;
			}
		}
	}
	for (uint32_t v = 0; v < V; v++)
		cv.covered += got[v] < want[v] ? got[v] : want[v];
	print_message("T=%u nsp=%d drop_long_sentences=%d: %llu sequences, %llu of %llu corpus tokens in the "
		      "batches of epoch 0 (%.4f%%), index says %llu dropped\n",
		      T, nsp, drop, (unsigned long long)cv.samples, (unsigned long long)cv.covered,
		      (unsigned long long)cv.corpus, 100.0 * (double)cv.covered / (double)cv.corpus,
		      (unsigned long long)cv.dropped_by_index);
	free(orig);
	free(want);
	free(got);
	free(slot);
	mlm_dataset_destroy(ds);
	return cv;
}

/* The corpus is what the test means it to be: long lines, one document a
 * file, every token in a shard. */
static void test_corpus_is_paragraph_per_line(void **state)
{
	(void)state;
	assert_true(g_sum.sentences_over_126 * 2 > g_sum.sentences); /* most lines */
	assert_true(g_sum.sentences_over_510 > 0);
	assert_true(g_sum.longest_sentence > 510);
	uint64_t total;
	free(corpus_counts(&total));
	assert_int_equal(total, g_sum.tokens);
}

static void check_all_tokens(uint32_t T, int nsp)
{
	coverage cv = epoch_coverage(T, nsp, 0);
	assert_int_equal(cv.dropped_by_index, 0);
	assert_true((double)cv.covered >= 0.999 * (double)cv.corpus);
	/* the old packing on the same corpus: what it loses is what it says */
	coverage old = epoch_coverage(T, nsp, 1);
	assert_int_equal(old.corpus - old.covered, old.dropped_by_index);
	if (T == 128)
		assert_true((double)old.covered < 0.9 * (double)old.corpus);
}

static void test_full_sentences_128(void **state)
{
	(void)state;
	check_all_tokens(128, 0);
}

static void test_full_sentences_512(void **state)
{
	(void)state;
	check_all_tokens(512, 0);
}

static void test_nsp_128(void **state)
{
	(void)state;
	check_all_tokens(128, 1);
}

static void test_nsp_512(void **state)
{
	(void)state;
	check_all_tokens(512, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_corpus_is_paragraph_per_line),
		cmocka_unit_test(test_full_sentences_128),
		cmocka_unit_test(test_full_sentences_512),
		cmocka_unit_test(test_nsp_128),
		cmocka_unit_test(test_nsp_512),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
