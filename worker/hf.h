/* hf — moves BERT weights between bertd's fused layout and HuggingFace's
 * BertForMaskedLM / BertForPreTraining safetensors naming, both ways.
 *
 * init_from reads an HF directory (config.json with model.safetensors,
 * sharded safetensors, or pytorch_model.bin through ptbin.c, sharded or
 * not), or a bertd training checkpoint (worker/checkpoint.h; weights only);
 * the job's nsp decides the heads, a missing head is initialised as
 * transformers does. Export
 * writes config.json, model.safetensors and, with a vocab, vocab.txt,
 * tokenizer_config.json and special_tokens_map.json, so
 * transformers.BertForMaskedLM.from_pretrained and AutoTokenizer load them
 * and tokenize as the job's data was tokenized. The tied decoder
 * weight (cls.predictions.decoder.weight) is never stored separately: on
 * import it is ignored if present (it must equal the word embeddings), on
 * export it is left out as HF itself does. Never trains, never allocates
 * the model's buffers itself beyond bert_model_create.
 */
#ifndef BERTD_WORKER_HF_H
#define BERTD_WORKER_HF_H

#include <stdbool.h>
#include <stdint.h>

#include "worker/model.h"
#include "worker/safetensors.h"

/* Reads dir/config.json into cfg (over HF BertConfig defaults). */
int hf_read_config(const char *dir, bert_config *cfg, char *err, size_t errlen);
/* Copies every parameter of m from f (HF names, optional "bert." prefix).
 * -EINVAL naming the first missing or mis-shaped tensor. */
int hf_load_weights(bert_model *m, const st_file *f, char *err, size_t errlen);
/* Creates a model from dir: an HF BERT directory (config.json with
 * model.safetensors, sharded safetensors (model.safetensors.index.json),
 * pytorch_model.bin (torch's zip format, read by ptbin.c without running
 * it) or its index, tried in that order, as transformers does), or a
 * complete bertd checkpoint (state.json present), whose parameters only
 * are taken. nsp 0 or 1 is the job's mlm.nsp and decides the model's heads,
 * never the checkpoint: a checkpoint's pooler and NSP head are dropped
 * without nsp; with nsp a checkpoint lacking them, and any checkpoint
 * lacking the MLM head (BertModel), gets them initialised as transformers'
 * _init_weights does (weights N(0, initializer_range) drawn from seed,
 * biases 0, LayerNorm 1/0). nsp -1: as the checkpoint (BertForPreTraining
 * or cls.seq_relationship.* present). Caller owns *out. -EINVAL with err
 * naming dir or the file and what is missing or wrong; err never quotes
 * the files' contents. */
int hf_init_from(bert_model **out, const char *dir, int nsp, uint64_t seed, char *err,
                 size_t errlen);
/* NULL when dir is a directory hf_init_from can read by its files (config
 * and weights present: not whether they parse), else what is missing or why
 * it is refused (a TensorFlow- or Flax-only directory: the conversion to
 * run). A static string. The API checks init_from at submit with the same
 * rules (api/jobs.c). */
const char *hf_init_from_missing(const char *dir);
/* Writes dir/model.safetensors, dir/config.json and, if vocab_path is not
 * NULL, dir/vocab.txt plus the tokenizer files AutoTokenizer reads
 * (tokenizer_config.json: BertTokenizer, do_lower_case = lowercase,
 * model_max_length = max_position_embeddings; special_tokens_map.json).
 * lowercase is the setting the job's data was tokenized with. Creates dir if
 * needed. 0 or -errno. */
int hf_export(const bert_model *m, const char *dir, const char *vocab_path, bool lowercase,
              char *err, size_t errlen);

/* The HF tensors of m's config, in export order: name, shape, and where the
 * data lives in a parameter-shaped buffer (offset into params_memory layout). */
typedef struct hf_tensor {
    char name[96];
    int ndim;
    int64_t shape[2];
    size_t offset; /* floats from the start of the parameter buffer */
    size_t numel;
} hf_tensor;
/* Fills up to cap entries; returns the count (call with cap 0 to size). */
int hf_tensor_table(const bert_model *m, hf_tensor *out, int cap);

#endif
