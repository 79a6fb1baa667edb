/* ptbin — see ptbin.h.
 *
 * The zip container is read here, not through libzip or minizip: torch.save
 * stores every entry uncompressed (method 0, data aligned to 64 bytes), so
 * all a reader needs is the end-of-central-directory record (zip64 when the
 * archive is large), the central directory and each entry's local header,
 * after which a storage's bytes are read in place from the mmap. A library
 * would copy each entry into a buffer of its own (a second copy of a 1 GB
 * model), add a package to every install, and still leave the offsets to be
 * checked against the tensors; here every offset and size is checked
 * against the file's length before it is used, and a compressed or
 * encrypted entry is refused.
 *
 * The pickle machine allocates one node per value it builds, all freed
 * together; its stack, memo and node count are bounded by the pickle's
 * length, so any input ends in a result or an error.
 */
#include "worker/ptbin.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- zip ---------------------------------------------------------------- */

typedef struct zentry {
    const char *name; /* in the central directory, not NUL-terminated */
    size_t name_len;
    size_t off, size; /* the stored bytes */
} zentry;

typedef struct zip {
    const uint8_t *buf;
    size_t len;
    zentry *e;
    size_t n;
} zip;

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* In the zip64 extra field of a central entry, the 64-bit values replace
 * those of the fixed fields that read 0xFFFFFFFF, in this order. */
static int zip64_extra(const uint8_t *x, size_t xlen, bool want_usize, bool want_csize,
                       bool want_off, uint64_t *usize, uint64_t *csize, uint64_t *off)
{
    size_t i = 0;
    while (i + 4 <= xlen) {
        unsigned id = (unsigned)le(x + i, 2), sz = (unsigned)le(x + i + 2, 2);
        if (i + 4 + sz > xlen)
            return -1;
        if (id == 1) {
            const uint8_t *p = x + i + 4;
            size_t k = 0;
            if (want_usize) {
                if (k + 8 > sz) return -1;
                *usize = le(p + k, 8), k += 8;
            }
            if (want_csize) {
                if (k + 8 > sz) return -1;
                *csize = le(p + k, 8), k += 8;
            }
            if (want_off) {
                if (k + 8 > sz) return -1;
                *off = le(p + k, 8);
            }
            return 0;
        }
        i += 4 + sz;
    }
    return want_usize || want_csize || want_off ? -1 : 0;
}

static int zip_read(zip *z, char *err, size_t errlen)
{
    const uint8_t *b = z->buf;
    size_t len = z->len;
    if (len < 4 || le(b, 4) != 0x04034b50) {
        seterr(err, errlen, "not in PyTorch's zip format (a file from torch.save before "
               "PyTorch 1.6, or not a PyTorch file at all): load it with torch and save it again "
               "with save_pretrained");
        return -EINVAL;
    }
    /* the end record: 22 bytes plus a comment of at most 65535 */
    size_t eocd = SIZE_MAX;
    for (size_t back = 22; back <= len && back <= 22 + 65535; back++)
        if (le(b + len - back, 4) == 0x06054b50) {
            eocd = len - back;
            break;
        }
    if (eocd == SIZE_MAX) {
        seterr(err, errlen, "damaged zip archive (no end-of-central-directory record)");
        return -EINVAL;
    }
    uint64_t n = le(b + eocd + 10, 2), cd_size = le(b + eocd + 12, 4), cd_off = le(b + eocd + 16, 4);
    if (n == 0xFFFF || cd_size == 0xFFFFFFFF || cd_off == 0xFFFFFFFF) {
        /* zip64: a locator right before the end record points at the zip64 end record */
        if (eocd < 20 || le(b + eocd - 20, 4) != 0x07064b50) {
            seterr(err, errlen, "damaged zip archive (zip64 sizes without a zip64 locator)");
            return -EINVAL;
        }
        uint64_t z64 = le(b + eocd - 20 + 8, 8);
        if (z64 > len || len - z64 < 56 || le(b + z64, 4) != 0x06064b50) {
            seterr(err, errlen, "damaged zip archive (bad zip64 end record)");
            return -EINVAL;
        }
        n = le(b + z64 + 32, 8);
        cd_size = le(b + z64 + 40, 8);
        cd_off = le(b + z64 + 48, 8);
    }
    if (cd_off > len || cd_size > len - cd_off || n > cd_size / 46) {
        seterr(err, errlen, "damaged zip archive (central directory outside the file)");
        return -EINVAL;
    }
    z->e = calloc(n ? n : 1, sizeof *z->e);
    if (!z->e)
        return -ENOMEM;
    size_t p = cd_off, end = cd_off + cd_size;
    for (uint64_t i = 0; i < n; i++) {
        if (end - p < 46 || le(b + p, 4) != 0x02014b50) {
            seterr(err, errlen, "damaged zip archive (central directory entry %llu)",
                   (unsigned long long)i);
            return -EINVAL;
        }
        unsigned flags = (unsigned)le(b + p + 8, 2), method = (unsigned)le(b + p + 10, 2);
        uint64_t csize = le(b + p + 20, 4), usize = le(b + p + 24, 4), lho = le(b + p + 42, 4);
        size_t nl = le(b + p + 28, 2), xl = le(b + p + 30, 2), cl = le(b + p + 32, 2);
        if (end - p - 46 < nl + xl + cl) {
            seterr(err, errlen, "damaged zip archive (central directory entry %llu)",
                   (unsigned long long)i);
            return -EINVAL;
        }
        if (zip64_extra(b + p + 46 + nl, xl, usize == 0xFFFFFFFF, csize == 0xFFFFFFFF,
                        lho == 0xFFFFFFFF, &usize, &csize, &lho) < 0) {
            seterr(err, errlen, "damaged zip archive (zip64 field of entry %llu)",
                   (unsigned long long)i);
            return -EINVAL;
        }
        if (method != 0 || (flags & 1) || csize != usize) {
            seterr(err, errlen, "zip entry %llu is compressed or encrypted; torch.save stores "
                   "every entry as is, so this is not a file it wrote", (unsigned long long)i);
            return -EINVAL;
        }
        if (lho > len || len - lho < 30 || le(b + lho, 4) != 0x04034b50) {
            seterr(err, errlen, "damaged zip archive (local header of entry %llu)",
                   (unsigned long long)i);
            return -EINVAL;
        }
        uint64_t data = lho + 30 + le(b + lho + 26, 2) + le(b + lho + 28, 2);
        if (data > len || usize > len - data) {
            seterr(err, errlen, "damaged zip archive (entry %llu runs past the end of the file)",
                   (unsigned long long)i);
            return -EINVAL;
        }
        z->e[i] = (zentry){.name = (const char *)b + p + 46, .name_len = nl, .off = data,
                           .size = usize};
        p += 46 + nl + xl + cl;
    }
    z->n = n;
    return 0;
}

/* The entry named prefix + name (prefix_len bytes of prefix). */
static const zentry *zip_find(const zip *z, const char *prefix, size_t prefix_len,
                              const char *name, size_t name_len)
{
    for (size_t i = 0; i < z->n; i++) {
        const zentry *e = &z->e[i];
        if (e->name_len == prefix_len + name_len && memcmp(e->name, prefix, prefix_len) == 0 &&
            memcmp(e->name + prefix_len, name, name_len) == 0)
            return e;
    }
    return NULL;
}

/* ---- the pickle machine --------------------------------------------------- */

typedef enum vkind { V_MARK, V_NONE, V_BOOL, V_INT, V_STR, V_TUPLE, V_DICT, V_GLOBAL,
                     V_STORAGE, V_TENSOR } vkind;

/* The only callables a state dict needs. */
typedef enum gkind { G_REBUILD, G_ORDEREDDICT, G_STORAGE_F32, G_STORAGE_F16, G_STORAGE_BF16,
                     G_STORAGE_I64 } gkind;

#define PV_MAX_DIMS ST_MAX_DIMS

typedef struct pv {
    vkind k;
    int64_t i;         /* INT, BOOL; GLOBAL: gkind; STORAGE: st_dtype */
    const char *s;     /* STR (in the pickle), STORAGE key */
    size_t slen;
    struct pv **items; /* TUPLE: n items; DICT: n (key, value) pairs, 2n items */
    size_t n, cap;
    /* STORAGE: numel in i2; TENSOR: storage, offset, shape, strides */
    int64_t i2;
    struct pv *storage;
    int ndim;
    int64_t size[PV_MAX_DIMS], stride[PV_MAX_DIMS];
} pv;

typedef struct vm {
    const uint8_t *p, *end, *start;
    pv **all;          /* every node, for freeing */
    size_t n_all, cap_all;
    pv **stack;
    size_t sp, cap_stack;
    size_t *marks;     /* stack positions of the MARKs, innermost last (O(1) lookups) */
    size_t n_marks, cap_marks;
    pv **memo;
    size_t n_memo;     /* slots */
    size_t memo_len;   /* distinct indexes stored (what MEMOIZE uses) */
    char *err;
    size_t errlen;
    const char *what;  /* "data.pkl" */
} vm;

static pv mark_node = {.k = V_MARK};

static pv *node(vm *m, vkind k)
{
    if (m->n_all == m->cap_all) {
        size_t c = m->cap_all ? m->cap_all * 2 : 256;
        pv **a = realloc(m->all, c * sizeof *a);
        if (!a)
            return NULL;
        m->all = a;
        m->cap_all = c;
    }
    pv *v = calloc(1, sizeof *v);
    if (!v)
        return NULL;
    v->k = k;
    m->all[m->n_all++] = v;
    return v;
}

static int add_item(pv *v, pv *item)
{
    if (v->n == v->cap) {
        size_t c = v->cap ? v->cap * 2 : 8;
        pv **a = realloc(v->items, c * sizeof *a);
        if (!a)
            return -ENOMEM;
        v->items = a;
        v->cap = c;
    }
    v->items[v->n++] = item;
    return 0;
}

static void vm_free(vm *m)
{
    for (size_t i = 0; i < m->n_all; i++) {
        free(m->all[i]->items);
        free(m->all[i]);
    }
    free(m->all);
    free(m->stack);
    free(m->marks);
    free(m->memo);
}

#define FAIL(...) do { seterr(m->err, m->errlen, __VA_ARGS__); return -EINVAL; } while (0)

static int push(vm *m, pv *v)
{
    if (!v)
        return -ENOMEM;
    if (m->sp == m->cap_stack) {
        size_t c = m->cap_stack ? m->cap_stack * 2 : 64;
        pv **a = realloc(m->stack, c * sizeof *a);
        if (!a)
            return -ENOMEM;
        m->stack = a;
        m->cap_stack = c;
    }
    m->stack[m->sp++] = v;
    return 0;
}

static pv *pop(vm *m)
{
    return m->sp && m->stack[m->sp - 1] != &mark_node ? m->stack[--m->sp] : NULL;
}

/* The index of the topmost mark, or SIZE_MAX. */
static size_t last_mark(const vm *m)
{
    return m->n_marks ? m->marks[m->n_marks - 1] : SIZE_MAX;
}

static int push_mark(vm *m)
{
    if (m->n_marks == m->cap_marks) {
        size_t c = m->cap_marks ? m->cap_marks * 2 : 16;
        size_t *a = realloc(m->marks, c * sizeof *a);
        if (!a)
            return -ENOMEM;
        m->marks = a;
        m->cap_marks = c;
    }
    m->marks[m->n_marks++] = m->sp;
    return push(m, &mark_node);
}

/* Removes the topmost mark from the stack, the values above it moving
 * down one; returns where they now start, or SIZE_MAX without a mark. */
static size_t pop_mark(vm *m)
{
    if (!m->n_marks)
        return SIZE_MAX;
    size_t mk = m->marks[--m->n_marks];
    memmove(&m->stack[mk], &m->stack[mk + 1], (m->sp - mk - 1) * sizeof *m->stack);
    m->sp--;
    return mk;
}

static int take(vm *m, size_t n, const uint8_t **out)
{
    if ((size_t)(m->end - m->p) < n)
        FAIL("%s ends in the middle of an operation", m->what);
    *out = m->p;
    m->p += n;
    return 0;
}

static int memo_put(vm *m, uint64_t idx, pv *v)
{
    /* a memo index is at most the number of values made so far, and
     * those are bounded by the pickle's length */
    if (!v || v == &mark_node || idx > m->n_all + 1 || idx > (1u << 26))
        FAIL("%s stores a value under an index it never made", m->what);
    if (idx >= m->n_memo) {
        size_t c = (size_t)idx + 1 > m->n_memo * 2 ? (size_t)idx + 1 : m->n_memo * 2;
        pv **a = realloc(m->memo, c * sizeof *a);
        if (!a)
            return -ENOMEM;
        memset(a + m->n_memo, 0, (c - m->n_memo) * sizeof *a);
        m->memo = a;
        m->n_memo = c;
    }
    if (!m->memo[idx])
        m->memo_len++;
    m->memo[idx] = v;
    return 0;
}

static int memo_get(vm *m, uint64_t idx)
{
    if (idx >= m->n_memo || !m->memo[idx])
        FAIL("%s refers to a value it never stored", m->what);
    return push(m, m->memo[idx]);
}

static bool str_is(const pv *v, const char *s)
{
    return v && v->k == V_STR && v->slen == strlen(s) && memcmp(v->s, s, v->slen) == 0;
}

static int global(vm *m, const char *mod, size_t ml, const char *name, size_t nl)
{
    static const struct { const char *mod, *name; gkind g; } allowed[] = {
        {"torch._utils", "_rebuild_tensor_v2", G_REBUILD},
        {"collections", "OrderedDict", G_ORDEREDDICT},
        {"torch", "FloatStorage", G_STORAGE_F32},
        {"torch", "HalfStorage", G_STORAGE_F16},
        {"torch", "BFloat16Storage", G_STORAGE_BF16},
        {"torch", "LongStorage", G_STORAGE_I64},
    };
    for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++)
        if (ml == strlen(allowed[i].mod) && nl == strlen(allowed[i].name) &&
            memcmp(mod, allowed[i].mod, ml) == 0 && memcmp(name, allowed[i].name, nl) == 0) {
            pv *v = node(m, V_GLOBAL);
            if (!v)
                return -ENOMEM;
            v->i = allowed[i].g;
            return push(m, v);
        }
    FAIL("%s imports a global other than torch._utils._rebuild_tensor_v2, "
         "collections.OrderedDict and the float32/float16/bfloat16/int64 storage types: "
         "not a plain state dict of tensors, refused without running it", m->what);
}

static int get_int(const pv *v, int64_t *out)
{
    if (!v || (v->k != V_INT && v->k != V_BOOL))
        return -1;
    *out = v->i;
    return 0;
}

/* ('storage', <storage type>, key, location, numel) */
static int persistent_load(vm *m)
{
    pv *t = pop(m);
    if (!t || t->k != V_TUPLE || t->n != 5 || !str_is(t->items[0], "storage") ||
        t->items[1]->k != V_GLOBAL || t->items[1]->i < G_STORAGE_F32 ||
        t->items[2]->k != V_STR || t->items[3]->k != V_STR || t->items[4]->k != V_INT ||
        t->items[4]->i < 0)
        FAIL("%s has a persistent id that is not a storage of tensor data", m->what);
    pv *s = node(m, V_STORAGE);
    if (!s)
        return -ENOMEM;
    static const st_dtype dt[] = {[G_STORAGE_F32] = ST_F32, [G_STORAGE_F16] = ST_F16,
                                  [G_STORAGE_BF16] = ST_BF16, [G_STORAGE_I64] = ST_I64};
    s->i = dt[t->items[1]->i];
    s->s = t->items[2]->s;
    s->slen = t->items[2]->slen;
    s->i2 = t->items[4]->i;
    return push(m, s);
}

/* _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
 * backward_hooks[, metadata]) or OrderedDict(). */
static int reduce(vm *m)
{
    pv *args = pop(m), *fn = pop(m);
    if (!args || !fn || args->k != V_TUPLE || fn->k != V_GLOBAL)
        FAIL("%s calls something that is not an allowed global", m->what);
    if (fn->i == G_ORDEREDDICT) {
        if (args->n != 0)
            FAIL("%s builds an OrderedDict from arguments", m->what);
        return push(m, node(m, V_DICT));
    }
    if (fn->i != G_REBUILD)
        FAIL("%s calls a storage type directly", m->what);
    if (args->n != 6 && args->n != 7)
        FAIL("%s rebuilds a tensor with %zu arguments (6 or 7 expected)", m->what, args->n);
    pv *st = args->items[0], *sz = args->items[2], *sd = args->items[3];
    int64_t off;
    if (st->k != V_STORAGE || get_int(args->items[1], &off) < 0 || off < 0 ||
        sz->k != V_TUPLE || sd->k != V_TUPLE || sz->n != sd->n || sz->n > PV_MAX_DIMS ||
        args->items[5]->k != V_DICT || args->items[5]->n != 0)
        FAIL("%s rebuilds a tensor from arguments of the wrong kind", m->what);
    pv *t = node(m, V_TENSOR);
    if (!t)
        return -ENOMEM;
    t->storage = st;
    t->i = off;
    t->ndim = (int)sz->n;
    for (int d = 0; d < t->ndim; d++)
        if (get_int(sz->items[d], &t->size[d]) < 0 || get_int(sd->items[d], &t->stride[d]) < 0 ||
            t->size[d] < 0 || t->size[d] > ((int64_t)1 << 40) || t->stride[d] < 0)
            FAIL("%s rebuilds a tensor with a bad size or stride", m->what);
    return push(m, t);
}

static int setitems(vm *m, size_t from)
{
    if (from == 0 || (m->sp - from) % 2 != 0)
        FAIL("%s sets dict items without a dict or with an odd count", m->what);
    pv *d = m->stack[from - 1];
    if (d->k != V_DICT)
        FAIL("%s sets items on something that is not a dict", m->what);
    for (size_t i = from; i < m->sp; i++) {
        if (add_item(d, m->stack[i]) < 0)
            return -ENOMEM;
    }
    m->sp = from;
    return 0;
}

static int make_tuple(vm *m, size_t from)
{
    pv *t = node(m, V_TUPLE);
    if (!t)
        return -ENOMEM;
    for (size_t i = from; i < m->sp; i++) {
        if (add_item(t, m->stack[i]) < 0)
            return -ENOMEM;
    }
    m->sp = from;
    return push(m, t);
}

static int string(vm *m, size_t n)
{
    const uint8_t *s;
    int rc = take(m, n, &s);
    if (rc < 0)
        return rc;
    pv *v = node(m, V_STR);
    if (!v)
        return -ENOMEM;
    v->s = (const char *)s;
    v->slen = n;
    return push(m, v);
}

static int integer(vm *m, int64_t i)
{
    pv *v = node(m, V_INT);
    if (!v)
        return -ENOMEM;
    v->i = i;
    return push(m, v);
}

/* Runs the pickle to STOP; *out is the state dict. */
static int vm_run(vm *m, pv **out)
{
    const uint8_t *a;
    int rc = 0;
    while (rc == 0) {
        if (m->p >= m->end)
            FAIL("%s ends without a STOP", m->what);
        size_t at = (size_t)(m->p - m->start), mk;
        uint8_t op = *m->p++;
        switch (op) {
        case 0x80: /* PROTO */
            if ((rc = take(m, 1, &a)) == 0 && (a[0] < 2 || a[0] > 5))
                FAIL("%s uses pickle protocol %u (2 to 5 are read)", m->what, a[0]);
            break;
        case 0x95: /* FRAME: a length hint */
            rc = take(m, 8, &a);
            break;
        case '.': { /* STOP */
            pv *v = pop(m);
            if (!v || v->k != V_DICT || m->sp != 0)
                FAIL("%s does not hold a dict of tensors", m->what);
            *out = v;
            return 0;
        }
        case '(': /* MARK */
            rc = push_mark(m);
            break;
        case ')': /* EMPTY_TUPLE */
            rc = push(m, node(m, V_TUPLE));
            break;
        case '}': /* EMPTY_DICT */
            rc = push(m, node(m, V_DICT));
            break;
        case 't': /* TUPLE: the values above the last mark */
            if ((mk = pop_mark(m)) == SIZE_MAX)
                FAIL("%s builds a tuple without a mark", m->what);
            rc = make_tuple(m, mk);
            break;
        case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
            size_t k = (size_t)(op - 0x84);
            mk = last_mark(m);
            if (m->sp < k || (mk != SIZE_MAX && mk >= m->sp - k))
                FAIL("%s builds a tuple from too few values", m->what);
            rc = make_tuple(m, m->sp - k);
            break;
        }
        case 'q': /* BINPUT */
            if ((rc = take(m, 1, &a)) == 0)
                rc = memo_put(m, a[0], m->sp ? m->stack[m->sp - 1] : NULL);
            break;
        case 'r': /* LONG_BINPUT */
            if ((rc = take(m, 4, &a)) == 0)
                rc = memo_put(m, le(a, 4), m->sp ? m->stack[m->sp - 1] : NULL);
            break;
        case 0x94: /* MEMOIZE */
            rc = memo_put(m, m->memo_len, m->sp ? m->stack[m->sp - 1] : NULL);
            break;
        case 'h': /* BINGET */
            if ((rc = take(m, 1, &a)) == 0)
                rc = memo_get(m, a[0]);
            break;
        case 'j': /* LONG_BINGET */
            if ((rc = take(m, 4, &a)) == 0)
                rc = memo_get(m, le(a, 4));
            break;
        case 'X': /* BINUNICODE */
            if ((rc = take(m, 4, &a)) == 0)
                rc = string(m, le(a, 4));
            break;
        case 0x8c: /* SHORT_BINUNICODE */
            if ((rc = take(m, 1, &a)) == 0)
                rc = string(m, a[0]);
            break;
        case 0x8d: /* BINUNICODE8 */
            if ((rc = take(m, 8, &a)) == 0) {
                uint64_t n = le(a, 8);
                if (n > (uint64_t)(m->end - m->p))
                    FAIL("%s ends in the middle of a string", m->what);
                rc = string(m, (size_t)n);
            }
            break;
        case 'J': /* BININT */
            if ((rc = take(m, 4, &a)) == 0)
                rc = integer(m, (int32_t)(uint32_t)le(a, 4));
            break;
        case 'K': /* BININT1 */
            if ((rc = take(m, 1, &a)) == 0)
                rc = integer(m, a[0]);
            break;
        case 'M': /* BININT2 */
            if ((rc = take(m, 2, &a)) == 0)
                rc = integer(m, (int64_t)le(a, 2));
            break;
        case 0x8a: { /* LONG1: n bytes, little-endian two's complement */
            if ((rc = take(m, 1, &a)) < 0)
                break;
            size_t n = a[0];
            if (n > 8)
                FAIL("%s holds an integer wider than 64 bits", m->what);
            if ((rc = take(m, n, &a)) < 0)
                break;
            uint64_t u = le(a, (int)n);
            if (n > 0 && n < 8 && (a[n - 1] & 0x80))
                u |= ~(uint64_t)0 << (8 * n);
            rc = integer(m, (int64_t)u);
            break;
        }
        case 'N': /* NONE */
            rc = push(m, node(m, V_NONE));
            break;
        case 0x88: case 0x89: { /* NEWTRUE, NEWFALSE */
            pv *v = node(m, V_BOOL);
            if (v)
                v->i = op == 0x88;
            rc = push(m, v);
            break;
        }
        case 'c': { /* GLOBAL: "module\nname\n" */
            const char *mod = (const char *)m->p;
            const char *nl1 = memchr(mod, '\n', (size_t)(m->end - m->p));
            const char *name = nl1 ? nl1 + 1 : NULL;
            const char *nl2 = name ? memchr(name, '\n', (size_t)((const char *)m->end - name)) : NULL;
            if (!nl2)
                FAIL("%s ends in the middle of a global's name", m->what);
            m->p = (const uint8_t *)nl2 + 1;
            rc = global(m, mod, (size_t)(nl1 - mod), name, (size_t)(nl2 - name));
            break;
        }
        case 0x93: { /* STACK_GLOBAL */
            pv *name = pop(m), *mod = pop(m);
            if (!name || !mod || name->k != V_STR || mod->k != V_STR)
                FAIL("%s imports a global named by something other than strings", m->what);
            rc = global(m, mod->s, mod->slen, name->s, name->slen);
            break;
        }
        case 'Q': /* BINPERSID */
            rc = persistent_load(m);
            break;
        case 'R': /* REDUCE */
            rc = reduce(m);
            break;
        case 's': /* SETITEM */
            if (m->sp < 3 || (last_mark(m) != SIZE_MAX && last_mark(m) >= m->sp - 3))
                FAIL("%s sets a dict item without a dict", m->what);
            rc = setitems(m, m->sp - 2);
            break;
        case 'u': /* SETITEMS */
            if ((mk = pop_mark(m)) == SIZE_MAX)
                FAIL("%s sets dict items without a mark", m->what);
            rc = setitems(m, mk);
            break;
        case 'b': { /* BUILD: an OrderedDict's attributes (state_dict's _metadata) */
            pv *state = pop(m);
            if (!state || (state->k != V_DICT && state->k != V_NONE) || !m->sp ||
                m->stack[m->sp - 1]->k != V_DICT)
                FAIL("%s sets attributes on something that is not a dict", m->what);
            break;
        }
        default:
            FAIL("%s holds an operation (at byte %zu) that a state dict of tensors does not need",
                 m->what, at);
        }
    }
    return rc;
}
#undef FAIL

/* ---- the state dict as an st_file ------------------------------------------ */

static size_t dtype_size(st_dtype d)
{
    return d == ST_F32 ? 4 : d == ST_I64 ? 8 : 2;
}

/* How an error names the tensor of entry i: its key when that is a short
 * printable ASCII name (as every state-dict key is), else its position, so
 * no byte of a hostile file reaches a log or an API answer. */
static const char *shown(const pv *k, size_t i, char *buf, size_t cap)
{
    bool ok = k->k == V_STR && k->slen > 0 && k->slen < 200;
    for (size_t j = 0; ok && j < k->slen; j++)
        ok = k->s[j] >= 0x20 && k->s[j] < 0x7f && k->s[j] != '\'' && k->s[j] != '\\';
    if (ok)
        snprintf(buf, cap, "tensor '%.*s'", (int)k->slen, k->s);
    else
        snprintf(buf, cap, "tensor number %zu", i);
    return buf;
}

int ptbin_parse(st_file **out, const void *buf, size_t len, char *err, size_t errlen)
{
    zip z = {.buf = buf, .len = len};
    vm m = {.err = err, .errlen = errlen, .what = "data.pkl"};
    st_file *f = NULL;
    int rc = zip_read(&z, err, errlen);
    if (rc < 0)
        goto out;
    /* torch.save names every entry <archive>/...; data.pkl says which archive */
    const zentry *pkl = NULL;
    size_t plen = 0;
    for (size_t i = 0; i < z.n; i++) {
        const zentry *e = &z.e[i];
        const char *slash = memchr(e->name, '/', e->name_len);
        if (slash && (size_t)(e->name + e->name_len - slash) == strlen("/data.pkl") &&
            memcmp(slash, "/data.pkl", strlen("/data.pkl")) == 0) {
            if (pkl) {
                seterr(err, errlen, "the zip archive holds more than one data.pkl");
                rc = -EINVAL;
                goto out;
            }
            pkl = e;
            plen = (size_t)(slash - e->name) + 1;
        }
    }
    if (!pkl) {
        seterr(err, errlen, "the zip archive has no <archive>/data.pkl: not written by torch.save");
        rc = -EINVAL;
        goto out;
    }
    const zentry *bo = zip_find(&z, pkl->name, plen, "byteorder", 9);
    if (bo && !(bo->size == 6 && memcmp((const uint8_t *)buf + bo->off, "little", 6) == 0)) {
        seterr(err, errlen, "the tensors are stored big-endian; only little-endian files are read");
        rc = -EINVAL;
        goto out;
    }
    m.start = m.p = (const uint8_t *)buf + pkl->off;
    m.end = m.p + pkl->size;
    pv *dict = NULL;
    if ((rc = vm_run(&m, &dict)) < 0)
        goto out;
    f = calloc(1, sizeof *f);
    if (!f || !(f->tensors = calloc(dict->n / 2 + 1, sizeof *f->tensors))) {
        rc = -ENOMEM;
        goto out;
    }
    f->data = buf;
    f->data_len = len;
    for (size_t i = 0; i + 1 < dict->n; i += 2) {
        pv *k = dict->items[i], *t = dict->items[i + 1];
        char nm[256];
        shown(k, i / 2, nm, sizeof nm);
        if (k->k != V_STR || memchr(k->s, 0, k->slen) || k->slen > 4096) {
            seterr(err, errlen, "data.pkl has a key (entry %zu) that is not a tensor name", i / 2);
            rc = -EINVAL;
            goto out;
        }
        if (t->k != V_TENSOR) {
            seterr(err, errlen, "data.pkl: %s is not a tensor", nm);
            rc = -EINVAL;
            goto out;
        }
        pv *s = t->storage;
        size_t esz = dtype_size((st_dtype)s->i);
        char key[64];
        if (s->slen == 0 || s->slen >= sizeof key - 6) {
            seterr(err, errlen, "%s names a storage that is not in the archive", nm);
            rc = -EINVAL;
            goto out;
        }
        snprintf(key, sizeof key, "data/%.*s", (int)s->slen, s->s);
        const zentry *e = zip_find(&z, pkl->name, plen, key, strlen(key));
        if (!e || (uint64_t)s->i2 > e->size / esz) {
            seterr(err, errlen, "%s names a storage that is not in the archive or is "
                   "shorter than it says", nm);
            rc = -EINVAL;
            goto out;
        }
        /* contiguous, row-major, inside the storage */
        uint64_t numel = 1, want = 1;
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (t->size[d] != 1 && t->stride[d] != (int64_t)want) {
                seterr(err, errlen, "%s is not contiguous (a view); save the state dict "
                       "with save_pretrained", nm);
                rc = -EINVAL;
                goto out;
            }
            want *= (uint64_t)t->size[d];
            numel = want;
            if (numel > ((uint64_t)1 << 50)) {
                seterr(err, errlen, "%s is too large", nm);
                rc = -EINVAL;
                goto out;
            }
        }
        if ((uint64_t)t->i > (uint64_t)s->i2 || numel > (uint64_t)s->i2 - (uint64_t)t->i) {
            seterr(err, errlen, "%s runs past the end of its storage", nm);
            rc = -EINVAL;
            goto out;
        }
        st_tensor *o = &f->tensors[f->n];
        if (!(o->name = strndup(k->s, k->slen))) {
            rc = -ENOMEM;
            goto out;
        }
        f->n++;
        o->dtype = (st_dtype)s->i;
        o->ndim = t->ndim;
        memcpy(o->shape, t->size, sizeof o->shape);
        o->begin = e->off + (size_t)t->i * esz;
        o->end = o->begin + (size_t)numel * esz;
    }
    *out = f;
    f = NULL;
out:
    st_close(f);
    vm_free(&m);
    free(z.e);
    return rc;
}

int ptbin_open(st_file **out, const char *path, char *err, size_t errlen)
{
    return st_open_parsed(out, path, ptbin_parse, err, errlen);
}
