/* restore — see restore.h. */
#include "api/restore.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>


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

/* The moments are exponential averages of the gradient (m) and of its
 * square (v) with the checkpoint's betas, bias-corrected by its update
 * count: a job that goes on with them must average with the same betas.
 * Nothing else enters them: batch, accumulation, max_seq_length, world size,
 * learning rate, schedule, epsilon, weight decay, clipping and AdamW vs LAMB
 * may differ (two-phase BERT changes the first three). The first beta that
 * differs from the checkpoint's optimizer (state.json "optimizer"), or NULL;
 * compared as the float the optimizer keeps. */
static const char *moments_differ(const json_t *spec, const json_t *opt)
{
	static const char *const keys[] = {"adam_beta1", "adam_beta2"};
	for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
		if ((float)json_number_value(at(spec, "training_args", keys[i])) !=
		    (float)json_number_value(json_object_get(opt, keys[i])))
			return keys[i];
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
	json_t *state = NULL;
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
	if ((key = moments_differ(spec, json_object_get(state, "optimizer")))) {
		snprintf(field, sizeof field, "training_args.%s", key);
		*ret = api_reply_problem(req, API_P_INVALID_SPEC, field,
					 "differs from the checkpoint's (%s/state.json optimizer): " WHY
					 " with its Adam moments, which are averages at that job's betas",
					 dir, id);
		goto out;
	}
	ok = true;
out:
	json_decref(state);
	return ok;
}
