/* ptbin — reads the tensor table of a PyTorch checkpoint (torch.save's zip
 * format, as transformers' save_pretrained(safe_serialization=False) writes
 * pytorch_model.bin) without executing anything.
 *
 * The file's data.pkl is run by a pickle machine that knows only what a
 * state dict of tensors needs: dicts (plain or collections.OrderedDict),
 * tuples, strings, integers, None/True/False, the memo, persistent ids
 * naming storages, and torch._utils._rebuild_tensor_v2 over the storage
 * types of float32, float16, bfloat16 (and int64, for buffers such as
 * position_ids that old checkpoints carry). Any other global, any other
 * opcode, a compressed zip entry or a non-contiguous tensor is refused with
 * an error naming the file; the error never quotes the file's bytes.
 *
 * The result is an st_file (worker/safetensors.h) over the mmap'd zip:
 * each tensor's bytes are read in place from its storage entry, so hf.c
 * reads both formats through one interface. Never writes, never allocates
 * tensor data.
 */
#ifndef BERTD_WORKER_PTBIN_H
#define BERTD_WORKER_PTBIN_H

#include <stddef.h>

#include "worker/safetensors.h"

/* Parses an in-memory torch zip image (not copied: buf must outlive *out).
 * 0, or -EINVAL with a message in err (what is wrong, never the bytes).
 * Caller owns *out (st_close). */
int ptbin_parse(st_file **out, const void *buf, size_t len, char *err, size_t errlen);
/* mmaps and parses path; err starts with path. -errno for I/O, -EINVAL for
 * a file that is not a state dict this reader accepts. */
int ptbin_open(st_file **out, const char *path, char *err, size_t errlen);

#endif
