/* hf — moves BERT weights between bertd's fused layout and HuggingFace's
 * BertForMaskedLM / BertForPreTraining safetensors naming, both ways.
 *
 * init_from reads a directory holding config.json + model.safetensors, or
 * a bertd training checkpoint (worker/checkpoint.h; weights only). Export
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

#include "worker/model.h"
#include "worker/safetensors.h"

/* Reads dir/config.json into cfg (over HF BertConfig defaults). */
int hf_read_config(const char *dir, bert_config *cfg, char *err, size_t errlen);
/* Copies every parameter of m from f (HF names, optional "bert." prefix).
 * -EINVAL naming the first missing or mis-shaped tensor. */
int hf_load_weights(bert_model *m, const st_file *f, char *err, size_t errlen);
/* Creates a model from dir: an HF BERT directory (config.json present) or a
 * complete bertd checkpoint (state.json present), whose parameters only are
 * taken. Caller owns *out. -EINVAL with err naming dir and what is missing
 * or wrong; err never quotes the files' contents. */
int hf_init_from(bert_model **out, const char *dir, char *err, size_t errlen);
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
