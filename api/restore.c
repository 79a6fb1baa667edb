/* restore — see restore.h. */
#include "api/restore.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/jobspec.h"
#include "daemon/store.h"

#define WHY "init_from_restore \"all\" continues job %s's run"

/* s.k, s being a section of an effective spec */
static json_t *at(const json_t *spec, const char *s, const char *k)
{
	return json_object_get(json_object_get(spec, s), k);
}

/* The first key of the job's model (and mlm.nsp) that differs from the
 * checkpoint's model (state.json "model"), or NULL. Dropouts and eps are
 * compared as the float the worker trains with; a null vocab_size (the
 * dataset's) is not compared. */
static const char *model_differs(const json_t *spec, const json_t *ck)
{
	static const char *const ints[] = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
					   "intermediate_size", "max_position_embeddings", "type_vocab_size"};
	static const char *const reals[] = {"hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps"};
	for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
		json_t *v = at(spec, "model", ints[i]);
		if (!json_is_null(v) && !json_equal(v, json_object_get(ck, ints[i])))
			return ints[i];
	}
	for (size_t i = 0; i < sizeof reals / sizeof *reals; i++)
		if ((float)json_number_value(at(spec, "model", reals[i])) !=
		    (float)json_number_value(json_object_get(ck, reals[i])))
			return reals[i];
	json_t *act = json_object_get(ck, "hidden_act");
	if (!json_equal(at(spec, "model", "hidden_act"), act))
		return "hidden_act";
	if (json_is_true(at(spec, "mlm", "nsp")) != json_is_true(json_object_get(ck, "nsp")))
		return "nsp";
	return NULL;
}

/* The data position is step x batch x accumulation x world sequences into
 * the dataset, at max_seq_length: the source job's layout must be this
 * one's. The first key that differs (its section into *sec), or NULL. */
static const char *layout_differs(const json_t *spec, const json_t *src, const char **sec)
{
	static const char *const keys[][2] = {
		{"training_args", "per_device_train_batch_size"}, {"training_args", "gradient_accumulation_steps"},
		{"training_args", "max_seq_length"}, {"resources", "gpus"}, {"resources", "nodes"},
	};
	for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
		if (!json_equal(at(spec, keys[i][0], keys[i][1]), at(src, keys[i][0], keys[i][1]))) {
			*sec = keys[i][0];
			return keys[i][1];
		}
	}
	return NULL;
}

bool api_restore_check(api_request *req, const json_t *spec, const json_t *ref, const char *dir,
		       enum MHD_Result *ret)
{
	const char *mode = json_string_value(json_object_get(spec, "init_from_restore"));
	if (!mode || strcmp(mode, "all") != 0)
		return true;
	if (!ref) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from_restore",
					 "\"all\" takes init_from as a job's checkpoint ({\"job\": id, \"checkpoint\": "
					 "step or \"latest\"}), not a path");
		return false;
	}
	const char *id = json_string_value(json_object_get(ref, "job"));
	char path[PATH_MAX + 32], field[96];
	struct stat sb;
	bool ok = false;
	store_job src = {0};
	json_t *state = NULL, *src_spec = NULL;
	snprintf(path, sizeof path, "%s/state.json", dir);
	if (!(state = json_load_file(path, 0, NULL))) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from_restore",
					 "\"all\" needs a bertd checkpoint (state.json); %s is not one", dir);
		goto out;
	}
	json_t *step = json_object_get(state, "step");
	json_t *updates = json_object_get(json_object_get(state, "optimizer"), "updates");
	snprintf(path, sizeof path, "%s/optim.safetensors", dir);
	if (!json_is_integer(step) || !json_is_integer(updates) || stat(path, &sb) < 0) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "init_from_restore",
					 "\"all\" needs a checkpoint with optimizer state; %s has none", dir);
		goto out;
	}
	long long n = json_integer_value(step);
	json_int_t max_steps = json_integer_value(at(spec, "training_args", "max_steps"));
	if (max_steps <= n) {
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, "training_args.max_steps",
					 "must exceed the checkpoint's step (%lld): " WHY " at step %lld", n, id,
					 n + 1);
		goto out;
	}
	const char *key = model_differs(spec, json_object_get(state, "model"));
	if (key) {
		snprintf(field, sizeof field, "%s.%s", strcmp(key, "nsp") ? "model" : "mlm", key);
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, field,
					 "differs from the model of the checkpoint (%s/state.json): " WHY
					 ", so the job's model must be that one",
					 dir, id);
		goto out;
	}
	int rc = store_job_get(req->st, id, &src);
	if (rc < 0) {
		*ret = api_reply_store_error(req, rc, "loading job %s failed", id);
		goto out;
	}
	/* normalized again, as the supervisor reads it: keys added since are filled */
	json_t *stored = json_loads(src.spec_json, 0, NULL);
	jobspec_error jerr;
	if (!stored || jobspec_normalize(stored, &src_spec, &jerr) < 0) {
		json_decref(stored);
		*ret = api_reply_problem(req, API_P_INTERNAL, "init_from.job", "job %s's stored spec is unreadable",
					 id);
		goto out;
	}
	json_decref(stored);
	const char *sec;
	if ((key = layout_differs(spec, src_spec, &sec))) {
		snprintf(field, sizeof field, "%s.%s", sec, key);
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, field,
					 "differs from job %s's: " WHY " and its data position, which needs the same "
					 "per_device_train_batch_size, gradient_accumulation_steps, max_seq_length and "
					 "resources (world size)",
					 id, id);
		goto out;
	}
	ok = true;
out:
	json_decref(state);
	json_decref(src_spec);
	store_job_free(&src);
	return ok;
}
