/* convert — one training checkpoint (worker/checkpoint.h) into a
 * HuggingFace model directory, the same files the end of a job exports
 * (worker/hf.h: config.json, model.safetensors, vocab.txt,
 * tokenizer_config.json, special_tokens_map.json).
 *
 * Run as `bertd-worker --export CKPT_DIR OUT_DIR [--dataset DIR]`: by the
 * daemon for GET /v1/jobs/{id}/checkpoints/{step}/export (a child with a
 * deadline, so the daemon itself never runs model code) and by `bertd
 * export`. The vocab and its casing come from the dataset the job trained
 * on: --dataset, or the dataset_dir of the job file two levels above the
 * checkpoint (<job>/checkpoints/ckpt-N -> <job>/job.json). Reads the
 * checkpoint, writes only under OUT_DIR (built as OUT_DIR.tmp, renamed into
 * place); never trains, never talks to the daemon.
 */
#ifndef BERTD_WORKER_CONVERT_H
#define BERTD_WORKER_CONVERT_H

#include <stddef.h>

/* Writes the HF export of the complete checkpoint ckpt_dir into out_dir,
 * which must not exist yet. dataset_dir NULL: found from the job file (see
 * above). 0, or a negative errno with err saying what is wrong (-EINVAL a
 * bad or incomplete checkpoint or dataset, -EEXIST out_dir exists). */
int convert_checkpoint(const char *ckpt_dir, const char *out_dir, const char *dataset_dir, char *err,
		       size_t errlen);

/* The process: argv is bertd-worker's, argv[1] "--export". Prints errors
 * to stderr; returns the exit status (0, or BERTD_EXIT_BAD_CONFIG /
 * BERTD_EXIT_IO). */
int convert_main(int argc, char **argv);

#endif
