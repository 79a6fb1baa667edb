/* No token silently lost: a corpus laid out one long paragraph per line
 * (common-licenses text joined into lines of 1500 bytes and more, no blank
 * lines, as PubMed abstracts come), through the daemon:
 *   - the dataset's stats say how long its lines are: longest_sentence,
 *     sentences_over_126, sentences_over_510, counted by bertd-prepare;
 *   - a default job trains on every token: its data says
 *     tokens_dropped 0 and tokens_per_epoch = corpus_tokens = the dataset's
 *     tokens, and it has no warning event;
 *   - the same job with mlm.drop_long_sentences (the old packing) says what
 *     it drops (over 1% here: most of each line at max_seq_length 32),
 *     dropped.long_sentences the same number, and gets the warning event.
 * The token counts themselves are checked against the batches in the unit
 * test loader_mlm_coverage. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "harness.h"
#include "it_util.h"
#include "../testdata.h"

#define DEADLINE_S 300

typedef it_fx fx;

/* common-licenses as paragraph-per-line text: the non-blank lines of each
 * paragraph joined by spaces, paragraphs joined until a line has 1500 bytes. */
static void write_long_lines(const char *dir, const char *name)
{
	size_t len = 0;
	char *txt = testdata_licenses(&len);
	assert_non_null(txt);
	char path[512];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *out = fopen(path, "w");
	assert_non_null(out);
	size_t cur = 0;
	for (size_t p = 0; p < len;) {
		char *nl = memchr(txt + p, '\n', len - p);
		size_t e = nl ? (size_t)(nl - txt) : len;
		size_t b = p;
		while (b < e && (txt[b] == ' ' || txt[b] == '\t' || txt[b] == '\r'))
			b++;
		size_t n = e - b;
		while (n > 0 && txt[b + n - 1] == '\r')
			n--;
		if (n == 0) {
			if (cur >= 1500) {
				fputc('\n', out);
				cur = 0;
			}
		} else {
			if (cur)
				fputc(' ', out);
			fwrite(txt + b, 1, n, out);
			cur += n + 1;
		}
		p = e + 1;
	}
	if (cur)
		fputc('\n', out);
	fclose(out);
	free(txt);
}

static int setup(void **state)
{
	it_daemon_opts o = {.cpu_slots = "1"};
	it_fx *f = it_daemon_start(&o, DEADLINE_S);
	if (!f)
		return -1;
	write_long_lines(f->data, "long.txt");
	return it_setup_end(state, f,
			    !it_add_dataset(&f->d, "{\"name\":\"longds\",\"source\":\"long.txt\","
						   "\"vocab\":{\"train\":{\"vocab_size\":400}}}"));
}

static json_int_t ival(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	if (!json_is_integer(v)) {
		char *t = json_dumps(o, JSON_COMPACT);
		fail_msg("no integer \"%s\" in %s", k, t);
	}
	return json_integer_value(v);
}

/* Runs a job to completed and returns its representation (caller decrefs). */
/* The tiny job name on longds: batch 4, 3 steps each logged, one loader,
 * the default learning rate without warm-up, mlm (JSON text; "null": none)
 * as its "mlm" (caller frees). */
static char *job_spec(const char *name, const char *mlm)
{
	return it_job_spec(name, "longds", "training_args.per_device_train_batch_size", "4",
			   "training_args.max_steps", "3", "training_args.logging_steps", "1",
			   "training_args.save_steps", "100", "training_args.dataloader_num_workers", "1",
			   "training_args.learning_rate", "null", "training_args.warmup_steps", "null", "mlm", mlm, NULL);
}

static json_t *run_job(fx *f, const char *spec, char *id, size_t cap)
{
	char *jid = it_submit(&f->d, spec);
	snprintf(id, cap, "%s", jid);
	free(jid);
	json_t *job = it_wait_completed(&f->d, id, DEADLINE_S);
	json_decref(job);
	char path[128];
	snprintf(path, sizeof path, "/v1/jobs/%s", id);
	return it_get_json(&f->d, path);
}

static void test_every_token_and_the_warning(void **state)
{
	fx *f = *state;
	it_wait_dataset_ready(&f->d, "longds", DEADLINE_S);
	json_t *ds = it_get_json(&f->d, "/v1/datasets/longds");
	json_t *st = json_object_get(ds, "stats");
	json_int_t tokens = ival(st, "tokens"), sentences = ival(st, "sentences");
	json_int_t over126 = ival(st, "sentences_over_126"), longest = ival(st, "longest_sentence");
	ival(st, "sentences_over_510");
	fprintf(stderr, "dataset: %lld tokens, %lld sentences, %lld lines over 126 tokens, longest %lld\n",
		(long long)tokens, (long long)sentences, (long long)over126, (long long)longest);
	assert_true(longest > 126 && over126 > 0);
	json_decref(ds);

	char id[64];
	char *spec = job_spec("all-tokens", "null");
	json_t *job = run_job(f, spec, id, sizeof id);
	free(spec);
	json_t *data = json_object_get(job, "data");
	assert_true(json_is_object(data));
	assert_int_equal(ival(data, "tokens_dropped"), 0);
	assert_int_equal(ival(data, "corpus_tokens"), tokens);
	assert_int_equal(ival(data, "tokens_per_epoch"), tokens);
	assert_int_equal(ival(json_object_get(data, "dropped"), "long_sentences"), 0);
	json_int_t seqs = ival(data, "sequences_per_epoch");
	json_t *ev = it_events_of(&f->d, id);
	assert_null(it_event_with(ev, "warning:"));
	json_decref(ev);
	json_decref(job);

	spec = job_spec("drops", "{\"drop_long_sentences\":true}");
	job = run_job(f, spec, id, sizeof id);
	free(spec);
	data = json_object_get(job, "data");
	assert_true(json_is_object(data));
	json_int_t dropped = ival(data, "tokens_dropped");
	fprintf(stderr, "drop_long_sentences: %lld of %lld tokens dropped, %lld sequences (%lld without)\n",
		(long long)dropped, (long long)tokens, (long long)ival(data, "sequences_per_epoch"),
		(long long)seqs);
	assert_true(dropped * 100 > tokens);
	assert_int_equal(ival(json_object_get(data, "dropped"), "long_sentences"), dropped);
	assert_int_equal(ival(data, "tokens_per_epoch"), tokens - dropped);
	ev = it_events_of(&f->d, id);
	const char *w = it_event_with(ev, "warning:");
	assert_non_null(w);
	assert_non_null(strstr(w, "drop_long_sentences"));
	json_decref(ev);
	json_decref(job);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_token_and_the_warning),
	};
	return IT_RUN(tests, setup, it_teardown);
}
