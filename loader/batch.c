/* batch — slot layout arithmetic for batch.h. Pure; no I/O. */
#include "loader/batch.h"

#include <errno.h>
#include <string.h>

static uint64_t align_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

int batch_layout_init(batch_layout *l, uint32_t B, uint32_t T, uint32_t P)
{
	if (B == 0 || T == 0 || P == 0 || P > T)
		return -EINVAL;
	uint64_t off = sizeof(batch_header);
	uint64_t bt = (uint64_t)B * T * 4, bp = (uint64_t)B * P * 4, b = (uint64_t)B * 4;
	uint64_t o[7];
	uint64_t sizes[7] = {bt, bt, b, bp, bp, b, b};
	for (int i = 0; i < 7; i++) {
		off = align_up(off, BATCH_ARRAY_ALIGN);
		o[i] = off;
		off += sizes[i];
	}
	off = align_up(off, BATCH_ALIGN);
	if (off > (1ull << 30))
		return -EOVERFLOW;
	l->B = B;
	l->T = T;
	l->P = P;
	l->off_input_ids = (uint32_t)o[0];
	l->off_token_type_ids = (uint32_t)o[1];
	l->off_seq_lens = (uint32_t)o[2];
	l->off_mlm_positions = (uint32_t)o[3];
	l->off_mlm_labels = (uint32_t)o[4];
	l->off_nsp_labels = (uint32_t)o[5];
	l->off_n_pred = (uint32_t)o[6];
	l->slot_bytes = (uint32_t)off;
	return 0;
}

int batch_header_check(const batch_header *h, const batch_layout *l)
{
	if (h->magic != BATCH_MAGIC || h->version != BATCH_VERSION)
		return -EPROTO;
	if (h->n_seq != l->B || h->max_seq_len != l->T || h->max_pred != l->P ||
	    h->slot_bytes != l->slot_bytes || h->off_input_ids != l->off_input_ids ||
	    h->off_token_type_ids != l->off_token_type_ids || h->off_seq_lens != l->off_seq_lens ||
	    h->off_mlm_positions != l->off_mlm_positions || h->off_mlm_labels != l->off_mlm_labels ||
	    h->off_nsp_labels != l->off_nsp_labels || h->off_n_pred != l->off_n_pred)
		return -EPROTO;
	return 0;
}

void batch_header_init(batch_header *h, const batch_layout *l, uint64_t global, uint32_t G,
		       uint32_t M, int nsp)
{
	memset(h, 0, sizeof(*h));
	h->magic = BATCH_MAGIC;
	h->version = BATCH_VERSION;
	h->global = global;
	h->seq = global / G;
	h->rank = (uint32_t)(global % G);
	h->micro = (uint32_t)((global / G) % M);
	h->step = global / ((uint64_t)G * M);
	h->n_seq = l->B;
	h->max_seq_len = l->T;
	h->max_pred = l->P;
	h->flags = nsp ? BATCH_FLAG_NSP : 0;
	h->off_input_ids = l->off_input_ids;
	h->off_token_type_ids = l->off_token_type_ids;
	h->off_seq_lens = l->off_seq_lens;
	h->off_mlm_positions = l->off_mlm_positions;
	h->off_mlm_labels = l->off_mlm_labels;
	h->off_nsp_labels = l->off_nsp_labels;
	h->off_n_pred = l->off_n_pred;
	h->slot_bytes = l->slot_bytes;
}

void batch_zero_gaps(void *slot, const batch_layout *l)
{
	uint8_t *base = slot;
	const uint32_t ends[7][2] = {
		{sizeof(batch_header), l->off_input_ids},
		{l->off_input_ids + l->B * l->T * 4, l->off_token_type_ids},
		{l->off_token_type_ids + l->B * l->T * 4, l->off_seq_lens},
		{l->off_seq_lens + l->B * 4, l->off_mlm_positions},
		{l->off_mlm_positions + l->B * l->P * 4, l->off_mlm_labels},
		{l->off_mlm_labels + l->B * l->P * 4, l->off_nsp_labels},
		{l->off_nsp_labels + l->B * 4, l->off_n_pred},
	};
	for (int i = 0; i < 7; i++)
		memset(base + ends[i][0], 0, ends[i][1] - ends[i][0]);
	uint32_t tail = l->off_n_pred + l->B * 4;
	memset(base + tail, 0, l->slot_bytes - tail);
}
