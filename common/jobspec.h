/* jobspec — the job spec: JSON in, validated effective spec out, and the
 * typed view the worker reads. Pure (no I/O, no globals), so it is unit- and
 * fuzz-testable. Shared by api/ (validation on submit) and worker/ (reading
 * the effective spec it is launched with), hence it lives in common/.
 *
 * Names follow HuggingFace: TrainingArguments (training_args), BertConfig
 * (model), DataCollatorForLanguageModeling (mlm). See DESIGN.md section 6 and
 * docs/api.md for every key, its default and its bounds.
 */
#ifndef BERTD_COMMON_JOBSPEC_H
#define BERTD_COMMON_JOBSPEC_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* Why a spec was refused. status is 400 (malformed: not an object, wrong
 * JSON type) or 422 (well-formed but invalid: unknown key, out of range,
 * inconsistent). field is the dotted path ("training_args.learning_rate"),
 * empty when the whole body is at fault. */
typedef struct jobspec_error {
	int status;
	char field[128];
	char detail[256];
} jobspec_error;

/* Validates a submitted spec and fills every default.
 * On success returns 0 and *out is a new object (caller owns, json_decref)
 * holding the full effective spec, every key present. On failure returns
 * -EINVAL and fills *err; *out is untouched. in is not modified. */
int jobspec_normalize(const json_t *in, json_t **out, jobspec_error *err);

/* Typed view of an effective spec (the output of jobspec_normalize). */
typedef struct jobspec_model {
	char preset[32];               /* "bert-tiny" ... "bert-large", or "custom" */
	int vocab_size;                /* 0 = from the dataset's vocab */
	int hidden_size, num_hidden_layers, num_attention_heads, intermediate_size;
	char hidden_act[16];           /* "gelu" */
	double hidden_dropout_prob, attention_probs_dropout_prob;
	int max_position_embeddings, type_vocab_size;
	double initializer_range, layer_norm_eps;
} jobspec_model;

typedef struct jobspec_training {
	int per_device_train_batch_size, gradient_accumulation_steps;
	double learning_rate;
	char lr_scheduler_type[16];    /* linear | cosine | constant | constant_with_warmup */
	int64_t warmup_steps;
	double warmup_ratio;
	double weight_decay, adam_beta1, adam_beta2, adam_epsilon, max_grad_norm;
	int64_t max_steps;
	int max_seq_length;
	char optim[16];                /* adamw | lamb */
	bool bf16, fp16;
	uint64_t seed;
	int64_t logging_steps, save_steps;
	int save_total_limit;
	int dataloader_num_workers;
	bool dataloader_pin_memory;
} jobspec_training;

typedef struct jobspec_mlm {
	double mlm_probability, mask_replace_prob, random_replace_prob;
	bool whole_word_mask, nsp;
	int max_predictions_per_seq;   /* resolved: 20 at seq 128, 80 at 512, ... */
	double short_seq_prob;
} jobspec_mlm;

typedef struct jobspec {
	char name[128];
	char dataset[128];
	char init_from[1024];          /* "" when training from scratch */
	int priority;
	jobspec_model model;
	jobspec_training training;
	jobspec_mlm mlm;
	int gpus;                      /* resources.gpus: devices (GPUs or CPU slots) */
	char device[8];                /* "auto" | "cuda" | "cpu" */
	int64_t max_runtime_seconds;   /* 0 = no limit */
	int max_restarts;
} jobspec;

/* Fills *out from an effective spec. Returns 0, or -EINVAL with *err filled
 * if spec is not a valid effective spec. */
int jobspec_from_json(const json_t *spec, jobspec *out, jobspec_error *err);

#endif
