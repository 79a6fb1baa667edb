/* rawcorpus — a pre-tokenized corpus as three flat little-endian arrays in a
 * directory (meta.txt, tokens.bin, sent_off.bin, doc_off.bin), mmap'ed into
 * a corpus_view: bertd-loader --raw input for benchmarks and hand runs
 * (training jobs read token shards, shard.h); its layout is
 * documented in docs/formats.md. Produced by bench/loader_hf.py.
 *
 * Must never copy the arrays: a loader process maps them read-only.
 */
#ifndef BERTD_LOADER_RAWCORPUS_H
#define BERTD_LOADER_RAWCORPUS_H

#include <stddef.h>

#include "loader/corpus.h"

typedef struct rawcorpus {
	corpus_view view;
	void *maps[3];     /* tokens, sent_off, doc_off */
	size_t lens[3];
} rawcorpus;

/* Maps dir. Returns 0, -ENOENT for a missing file, -EBADMSG for a meta.txt or
 * array size that does not add up (message logged), or a negative errno. */
int rawcorpus_open(rawcorpus *rc, const char *dir);
void rawcorpus_close(rawcorpus *rc);

#endif
