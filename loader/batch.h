/* batch — the fixed-size batch slot a loader writes into a ring and a worker
 * copies to its device (docs/formats.md).
 *
 * A slot is a batch_header followed by six arrays, each starting on a 64-byte
 * boundary; the whole slot is a multiple of 4 KiB so every slot of a ring can
 * be page-aligned and cudaHostRegister'ed. Dimension letters:
 *   B = sequences per batch (per_device_train_batch_size)
 *   T = max_seq_length
 *   P = max_predictions_per_seq (masked positions kept per sequence)
 * All integers are host-endian (little-endian on every supported machine).
 *
 * This header describes memory only; it must never grow pointers (slots live
 * in shared memory mapped at different addresses in every process).
 */
#ifndef BERTD_LOADER_BATCH_H
#define BERTD_LOADER_BATCH_H

#include <stddef.h>
#include <stdint.h>

#define BATCH_MAGIC 0x48435442u /* "BTCH" */
#define BATCH_VERSION 1u
#define BATCH_ALIGN 4096u       /* slot size and placement granularity */
#define BATCH_ARRAY_ALIGN 64u   /* each array's offset inside the slot */
#define BATCH_LABEL_NONE (-1)   /* mlm_labels entry past a sequence's n_pred */
#define BATCH_FLAG_NSP 1u       /* nsp_labels is meaningful */

/* 128 bytes, at offset 0 of every slot. Offsets are from the slot start. */
typedef struct batch_header {
	uint32_t magic;          /* BATCH_MAGIC */
	uint32_t version;        /* BATCH_VERSION */
	uint64_t seq;            /* position in this rank's stream: global / G */
	uint64_t global;         /* global batch number: (step*M + micro)*G + rank */
	uint64_t step;           /* optimizer step this batch belongs to */
	uint32_t micro;          /* micro-batch inside the step, < M */
	uint32_t rank;           /* consumer rank, < G */
	uint64_t epoch;          /* epoch of the batch's first sequence */
	uint32_t n_seq;          /* B: sequences in the batch (always full) */
	uint32_t max_seq_len;    /* T */
	uint32_t max_pred;       /* P */
	uint32_t flags;          /* BATCH_FLAG_* */
	uint32_t n_tokens;       /* non-pad tokens summed over the batch */
	uint32_t n_pred;         /* masked positions summed over the batch */
	uint32_t off_input_ids;      /* int32 (B, T), pad id after seq_lens[b] */
	uint32_t off_token_type_ids; /* int32 (B, T), 0 for segment A, 1 for B, 0 pad */
	uint32_t off_seq_lens;       /* int32 (B,), tokens incl. [CLS]/[SEP] */
	uint32_t off_mlm_positions;  /* int32 (B, P), ascending, 0 past n_pred */
	uint32_t off_mlm_labels;     /* int32 (B, P), original ids, BATCH_LABEL_NONE past n_pred */
	uint32_t off_nsp_labels;     /* int32 (B,), 1 = B is a random next segment */
	uint32_t off_n_pred;         /* int32 (B,), masked positions per sequence */
	uint32_t slot_bytes;         /* total slot size, multiple of BATCH_ALIGN */
	uint8_t reserved[24];
} batch_header;

_Static_assert(sizeof(batch_header) == 128, "batch_header is part of the slot format");

/* Where each array sits for a given geometry; the same numbers go into every
 * header written with it. */
typedef struct batch_layout {
	uint32_t B, T, P;
	uint32_t off_input_ids, off_token_type_ids, off_seq_lens;
	uint32_t off_mlm_positions, off_mlm_labels, off_nsp_labels, off_n_pred;
	uint32_t slot_bytes;
} batch_layout;

/* Computes the layout for (B, T, P). Returns 0, or -EINVAL when a dimension is
 * zero or P > T, or -EOVERFLOW when the slot would exceed 1 GiB. */
int batch_layout_init(batch_layout *l, uint32_t B, uint32_t T, uint32_t P);

/* Starts a slot's header for global batch number global of a job with G
 * consumer ranks and M micro-batches per step: zeroed, then magic, version,
 * the position (seq, rank, micro, step), the dimensions and offsets of l and
 * the NSP flag. The builder fills the epoch and counts. */
void batch_header_init(batch_header *h, const batch_layout *l, uint64_t global, uint32_t G,
		       uint32_t M, int nsp);

/* Zeroes a built slot's alignment gaps and tail, so equal batches are equal
 * bytes. */
void batch_zero_gaps(void *slot, const batch_layout *l);

/* Checks that a slot's header is well formed and agrees with l: magic,
 * version, dimensions and offsets. Returns 0 or -EPROTO. */
int batch_header_check(const batch_header *h, const batch_layout *l);

#endif
