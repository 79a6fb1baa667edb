/* init_from checked against the job at submit (docs/jobspec.md#init_from):
 *   - the dataset's vocab must be the model's: its vocab.txt line by line
 *     (a vocab of the same size differing in one line, a vocab of another
 *     size: 422 naming both files and the first differing line), and the
 *     word-embedding rows (a model without vocab.txt: accepted when the
 *     sizes match, with a warning event; refused when they do not);
 *   - the effective spec's model section is the model's (config.json /
 *     state.json), and a model.* key that contradicts it is a 422 naming
 *     both values; keys that agree are accepted; the effective spec
 *     submitted again is the same, and init_from_restore "all" needs no
 *     model keys.
 * Two datasets with Google's bert-base vocabs (uncased 30522 lines, cased
 * 28996), HF model directories the test writes (config.json, a
 * model.safetensors holding the word embeddings, vocab.txt), and one tiny
 * job (4 steps) whose export and checkpoint are named as {"job": ...}.
 * After that job the queue is held: every other check is a submit. */
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

#include "harness.h"
#include "it_util.h"

#define DEADLINE_S 300
#define V_UNCASED 30522
#define V_CASED 28996
#define ONE_LINE 3000 /* the line the "hf-oneline" vocab changes ("replaced") */
#define UTF8_LINE 1500 /* the one "hf-utf8" changes (a non-ASCII letter) */

typedef it_fx fx;

static it_daemon_opts run_opts = {.cpu_slots = "1"};
static it_daemon_opts held_opts = {.cpu_slots = "1", .schedule = "false"};

/* Copies src to dst, replacing line `change` (1-based; 0: none) by token. */
static int copy_vocab(const char *src, const char *dst, long change, const char *token)
{
	FILE *in = fopen(src, "r"), *out = fopen(dst, "w");
	char line[1024];
	long n = 0;
	int rc = in && out ? 0 : -1;
	while (rc == 0 && fgets(line, sizeof line, in)) {
		if (++n == change)
			fprintf(out, "%s\n", token);
		else
			fputs(line, out);
	}
	if (in)
		fclose(in);
	if (out && fclose(out) != 0)
		rc = -1;
	return rc;
}

/* An HF model directory data/name: config.json with vocab_size and the
 * dimensions dims (hidden, layers, heads, inner), 128 positions and 2 token
 * types; model.safetensors holding only the word embeddings (rows x hidden,
 * F32 zeros); and a copy of vocab (NULL: no vocab.txt). */
static void hf_dir_dims(const char *data, const char *name, long vocab_size, long rows, const char *vocab,
			const int dims[4])
{
	char p[512];
	snprintf(p, sizeof p, "%s/%s", data, name);
	assert_int_equal(mkdir(p, 0700), 0);
	json_t *cfg = json_pack("{s:[s], s:s, s:I, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:s}",
				"architectures", "BertForMaskedLM", "model_type", "bert",
				"vocab_size", (json_int_t)vocab_size, "hidden_size", dims[0],
				"num_hidden_layers", dims[1], "num_attention_heads", dims[2], "intermediate_size", dims[3],
				"max_position_embeddings", 128, "type_vocab_size", 2, "layer_norm_eps", 1e-12,
				"hidden_act", "gelu");
	snprintf(p, sizeof p, "%s/%s/config.json", data, name);
	assert_int_equal(json_dump_file(cfg, p, JSON_INDENT(2)), 0);
	json_decref(cfg);

	char hdr[256];
	int n = snprintf(hdr, sizeof hdr,
			 "{\"bert.embeddings.word_embeddings.weight\":{\"dtype\":\"F32\",\"shape\":[%ld,%d],"
			 "\"data_offsets\":[0,%ld]}}",
			 rows, dims[0], rows * dims[0] * 4);
	while (n % 8)
		hdr[n++] = ' ';
	snprintf(p, sizeof p, "%s/%s/model.safetensors", data, name);
	FILE *f = fopen(p, "wb");
	assert_non_null(f);
	uint8_t len[8];
	for (int i = 0; i < 8; i++)
		len[i] = (uint8_t)((uint64_t)n >> (8 * i));
	assert_int_equal(fwrite(len, 1, 8, f), 8);
	assert_int_equal(fwrite(hdr, 1, (size_t)n, f), (size_t)n);
	assert_int_equal(ftruncate(fileno(f), 8 + n + rows * dims[0] * 4), 0);
	assert_int_equal(fclose(f), 0);
	if (vocab) {
		char dst[512];
		snprintf(dst, sizeof dst, "%s/%s/vocab.txt", data, name);
		assert_int_equal(copy_vocab(vocab, dst, 0, NULL), 0);
	}
}

/* The test's model: 16 wide, one layer, 2 heads, 32 inner. */
static void hf_dir(const char *data, const char *name, long vocab_size, long rows, const char *vocab)
{
	static const int small[4] = {16, 1, 2, 32};
	hf_dir_dims(data, name, vocab_size, rows, vocab, small);
}

static int setup(void **state)
{
	const char *src = getenv("BERTD_SOURCE_ROOT");
	if (!src)
		return -1;
	it_fx *f = it_daemon_start(&run_opts, 0);
	char from[512], to[512];
	if (!f)
		return -1;
	static const char *const vocabs[] = {"bert-base-uncased-vocab.txt", "bert-base-cased-vocab.txt"};
	for (int i = 0; i < 2; i++) {
		snprintf(from, sizeof from, "%s/tests/data/%s", src, vocabs[i]);
		snprintf(to, sizeof to, "%s/%s", f->data, vocabs[i]);
		if (copy_vocab(from, to, 0, NULL))
			return it_setup_end(state, f, false);
	}
	it_make_corpus(f->data, "corpus.txt", 300);
	return it_setup_end(state, f,
			    !it_add_dataset(&f->d, "{\"name\":\"uncased\",\"source\":\"corpus.txt\","
						   "\"vocab\":{\"file\":\"bert-base-uncased-vocab.txt\"}}") &&
				    !it_add_dataset(&f->d, "{\"name\":\"cased\",\"source\":\"corpus.txt\","
							   "\"vocab\":{\"file\":\"bert-base-cased-vocab.txt\"}}"));
}

/* POST spec; returns the answer (caller frees). */
static http_resp submit(const bertd *d, const char *fmt, ...)
{
	char spec[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(spec, sizeof spec, fmt, ap);
	va_end(ap);
	http_resp r;
	assert_int_equal(http_post_json(d, "/v1/jobs", spec, &r), 0);
	return r;
}

/* r must be a 201 whose effective model is the test models' (16 wide, one
 * layer, 2 heads, 32 inner, 128 positions, 2 types, vocab_size rows);
 * returns the job id (caller frees). */
static char *accepted(http_resp *r, long rows)
{
	if (r->status != 201)
		fail_msg("expected 201, got %ld: %s", r->status, r->body);
	json_t *m = json_object_get(json_object_get(r->json, "spec"), "model");
	static const struct {
		const char *key;
		long want;
	} dims[] = {{"hidden_size", 16}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
		    {"intermediate_size", 32}, {"max_position_embeddings", 128}, {"type_vocab_size", 2}};
	for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
		if (json_integer_value(json_object_get(m, dims[i].key)) != dims[i].want)
			fail_msg("model.%s is not %ld: %s", dims[i].key, dims[i].want, r->body);
	assert_int_equal(json_integer_value(json_object_get(m, "vocab_size")), rows);
	char *id = strdup(it_jstr(r->json, "id"));
	http_resp_free(r);
	return id;
}

/* The first line (1-based) where vocab files a and b differ, trailing
 * whitespace aside, as the tokenizer reads them; 0 when none. */
static long first_difference(const char *a, const char *b)
{
	FILE *fa = fopen(a, "r"), *fb = fopen(b, "r");
	assert_non_null(fa);
	assert_non_null(fb);
	char la[1024], lb[1024];
	long n = 0, at = 0;
	for (;;) {
		char *ra = fgets(la, sizeof la, fa), *rb = fgets(lb, sizeof lb, fb);
		n++;
		if (!ra || !rb) {
			at = ra || rb ? n : 0;
			break;
		}
		la[strcspn(la, "\r\n")] = lb[strcspn(lb, "\r\n")] = 0;
		if (strcmp(la, lb) != 0) {
			at = n;
			break;
		}
	}
	fclose(fa);
	fclose(fb);
	return at;
}

#define DIMS "\"model\":{\"hidden_size\":16,\"num_hidden_layers\":1,\"num_attention_heads\":2," \
	     "\"intermediate_size\":32,\"max_position_embeddings\":128}"
#define TA "\"training_args\":{\"max_seq_length\":32,\"max_steps\":4,\"logging_steps\":2," \
	   "\"save_steps\":2,\"per_device_train_batch_size\":4,\"dataloader_num_workers\":0}"

/* HF directories the test writes: only submits, the queue held. */
/* data/name/config.json's hidden_act set to act */
static void set_config_act(const char *data, const char *name, const char *act)
{
	char p[512];
	snprintf(p, sizeof p, "%s/%s/config.json", data, name);
	json_t *cfg = json_load_file(p, 0, NULL);
	assert_non_null(cfg);
	assert_int_equal(json_object_set_new(cfg, "hidden_act", json_string(act)), 0);
	assert_int_equal(json_dump_file(cfg, p, JSON_INDENT(2)), 0);
	json_decref(cfg);
}

static void test_hf_directories(void **state)
{
	fx *f = *state;
	char uncased[300], cased[300], p[600], q[600], dsv[600];
	it_wait_dataset_ready(&f->d, "uncased", DEADLINE_S);
	it_wait_dataset_ready(&f->d, "cased", DEADLINE_S);
	assert_int_equal(bertd_stop(&f->d), 0);
	assert_int_equal(it_daemon_run(f, &held_opts), 0);
	snprintf(uncased, sizeof uncased, "%s/bert-base-uncased-vocab.txt", f->data);
	snprintf(cased, sizeof cased, "%s/bert-base-cased-vocab.txt", f->data);
	hf_dir(f->data, "hf-same", V_UNCASED, V_UNCASED, uncased);
	hf_dir(f->data, "hf-novocab", V_UNCASED, V_UNCASED, NULL);
	hf_dir(f->data, "hf-oneline", V_UNCASED, V_UNCASED, NULL);
	hf_dir(f->data, "hf-utf8", V_UNCASED, V_UNCASED, NULL);
	hf_dir(f->data, "hf-rows", V_UNCASED, V_UNCASED - 2, uncased);
	snprintf(p, sizeof p, "%s/hf-oneline/vocab.txt", f->data);
	assert_int_equal(copy_vocab(uncased, p, ONE_LINE, "zzyzx"), 0);
	assert_int_equal(first_difference(uncased, p), ONE_LINE);
	snprintf(p, sizeof p, "%s/hf-utf8/vocab.txt", f->data);
	assert_int_equal(copy_vocab(uncased, p, UTF8_LINE, "zzyzx"), 0);
	/* the dataset's vocab: the exact bytes it was prepared with */
	snprintf(dsv, sizeof dsv, "%s/datasets/uncased/vocab.txt", f->data);

	/* the same vocab: accepted, the model's dimensions shown */
	http_resp r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-same\"}");
	char *id = accepted(&r, V_UNCASED);
	json_t *ev = it_events_of(&f->d, id);
	assert_null(it_event_with(ev, "warning")); /* compared in full: nothing to warn about */
	json_decref(ev);
	free(id);

	/* one line differs, same size: both files and the line; the tokens
	 * are short and printable, so they are quoted */
	snprintf(q, sizeof q, "%s|%s/hf-oneline/vocab.txt|line %d (\"replaced\" vs \"zzyzx\")", dsv, f->data, ONE_LINE);
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-oneline\"}");
	it_assert_refused(&r, "init_from", q);
	/* a token that is not printable ASCII is not quoted: neither is shown */
	snprintf(q, sizeof q, "%s|%s/hf-utf8/vocab.txt|line %d: ", dsv, f->data, UTF8_LINE);
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-utf8\"}");
	assert_int_equal(r.status, 422);
	assert_null(strstr(it_jstr(r.json, "detail"), "zzyzx"));
	it_assert_refused(&r, "init_from", q);

	/* another size (the cased vocab): refused at its first differing line */
	long at = first_difference(cased, uncased);
	assert_true(at > 0);
	snprintf(q, sizeof q, "%s/datasets/cased/vocab.txt|%s/hf-same/vocab.txt|line %ld|%d lines|%d lines",
		 f->data, f->data, at, V_CASED, V_UNCASED);
	r = submit(&f->d, "{\"dataset\":\"cased\",\"init_from\":\"hf-same\"}");
	it_assert_refused(&r, "init_from", q);

	/* no vocab.txt: the sizes match, accepted with a warning event */
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-novocab\"}");
	id = accepted(&r, V_UNCASED);
	ev = it_events_of(&f->d, id);
	const char *w = it_event_with(ev, "could not be compared");
	if (!w)
		fail_msg("no warning event on %s", id);
	fprintf(stderr, "event: %s\n", w ? w : "");
	assert_non_null(strstr(w ? w : "", "hf-novocab"));
	json_decref(ev);
	free(id);
	/* ... and refused when they do not */
	snprintf(q, sizeof q, "%d word-embedding rows|%d tokens|no vocab.txt", V_UNCASED, V_CASED);
	r = submit(&f->d, "{\"dataset\":\"cased\",\"init_from\":\"hf-novocab\"}");
	it_assert_refused(&r, "init_from", q);

	/* the embedding tensor must agree with config.json */
	snprintf(q, sizeof q, "hf-rows/model.safetensors has %d word-embedding rows|vocab_size %d",
		 V_UNCASED - 2, V_UNCASED);
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-rows\"}");
	it_assert_refused(&r, "init_from", q);

	/* model.* keys: a contradiction names the field and both values; keys
	 * that agree are accepted */
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-same\",\"model\":{\"num_hidden_layers\":2}}");
	it_assert_refused(&r, "model.num_hidden_layers", "2 differs|num_hidden_layers 1|hf-same/config.json");
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-same\",\"model\":{\"vocab_size\":30528}}");
	it_assert_refused(&r, "model.vocab_size", "30528 differs|vocab_size 30522");
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-same\",\"model\":{\"preset\":\"bert-tiny\"}}");
	it_assert_refused(&r, "model.preset", "\"bert-tiny\" has hidden_size 128|16");
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-same\"," DIMS "}");
	free(accepted(&r, V_UNCASED));
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-same\",\"model\":{\"preset\":\"bert-tiny\","
			  "\"hidden_size\":16,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
			  "\"intermediate_size\":32,\"vocab_size\":30522}}");
	free(accepted(&r, V_UNCASED));
	/* a model with a preset's dimensions is shown as that preset (the
	 * default, bert-base, would describe another model) */
	static const int tiny[4] = {128, 2, 2, 512};
	hf_dir_dims(f->data, "hf-tiny", V_UNCASED, V_UNCASED, uncased, tiny);
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-tiny\"}");
	assert_int_equal(r.status, 201);
	json_t *m = json_object_get(json_object_get(r.json, "spec"), "model");
	assert_string_equal(it_jstr(m, "preset"), "bert-tiny");
	assert_int_equal(json_integer_value(json_object_get(m, "hidden_size")), 128);
	assert_int_equal(json_integer_value(json_object_get(m, "intermediate_size")), 512);
	http_resp_free(&r);
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-same\"}");
	assert_int_equal(r.status, 201);
	assert_string_equal(it_jstr(json_object_get(json_object_get(r.json, "spec"), "model"), "preset"), "bert-base");
	http_resp_free(&r);
	/* hidden_act is the model's too: in the effective spec, a contradiction
	 * refused, one bertd does not run refused at submit naming the file */
	hf_dir_dims(f->data, "hf-tanh", V_UNCASED, V_UNCASED, uncased, tiny);
	set_config_act(f->data, "hf-tanh", "gelu_new");
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-tanh\"}");
	assert_int_equal(r.status, 201);
	assert_string_equal(it_jstr(json_object_get(json_object_get(r.json, "spec"), "model"), "hidden_act"),
			    "gelu_new");
	http_resp_free(&r);
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-tanh\",\"model\":{\"hidden_act\":\"gelu\"}}");
	it_assert_refused(&r, "model.hidden_act", "\"gelu\" differs|hidden_act \"gelu_new\"|hf-tanh/config.json");
	hf_dir_dims(f->data, "hf-relu", V_UNCASED, V_UNCASED, uncased, tiny);
	set_config_act(f->data, "hf-relu", "relu");
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-relu\"}");
	it_assert_refused(&r, "model.hidden_act", "hf-relu/config.json");

	/* the rules between keys hold for the model's dimensions */
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":\"hf-same\","
			  "\"training_args\":{\"max_seq_length\":256}}");
	it_assert_refused(&r, "training_args.max_seq_length", "max_position_embeddings (128)|hf-same/config.json");
}

/* A tiny job's export and checkpoint, named as {"job": ...}: the export
 * keeps its vocab.txt, a checkpoint none (its job's export's is used). */
static void test_job_outputs(void **state)
{
	fx *f = *state;
	char q[1200];
	it_wait_dataset_ready(&f->d, "uncased", DEADLINE_S);
	it_wait_dataset_ready(&f->d, "cased", DEADLINE_S);
	char *a = it_submit(&f->d, "{\"name\":\"a\",\"dataset\":\"uncased\"," DIMS "," TA "}");
	json_t *ja = it_wait_completed(&f->d, a, DEADLINE_S);
	char *export = realpath(it_jstr(ja, "model_dir"), NULL); /* as init_from resolves it */
	assert_non_null(export);
	json_decref(ja);
	assert_int_equal(bertd_stop(&f->d), 0);
	assert_int_equal(it_daemon_run(f, &held_opts), 0);

	static const char *const refs[] = {"{\"job\":\"%s\"}", "{\"job\":\"%s\",\"checkpoint\":\"latest\"}",
					   "{\"job\":\"%s\",\"checkpoint\":2}"};
	for (size_t i = 0; i < sizeof refs / sizeof refs[0]; i++) {
		char ref[128];
		snprintf(ref, sizeof ref, refs[i], a);
		fprintf(stderr, "init_from %s\n", ref);
		http_resp r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":%s}", ref);
		char *id = accepted(&r, V_UNCASED);
		json_t *ev = it_events_of(&f->d, id);
		assert_null(it_event_with(ev, "warning"));
		json_decref(ev);
		free(id);
		r = submit(&f->d, "{\"dataset\":\"cased\",\"init_from\":%s}", ref);
		snprintf(q, sizeof q, "%s/datasets/cased/vocab.txt|%s/vocab.txt|line", f->data, export);
		it_assert_refused(&r, "init_from", q);
		r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":%s,\"model\":{\"num_hidden_layers\":3}}", ref);
		it_assert_refused(&r, "model.num_hidden_layers", "3 differs|num_hidden_layers 1");
		r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":%s," DIMS "}", ref);
		free(accepted(&r, V_UNCASED));
	}

	/* the effective spec submitted again is the same effective spec: the
	 * model's keys it holds agree with the model */
	http_resp r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":{\"job\":\"%s\",\"checkpoint\":2}}", a);
	assert_int_equal(r.status, 201);
	char *eff = json_dumps(json_object_get(r.json, "spec"), JSON_COMPACT);
	http_resp r2 = submit(&f->d, "%s", eff);
	if (r2.status != 201 || !json_equal(json_object_get(r.json, "spec"), json_object_get(r2.json, "spec")))
		fail_msg("the effective spec again: %ld %s", r2.status, r2.body);
	free(eff);
	http_resp_free(&r);
	http_resp_free(&r2);

	/* continuing A's run needs no model keys either: the model is the
	 * checkpoint's before init_from_restore "all" compares it */
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":{\"job\":\"%s\",\"checkpoint\":2},"
			  "\"init_from_restore\":\"all\",\"training_args\":{\"max_seq_length\":32,\"max_steps\":6,"
			  "\"per_device_train_batch_size\":4,\"dataloader_num_workers\":0}}", a);
	free(accepted(&r, V_UNCASED));

	/* Without the export's vocab.txt a checkpoint's vocab is its job's
	 * dataset's; the export itself then has none: sizes only, a warning */
	char p[700];
	snprintf(p, sizeof p, "%s/vocab.txt", export);
	assert_int_equal(unlink(p), 0);
	snprintf(q, sizeof q, "%s/datasets/cased/vocab.txt|%s/datasets/uncased/vocab.txt|line 2", f->data,
		 f->data);
	r = submit(&f->d, "{\"dataset\":\"cased\",\"init_from\":{\"job\":\"%s\",\"checkpoint\":2}}", a);
	it_assert_refused(&r, "init_from", q);
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":{\"job\":\"%s\",\"checkpoint\":2}}", a);
	free(accepted(&r, V_UNCASED));
	r = submit(&f->d, "{\"dataset\":\"uncased\",\"init_from\":{\"job\":\"%s\"}}", a);
	char *id = accepted(&r, V_UNCASED);
	json_t *ev = it_events_of(&f->d, id);
	if (!it_event_with(ev, "could not be compared"))
		fail_msg("no warning event on %s", id);
	json_decref(ev);
	free(id);
	free(export);
	free(a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_hf_directories, setup, it_teardown),
		cmocka_unit_test_setup_teardown(test_job_outputs, setup, it_teardown),
	};
	return IT_RUN(tests, NULL, NULL);
}
