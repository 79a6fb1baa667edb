/* safetensors — see safetensors.h. */
#include "worker/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct { const char *name; st_dtype dt; size_t size; } dtypes[] = {
    {"F32", ST_F32, 4}, {"F16", ST_F16, 2}, {"BF16", ST_BF16, 2}, {"F64", ST_F64, 8},
    {"I64", ST_I64, 8}, {"I32", ST_I32, 4}, {"I16", ST_I16, 2},   {"I8", ST_I8, 1},
    {"U8", ST_U8, 1},   {"BOOL", ST_BOOL, 1},
};

size_t st_numel(const st_tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

void st_close(st_file *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    json_decref(f->metadata);
    if (f->map)
        munmap(f->map, f->map_len);
    free(f);
}

static int cmp_begin(const void *a, const void *b)
{
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

int st_parse(st_file **out, const void *buf, size_t len, char *err, size_t errlen)
{
    int rc = -EINVAL;
    json_t *root = NULL;
    st_tensor **order = NULL;
    st_file *f = calloc(1, sizeof *f);
    if (!f)
        return -ENOMEM;
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); rc = -EINVAL; goto out; } while (0)
    if (len < 8)
        BAD("safetensors: file of %zu bytes is shorter than the 8-byte header length", len);
    const uint8_t *p = buf;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | p[i];
    /* The length is the file's first 8 bytes: never print it (init_from may
     * name a file that is no safetensors at all, and its bytes are not ours
     * to echo), nor jansson's text, which quotes what it choked on. */
    if (hlen > ST_MAX_HEADER)
        BAD("safetensors: not a safetensors file (its header length is over the %u-byte limit)",
            ST_MAX_HEADER);
    if (hlen > len - 8)
        BAD("safetensors: not a safetensors file (its header length runs past the end of the "
            "%zu-byte file)", len);
    if (hlen < 2)
        BAD("safetensors: not a safetensors file (its header is too short for a JSON object)");
    json_error_t jerr;
    root = json_loadb((const char *)p + 8, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        BAD("safetensors: header is not valid JSON (byte %d)", jerr.position);
    if (!json_is_object(root))
        BAD("safetensors: header is not a JSON object");
    f->data = p + 8 + hlen;
    f->data_len = len - 8 - hlen;
    size_t cap = json_object_size(root);
    f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
    if (!f->tensors) {
        rc = -ENOMEM;
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val))
                BAD("safetensors: __metadata__ is not an object");
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv))
                    BAD("safetensors: __metadata__.%s is not a string", mk);
            }
            f->metadata = json_incref(val);
            continue;
        }
        if (!json_is_object(val))
            BAD("safetensors: tensor '%s' entry is not an object", key);
        json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
               *jo = json_object_get(val, "data_offsets");
        if (!json_is_string(jd))
            BAD("safetensors: tensor '%s' has no dtype string", key);
        st_tensor *t = &f->tensors[f->n];
        size_t esz = 0;
        for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
            if (strcmp(dtypes[i].name, json_string_value(jd)) == 0) {
                t->dtype = dtypes[i].dt;
                esz = dtypes[i].size;
            }
        if (!esz)
            BAD("safetensors: tensor '%s' has unsupported dtype '%s'", key, json_string_value(jd));
        if (!json_is_array(js) || json_array_size(js) > ST_MAX_DIMS)
            BAD("safetensors: tensor '%s' shape is not an array of at most %d dims", key,
                ST_MAX_DIMS);
        t->ndim = (int)json_array_size(js);
        size_t numel = 1;
        for (int i = 0; i < t->ndim; i++) {
            json_t *d = json_array_get(js, i);
            if (!json_is_integer(d) || json_integer_value(d) < 0 ||
                json_integer_value(d) > (json_int_t)1 << 40)
                BAD("safetensors: tensor '%s' shape[%d] is not a sane non-negative integer",
                    key, i);
            t->shape[i] = json_integer_value(d);
            if (t->shape[i] && numel > ((size_t)1 << 50) / (size_t)t->shape[i])
                BAD("safetensors: tensor '%s' shape overflows", key);
            numel *= (size_t)t->shape[i];
        }
        if (!json_is_array(jo) || json_array_size(jo) != 2 ||
            !json_is_integer(json_array_get(jo, 0)) || !json_is_integer(json_array_get(jo, 1)))
            BAD("safetensors: tensor '%s' data_offsets is not [begin, end]", key);
        json_int_t b = json_integer_value(json_array_get(jo, 0)),
                   e = json_integer_value(json_array_get(jo, 1));
        if (b < 0 || e < b || (uint64_t)e > f->data_len)
            BAD("safetensors: tensor '%s' data_offsets [%lld, %lld] outside the %zu data bytes",
                key, (long long)b, (long long)e, f->data_len);
        if ((size_t)(e - b) != numel * esz)
            BAD("safetensors: tensor '%s' holds %lld bytes but its shape and dtype need %zu",
                key, (long long)(e - b), numel * esz);
        t->begin = (size_t)b;
        t->end = (size_t)e;
        t->name = strdup(key);
        if (!t->name) {
            rc = -ENOMEM;
            goto out;
        }
        f->n++;
    }
    order = malloc((f->n ? f->n : 1) * sizeof *order);
    if (!order) {
        rc = -ENOMEM;
        goto out;
    }
    for (int i = 0; i < f->n; i++)
        order[i] = &f->tensors[i];
    qsort(order, f->n, sizeof *order, cmp_begin);
    for (int i = 1; i < f->n; i++)
        if (order[i]->begin < order[i - 1]->end)
            BAD("safetensors: tensors '%s' and '%s' overlap", order[i - 1]->name, order[i]->name);
    rc = 0;
    *out = f;
    f = NULL;
#undef BAD
out:
    free(order);
    json_decref(root);
    st_close(f);
    return rc;
}

int st_open_parsed(st_file **out, const char *path, st_parse_fn parse, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        return -e;
    }
    size_t len = (size_t)st.st_size;
    void *map = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (len && map == MAP_FAILED) {
        int e = errno;
        snprintf(err, errlen, "%s: mmap: %s", path, strerror(e));
        return -e;
    }
    char perr[400] = "";
    st_file *f = NULL;
    int rc = parse(&f, len ? map : "", len, perr, sizeof perr);
    if (rc < 0) {
        snprintf(err, errlen, "%s: %s", path, rc == -ENOMEM ? strerror(ENOMEM) : perr);
        if (len)
            munmap(map, len);
        return rc;
    }
    f->map = len ? map : NULL;
    f->map_len = len;
    *out = f;
    return 0;
}

int st_open(st_file **out, const char *path, char *err, size_t errlen)
{
    return st_open_parsed(out, path, st_parse, err, errlen);
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

static float half_to_float(uint16_t h)
{
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1F, m = h & 0x3FF, bits;
    if (e == 0) {
        if (m == 0) {
            bits = s;
        } else { /* subnormal: renormalise */
            e = 113;
            while (!(m & 0x400)) {
                m <<= 1;
                e--;
            }
            bits = s | (e << 23) | ((m & 0x3FF) << 13);
        }
    } else if (e == 31) {
        bits = s | 0x7F800000u | (m << 13);
    } else {
        bits = s | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

int st_read_f32(const st_file *f, const st_tensor *t, float *dst, size_t n)
{
    if (st_numel(t) != n)
        return -EINVAL;
    const uint8_t *src = f->data + t->begin;
    for (size_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case ST_F32: {
            uint32_t b = (uint32_t)src[4 * i] | (uint32_t)src[4 * i + 1] << 8 |
                         (uint32_t)src[4 * i + 2] << 16 | (uint32_t)src[4 * i + 3] << 24;
            memcpy(&dst[i], &b, 4);
            break;
        }
        case ST_F16:
            dst[i] = half_to_float((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
            break;
        case ST_BF16: {
            uint32_t b = (uint32_t)(src[2 * i] | src[2 * i + 1] << 8) << 16;
            memcpy(&dst[i], &b, 4);
            break;
        }
        case ST_F64: {
            double d;
            memcpy(&d, src + 8 * i, 8);
            dst[i] = (float)d;
            break;
        }
        default:
            return -EINVAL;
        }
    }
    return 0;
}

int st_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return rc;
}

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int st_write(const char *path, const st_entry *entries, int n, const json_t *metadata)
{
    int rc = 0, fd = -1;
    char *hdr = NULL, *tmp = NULL, *dcopy = NULL;
    json_t *root = json_object();
    if (!root)
        return -ENOMEM;
    if (metadata)
        json_object_set(root, "__metadata__", (json_t *)metadata);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        size_t numel = 1;
        for (int d = 0; d < entries[i].ndim; d++) {
            json_array_append_new(shape, json_integer(entries[i].shape[d]));
            numel *= (size_t)entries[i].shape[d];
        }
        json_object_set_new(root, entries[i].name,
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype", "F32", "shape", shape,
                                      "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + numel * 4)));
        off += numel * 4;
    }
    hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!hdr) {
        rc = -ENOMEM;
        goto out;
    }
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7; /* 8-byte aligned data */
    if (asprintf(&tmp, "%s.tmp", path) < 0) {
        tmp = NULL;
        rc = -ENOMEM;
        goto out;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = -errno;
        goto out;
    }
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    if ((rc = write_all(fd, lenbuf, 8)) < 0 || (rc = write_all(fd, hdr, hlen)) < 0 ||
        (rc = write_all(fd, "        ", padded - hlen)) < 0)
        goto out;
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < entries[i].ndim; d++)
            numel *= (size_t)entries[i].shape[d];
        /* little-endian hosts only (x86-64, aarch64): floats go out as they are */
        if ((rc = write_all(fd, entries[i].data, numel * 4)) < 0)
            goto out;
    }
    if (fsync(fd) < 0) {
        rc = -errno;
        goto out;
    }
    if (close(fd) < 0) {
        fd = -1;
        rc = -errno;
        goto out;
    }
    fd = -1;
    if (rename(tmp, path) < 0) {
        rc = -errno;
        goto out;
    }
    dcopy = strdup(path);
    if (!dcopy) {
        rc = -ENOMEM;
        goto out;
    }
    rc = st_fsync_dir(dirname(dcopy));
out:
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    free(dcopy);
    free(tmp);
    free(hdr);
    json_decref(root);
    return rc;
}
