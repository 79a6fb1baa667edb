/* jobspec — the job spec: JSON in, validated effective spec out, and the
 * typed view the worker reads. Pure (no I/O, no globals, no logging), so it
 * is unit- and fuzz-testable. Shared by api/ (validation on submit) and
 * worker/ (reading the effective spec it is launched with), hence it lives in
 * common/. It must never touch the file system: init_from is only checked for
 * shape here; the API resolves it under the data roots.
 *
 * Names follow HuggingFace: TrainingArguments (training_args), BertConfig
 * (model), DataCollatorForLanguageModeling (mlm). docs/jobspec.md lists every
 * key, its type, default and bounds; docs/jobspec.md has examples.
 */
#ifndef BERTD_COMMON_JOBSPEC_H
#define BERTD_COMMON_JOBSPEC_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* Why a spec was refused. status is 400 when the body is not a JSON object
 * at all (field is then empty), 422 for everything else: unknown key, wrong
 * JSON type, out of range, inconsistent. field is the dotted path of the
 * offending key ("training_args.learning_rate"), truncated on a UTF-8
 * boundary if longer than the buffer; detail is one English sentence that
 * never echoes the submitted value. */
typedef struct jobspec_error {
	int status;
	char field[128];
	char detail[256];
} jobspec_error;

/* Validates a submitted spec and fills every default.
 * On success returns 0 and *out is a new object (caller owns, json_decref)
 * holding the full effective spec: every key present, in the documented
 * order, aliases spelled canonically, derived defaults resolved, null only
 * where null means "decided later" (see docs/jobspec.md). Two things only
 * the API can settle stay as submitted: training_args.max_steps -1 (train
 * by num_train_epochs; jobspec_resolve_epochs) and an init_from object
 * (a job reference); jobspec_from_json refuses both. Normalizing an
 * effective spec returns an equal one. On failure returns -EINVAL and fills
 * *err (or -ENOMEM, status 500); *out is untouched. in is not modified;
 * in == NULL is a 400. */
int jobspec_normalize(const json_t *in, json_t **out, jobspec_error *err);

/* "tags": at most JOBSPEC_MAX_TAGS distinct tags of 1..JOBSPEC_TAG_MAX
 * bytes of A-Z a-z 0-9 . _ - : / @ + = (first a letter or digit); "notes":
 * at most JOBSPEC_NOTES_MAX bytes, no control characters but newline and
 * tab (docs/jobspec.md). */
#define JOBSPEC_MAX_TAGS 16
#define JOBSPEC_TAG_MAX 64
#define JOBSPEC_NOTES_MAX 4096

/* Why a multi-node job cannot be "preemptible": true (refused at submit
 * and by PATCH). */
#define JOBSPEC_MULTINODE_NOT_PREEMPTIBLE                                                       \
	"cannot be true for a multi-node job (resources.nodes above 1): Slurm places it, not this " \
	"machine's devices, so stopping it would free nothing a queued job could use; multi-node " \
	"jobs are never preempted"
/* Validates one top-level key a job may change after submit ("name",
 * "priority", "tags", "notes", "preemptible") as jobspec_normalize would, and returns its
 * effective value in *out (caller owns; null for notes and [] for tags
 * given null). -EINVAL with *err filled (field: the key, or "tags[2]")
 * for any other key, null for name, priority or preemptible, or a bad
 * value; -ENOMEM. */
int jobspec_check_key(const char *key, const json_t *v, json_t **out, jobspec_error *err);

/* Tri-state for choices the worker makes from the hardware it finds. */
enum { JOBSPEC_AUTO = -1 };

/* Typed view of an effective spec (the output of jobspec_normalize). */
typedef struct jobspec_model {
	char preset[16];               /* "bert-tiny" ... "bert-large" */
	int vocab_size;                /* 0 = from the dataset's vocab (null in JSON) */
	int hidden_size, num_hidden_layers, num_attention_heads, intermediate_size;
	char hidden_act[24];           /* "gelu", "gelu_new", "gelu_pytorch_tanh" */
	double hidden_dropout_prob, attention_probs_dropout_prob;
	int max_position_embeddings, type_vocab_size;
	double initializer_range, layer_norm_eps;
} jobspec_model;

typedef struct jobspec_training {
	int per_device_train_batch_size, gradient_accumulation_steps;
	double learning_rate;
	char lr_scheduler_type[24];    /* linear | cosine | constant | constant_with_warmup |
	                                * polynomial | cosine_with_min_lr | warmup_stable_decay */
	int64_t warmup_steps;
	double warmup_ratio;
	double weight_decay, adam_beta1, adam_beta2, adam_epsilon;
	double max_grad_norm;          /* 0 = no clipping */
	double num_train_epochs;       /* 0 = not given (null); already resolved into max_steps */
	int64_t max_steps;             /* >= 1: -1 (train by epochs) never reaches a worker */
	int max_seq_length;
	char optim[8];                 /* adamw (torch.optim.AdamW) | lamb */
	int bf16, fp16;                /* 1, 0, or JOBSPEC_AUTO (null): bf16 on sm_80+,
	                                * fp16 on sm_70, fp32 on CPU; never both 1 */
	uint64_t seed;                 /* 0 .. 2^63-1 */
	int64_t logging_steps, save_steps;
	int save_total_limit;
	int dataloader_num_workers;    /* 0 = the worker builds batches serially */
	bool dataloader_pin_memory;
	char ddp_reduce_dtype[8];      /* fp32 | bf16 | fp16: the GPU gradient all-reduce's type */
	char eval_strategy[8];         /* no | steps (evaluation_strategy is its older spelling) */
	int64_t eval_steps;            /* resolved: logging_steps when not given */
	int per_device_eval_batch_size;
	int max_eval_batches;          /* bertd: cap on the eval set, in eval batches */
	/* lr_scheduler_kwargs, resolved: the schedule's own as given or HF's
	 * defaults; the rest at HF's defaults (lr_end 1e-7, power 1, num_cycles
	 * 0.5, floors 0, no stable or decay steps). min_lr arrives as its
	 * min_lr_rate (min_lr / learning_rate, as get_scheduler computes it). */
	double lr_end, power, num_cycles, min_lr_rate, min_lr_ratio;
	int64_t num_stable_steps, num_decay_steps;
	char metric_for_best_model[16]; /* eval_loss | perplexity | eval_accuracy ("loss",
	                                 * "accuracy" accepted, as HF prefixes "eval_") */
	int greater_is_better;         /* 1 or 0: resolved from the metric when null */
	bool load_best_model_at_end;   /* the export is the best checkpoint's model */
} jobspec_training;

typedef struct jobspec_mlm {
	double mlm_probability, mask_replace_prob, random_replace_prob;
	bool whole_word_mask, nsp;
	int max_predictions_per_seq;   /* always resolved: 20 at seq 128, 80 at 512 */
	double short_seq_prob;
	int validation_split_percentage; /* held-out share of the documents; resolved:
	                                  * 5 with eval_strategy "steps", else 0 */
	bool drop_long_sentences;      /* whole-sentence packing that drops what a sample cannot
	                                * hold (docs/formats.md); false: nothing is dropped */
} jobspec_mlm;

/* A mixture has at most this many datasets; its proportions sum to 1
 * within the tolerance (docs/jobspec.md#mixtures). */
#define JOBSPEC_MAX_DATASETS 16
#define JOBSPEC_PROPORTION_TOLERANCE 1e-6

typedef struct jobspec_dataset {
	char name[65];                 /* 1..64 of [A-Za-z0-9._-] */
	double proportion;             /* (0, 1]; 1 for a job on one dataset */
} jobspec_dataset;

typedef struct jobspec {
	char name[129];                /* 1..128 of [A-Za-z0-9._-] */
	char dataset[65];              /* one dataset's name; "" for a mixture (see datasets) */
	int n_datasets;                /* 1 (dataset), or 2..JOBSPEC_MAX_DATASETS (a mixture) */
	jobspec_dataset datasets[JOBSPEC_MAX_DATASETS]; /* (n_datasets,): every component, in order */
	char init_from[1024];          /* absolute path, "" when training from scratch (the
	                                * {"job", "checkpoint"} form is resolved at submit) */
	char init_from_restore[8];     /* "weights" | "all": also the optimizer, scheduler,
	                                * loss scaler and data position (start at its step) */
	int priority;                  /* -100..100, higher runs first */
	bool preemptible;              /* a waiting job of higher priority may stop it at a
	                                * checkpoint; it is queued again and resumes */
	jobspec_model model;
	jobspec_training training;
	jobspec_mlm mlm;
	int gpus;                      /* resources.gpus: devices (GPUs or CPU slots) */
	char device[8];                /* "auto" | "cuda" | "cpu" */
	int nodes;                     /* resources.nodes: 1 = this machine (docs/multinode.md) */
	int gpus_per_node;             /* resources.gpus_per_node; 0 (null) = gpus on one node;
	                                * set: gpus == nodes * gpus_per_node */
	int64_t max_runtime_seconds;   /* 0 = no limit (null in JSON) */
	int max_restarts;
	int simulate_data_delay_ms;    /* profiler.simulate_data_delay_ms: 0 = off */
} jobspec;

/* Fills *out from an effective spec: one jobspec_normalize would return
 * unchanged (every key present, canonical spellings). Returns 0, or -EINVAL
 * with *err filled (status 422, field = first key that is missing or not in
 * effective form) if spec is not one; *out is then unspecified. */
int jobspec_from_json(const json_t *spec, jobspec *out, jobspec_error *err);

/* What jobspec_resolve_epochs knows of a dataset: the totals of its
 * prepare stats ("tokens", "sentences", "documents"); tokens 0 = not known
 * yet. */
typedef struct jobspec_epoch_source {
	uint64_t tokens, sentences, documents;
} jobspec_epoch_source;

/* Training by epochs (training_args.max_steps -1, as in HF): replaces
 * max_steps in spec (an effective spec) with
 * ceil(num_train_epochs * sequences / (batch * accumulation * gpus)), where
 * sequences is jobspec_estimate_sequences() of src. Returns 0 (also when
 * max_steps is not -1: nothing to do), or -EINVAL with *err filled (422)
 * when src is NULL or has no tokens, the steps exceed 2^40, or
 * warmup_steps exceeds them; spec is then unchanged. */
int jobspec_resolve_epochs(json_t *spec, const jobspec_epoch_source *src, jobspec_error *err);

/* Sequences per epoch the loader is expected to pack from src at this
 * max_seq_length: an estimate from the totals (the corpus cut into samples
 * of the target, or whole sentences per sample with NSP or
 * drop_long_sentences; short_seq_prob's shorter targets); the loader logs
 * the exact count. */
double jobspec_estimate_sequences(const jobspec_epoch_source *src, int max_seq_length, bool nsp,
				  double short_seq_prob, bool drop_long_sentences);

/* The JSON Schema (draft 2020-12, as OpenAPI 3.1 uses) of a submitted job
 * spec, generated from the same table jobspec_normalize validates with:
 * docs/openapi.yaml's JobSpecInput is this object. Caller owns; NULL on
 * out of memory. */
json_t *jobspec_schema(void);

/* The resolved default of mlm.max_predictions_per_seq: the masked count at
 * mlm_probability rounded up to a multiple of 4, at most max_seq_length
 * (20 at 128 and 80 at 512 for 0.15, as in Google's BERT recipe). */
int jobspec_default_max_predictions(int max_seq_length, double mlm_probability);

/* The dimensions of model.preset name into dims: hidden_size,
 * num_hidden_layers, num_attention_heads, intermediate_size. 0, or -ENOENT
 * when name is not a preset. */
int jobspec_preset_dims(const char *name, int dims[4]);
/* The preset with exactly these dimensions (same order), or NULL. */
const char *jobspec_preset_of(const int dims[4]);

#endif
