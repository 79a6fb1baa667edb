/* safetensors — reader and writer for the HuggingFace safetensors format
 * (8-byte little-endian header length, JSON header, flat byte buffer).
 *
 * The reader trusts nothing: header length bounds, JSON shape, dtypes,
 * shapes versus byte ranges, offsets in range and non-overlapping are all
 * checked and a bad file is a clear error message, never a crash. The writer
 * writes tmp -> fsync -> rename -> fsync(dir). Never interprets tensor names;
 * hf.c and checkpoint.c give them meaning.
 */
#ifndef BERTD_WORKER_SAFETENSORS_H
#define BERTD_WORKER_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u << 20) /* same cap as the reference implementation */

typedef enum st_dtype { ST_F32, ST_F16, ST_BF16, ST_F64, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8,
                        ST_BOOL } st_dtype;

typedef struct st_tensor {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t begin, end; /* byte range within the data buffer */
} st_tensor;

typedef struct st_file {
    int n;
    st_tensor *tensors;
    json_t *metadata;     /* "__metadata__" object or NULL; owned */
    const uint8_t *data;  /* tensor bytes */
    size_t data_len;
    void *map;            /* mmap of the whole file, or NULL for st_parse */
    size_t map_len;
} st_file;

/* Parses an in-memory safetensors image (not copied: buf must outlive *out).
 * 0, or -EINVAL with a message in err. Caller owns *out (st_close). */
int st_parse(st_file **out, const void *buf, size_t len, char *err, size_t errlen);
/* mmaps and parses path. -errno for I/O, -EINVAL for a malformed file. */
int st_open(st_file **out, const char *path, char *err, size_t errlen);
/* A parser of an in-memory image into an st_file (st_parse, ptbin_parse). */
typedef int (*st_parse_fn)(st_file **out, const void *buf, size_t len, char *err, size_t errlen);
/* st_open with another parser: mmaps path, parses the mapping with parse,
 * and the st_file keeps the mapping (st_close unmaps it). Errors name path. */
int st_open_parsed(st_file **out, const char *path, st_parse_fn parse, char *err, size_t errlen);
void st_close(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name);
size_t st_numel(const st_tensor *t);
/* Copies tensor t as float32 (from F32, F16, BF16 or F64) into dst (n floats).
 * -EINVAL if n differs from the element count or the dtype is not a float. */
int st_read_f32(const st_file *f, const st_tensor *t, float *dst, size_t n);

typedef struct st_entry {
    const char *name;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const float *data; /* F32, numel = product of shape */
} st_entry;

/* Writes entries (F32) as a safetensors file, atomically (tmp, fsync, rename,
 * fsync dir). metadata may be NULL (string values only). 0 or -errno. */
int st_write(const char *path, const st_entry *entries, int n, const json_t *metadata);

/* fsyncs a directory so a rename inside it is durable. 0 or -errno. */
int st_fsync_dir(const char *dir);

#endif
