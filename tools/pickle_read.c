/*
 * pickle_read.c: the restricted pickle reader (see pickle_read.h). It is a plain opcode loop over
 * a byte buffer with an explicit value stack, a stack of MARK positions and a memo array.
 *
 * Invariants: every read is preceded by a bounds check against the bytes left (lengths from the
 * input are compared with `len - pos`, never added to pos first, so nothing overflows); an opcode
 * only touches the stack above the innermost MARK, as CPython's metastack does; every value a
 * container, the memo or the root holds is allocated from the document's arena and counted
 * against max_values (with a record hook, ints of a dict being filled start in a scratch array
 * that is reused once their MARK closes; see keep_values). Errors name the offset of the opcode
 * being decoded. A text opcode's argument is a line, searched for its '\n' within the input.
 * No globals, no lock.
 */
#include "tools/pickle_read.h"

#include "tools/pickle_text.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Arena chunks are small enough that the last one's unused part stays small: loading runs on
 * huge pages, each zeroed whole when first touched, so the heap's extent costs, not the
 * number of mallocs. */
#define VALUES_PER_CHUNK 1024
#define STR_CHUNK (64 * 1024)

typedef struct vchunk {
    struct vchunk *next;            /* older chunk */
    size_t used;                    /* values used in v */
    pk_value_t v[VALUES_PER_CHUNK]; /* the values */
} vchunk_t;

typedef struct schunk {
    struct schunk *next; /* older chunk */
    size_t used, cap;    /* bytes used / available in data */
    pk_value_t *owner;   /* item chunks: the container whose array is the whole of data (see
                          * own_items), else NULL */
    char data[];         /* string bytes, or item arrays */
} schunk_t;

struct pk_doc {
    vchunk_t *values;       /* value arena */
    schunk_t *strings;      /* string arena */
    schunk_t *items;        /* arena of the containers' item arrays */
    size_t nvalues;         /* values made */
    const pk_value_t *root; /* the unpickled object */
};

#define INT_CACHE_BITS 12
#define STR_CACHE_BITS 8
#define STR_CACHE_MAX 32   /* bytes of the longest string shared through the cache */
#define SCRATCH_VALUES 512 /* a dict's ints at most at once (a trace entry has a dozen) */
/* The kinds of skipped values, indices into parser_t.skipv. SK_ANY stands for what skip_fast
 * counted without looking (a memo reference): anything may be added to it, and as a dict key it
 * may be one Python cannot hash. SK_HASHED is a reference skip_fast looked up as a dict key (a
 * value Python can hash), SK_UNHASHABLE a bytearray or a tuple holding what cannot be hashed,
 * SK_TUPLE_ANY a tuple holding an SK_ANY (not known either), SK_SET a set (EMPTY_SET; a
 * frozenset is SK_HASHED). In the order of what hash() makes of them (see hashable): hashed,
 * not known, refused. */
enum {
    SK_SCALAR,
    SK_TUPLE,
    SK_HASHED,
    SK_ANY,
    SK_TUPLE_ANY,
    SK_DICT,
    SK_LIST,
    SK_UNHASHABLE,
    SK_SET,
    SK_COUNT
};

/* Picklers (CPython's, ours) write a dict's items in SETITEMS batches of this many pairs: only a
 * smaller batch is sure to be a dict's last. */
#define SETITEMS_BATCH 1000

/* The dicts a fast path (record_fast, segment_fast) gave up on, by their first key. */
typedef struct fast_fails {
    const pk_value_t *key; /* the first key of the dicts it gave up on last */
    unsigned fails;        /* how many in a row (at most REC_GIVE_UP) */
    unsigned skips;        /* dicts passed to the general loop at once, counted */
} fast_fails_t;

typedef struct parser {
    const unsigned char *p;     /* input */
    size_t len, pos;            /* input size and cursor */
    size_t op;                  /* offset of the opcode being decoded */
    pk_doc_t *doc;              /* arena */
    pk_limits_t lim;            /* bounds */
    pk_value_t **stack;         /* value stack */
    size_t sp, scap;            /* stack depth / allocated */
    size_t *marks;              /* stack depths at each open MARK */
    size_t nmarks;              /* open MARKs */
    size_t markcap;             /* MARKs marks (and mark_scratch) hold; grow_marks adds room */
    pk_value_t **memo;          /* memo by index (NULL = unset) */
    size_t memocap;             /* memo slots that are set or NULL (what every reader checks an
                                 * index against); those above are not written yet */
    size_t memoalloc;           /* allocated memo slots (at least memocap) */
    size_t memoused;            /* set memo slots (what MEMOIZE uses as the next index) */
    bool memo_holes;            /* a slot was set beyond memoused: [0, memoused) may not all be set
                                 * (they are otherwise: slots are never unset) */
    char *err;                  /* message buffer */
    size_t errlen;              /* its size */
    const char *skip_key;       /* the values under this dict key are skipped (NULL: none) */
    size_t skip_len;            /* strlen(skip_key) */
    const pk_value_t *skip_str; /* the str value last found to be skip_key (NULL: none yet) */
    bool skipping;              /* inside such a value */
    size_t skip_base;           /* its stack index */
    pk_value_t *skipped;        /* what a skipped value that is no container is (a PK_NONE) */
    pk_value_t *skipv;          /* SK_COUNT PK_NONEs in a row, what skipped values are by kind
                                 * (skipped is the first): an APPEND or SETITEM onto one is
                                 * checked as onto what it stands for */
    uintptr_t skip_span;        /* their bytes (0: none, nothing is skipped) */
    size_t skipped_at;          /* stack depth right after the last skipped string's push */
    size_t skipped_str;         /* its input offset and length */
    size_t skipped_len;
    pk_type_t skipped_type;                 /* PK_STR or PK_BYTES */
    pk_value_t *ints[1u << INT_CACHE_BITS]; /* PK_INT values made lately, by hash of value */
    pk_value_t *strs[1u << STR_CACHE_BITS]; /* short strings made lately, by hash of bytes */
    pk_value_t *bools[2];                   /* False and True once made (NULL before) */
    pk_record_fn rec_fn;                    /* pk_parse_records' hook (NULL: none) */
    void *rec_arg;                          /* its argument */
    pk_value_t *scratch;  /* ints of dicts the hook may take: reused once a MARK closes */
    size_t scratch_used;  /* values of scratch in use */
    size_t moved_min;     /* no scratch value below scratch_used has moved below this index */
    size_t *mark_scratch; /* scratch_used when each open MARK was pushed */
    pk_value_t reserved;  /* what record_fast's dict's memo slot holds until the dict is made */
    fast_fails_t rf;      /* the dicts record_fast gave up on */
    fast_fails_t sf;      /* the dicts segment_fast gave up on */
} parser_t;

/* Whether v is one of the skipped values. */
static inline __attribute__((always_inline)) bool is_skipped(const parser_t *ps,
                                                             const pk_value_t *v) {
    return (uintptr_t)v - (uintptr_t)ps->skipv < ps->skip_span;
}

/* The skipped value of a container of type t. */
static pk_value_t *skipped_of(const parser_t *ps, pk_type_t t) {
    return ps->skipv + (t == PK_DICT ? SK_DICT : t == PK_LIST ? SK_LIST : SK_TUPLE);
}

void pk_limits_default(pk_limits_t *lim) {
    /* No limit on open MARKs by default: pickle.load (the C unpickler) grows its stack of them
     * without one, and every MARK is a byte of the document, so its size bounds them (marks
     * are 8 bytes each, 16 with a record hook, grown by doubling). */
    lim->max_depth = SIZE_MAX;
    /* The memo's bound is the document's size (at least 2^24, pk_parse_records): every entry a
     * pickler makes is at least a byte (MEMOIZE), and PyTorch's snapshots memoize a value every
     * 60-130 bytes, so a fixed 2^24 refused snapshots past about 1.5 GB, which pickle.load reads
     * and the commands take up to 4 GiB of. A LONG_BINPUT index past it is still refused
     * instead of allocated for. */
    lim->max_memo = SIZE_MAX;
    /* No count of values by default: every opcode that makes a value is at least a byte, so a
     * document makes at most as many values as it has bytes, and its size bounds their memory
     * (as it bounds what pickle.load makes of it). A count of our own would refuse, in the
     * commands that read the whole document (summary, plot, replay --snapshot), a file the
     * ones that skip its stacks (info, replay: a fraction of its values) read. */
    lim->max_values = SIZE_MAX;
    lim->max_str = (size_t)1 << 28;
}

/* The parse's error message: prefix, what, and the offset of the opcode that failed. */
static void vfail(parser_t *ps, const char *prefix, const char *fmt, va_list ap) {
    char what[200];
    vsnprintf(what, sizeof(what), fmt, ap);
    if (ps->err != NULL && ps->errlen > 0)
        snprintf(ps->err, ps->errlen, "%s%s at offset %zu", prefix, what, ps->op);
}

static bool fail(parser_t *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(parser_t *ps, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(ps, "pickle: ", fmt, ap);
    va_end(ap);
    return false;
}

/* A refusal that only says the document must be read whole (PK_ERR_WHOLE): what pk_parse would
 * read of it differs from what skipping or the record hook can. */
static bool fail_whole(parser_t *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail_whole(parser_t *ps, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(ps, PK_ERR_WHOLE, fmt, ap);
    va_end(ap);
    return false;
}

/* "opcode NAME at offset N not allowed": the offset sits inside, where people look for it. */
static bool fail_opcode(parser_t *ps, const char *name, const char *why) {
    if (ps->err != NULL && ps->errlen > 0)
        snprintf(ps->err, ps->errlen, "pickle: opcode %s at offset %zu %s", name, ps->op, why);
    return false;
}

/* ---- arena ------------------------------------------------------------------------------ */

static pk_value_t *new_value(parser_t *ps, pk_type_t type) {
    pk_doc_t *d = ps->doc;
    if (d->nvalues >= ps->lim.max_values) {
        fail(ps, "more than %zu values", ps->lim.max_values);
        return NULL;
    }
    if (d->values == NULL || d->values->used == VALUES_PER_CHUNK) {
        vchunk_t *c = malloc(sizeof(*c));
        if (c == NULL) {
            fail(ps, "out of memory");
            return NULL;
        }
        c->next = d->values;
        c->used = 0;
        d->values = c;
    }
    pk_value_t *v = &d->values->v[d->values->used++];
    d->nvalues++;
    memset(v, 0, sizeof(*v));
    v->type = type;
    return v;
}

static char *new_bytes(parser_t *ps, const unsigned char *src, size_t n) {
    pk_doc_t *d = ps->doc;
    if (d->strings == NULL || d->strings->cap - d->strings->used < n + 1) {
        size_t cap = n + 1 > STR_CHUNK ? n + 1 : STR_CHUNK;
        schunk_t *c = malloc(sizeof(*c) + cap);
        if (c == NULL) {
            fail(ps, "out of memory");
            return NULL;
        }
        c->next = d->strings;
        c->used = 0;
        c->cap = cap;
        c->owner = NULL;
        d->strings = c;
    }
    char *s = d->strings->data + d->strings->used;
    memcpy(s, src, n);
    s[n] = '\0';
    d->strings->used += n + 1;
    return s;
}

static void free_chunks(schunk_t *c) {
    for (schunk_t *n; c != NULL; c = n) {
        n = c->next;
        free(c);
    }
}

void pk_free(pk_doc_t *doc) {
    if (doc == NULL)
        return;
    for (vchunk_t *c = doc->values, *n; c != NULL; c = n) {
        n = c->next;
        free(c);
    }
    free_chunks(doc->strings);
    free_chunks(doc->items);
    free(doc);
}

/* Item arrays come from an arena too (a malloc and free per container was a fifth of loading
 * a snapshot). A container that grows takes more room in place where its array is the last of
 * the arena's newest chunk and the room is there; else it moves to a larger array and leaves
 * the old one, except a large array (above ITEMS_OWN bytes), which has a chunk of its own that
 * realloc grows: a trace's list of entries grew by doubling in the arena and left its old
 * arrays there (nhf: 248 KB for 8,948 entries' 72 KB), which the analysis could not reuse. */
#define ITEMS_OWN (STR_CHUNK / 4)

/* A chunk of its own for seq's array of `bytes` (> ITEMS_OWN), kept second in the list so that
 * the newest chunk's free room stays in use for the small arrays. */
static pk_value_t **own_items(parser_t *ps, pk_value_t *seq, size_t bytes) {
    pk_doc_t *d = ps->doc;
    schunk_t *c = malloc(sizeof(*c) + bytes);
    if (c == NULL) {
        fail(ps, "out of memory");
        return NULL;
    }
    c->used = c->cap = bytes;
    c->owner = seq;
    schunk_t **at = d->items != NULL ? &d->items->next : &d->items;
    c->next = *at;
    *at = c;
    return (pk_value_t **)(void *)c->data;
}

/* new_items' room that the newest chunk lacks: a new newest chunk. */
static __attribute__((noinline)) pk_value_t **new_items_chunk(parser_t *ps, size_t bytes) {
    pk_doc_t *d = ps->doc;
    schunk_t *c = malloc(sizeof(*c) + STR_CHUNK);
    if (c == NULL) {
        fail(ps, "out of memory");
        return NULL;
    }
    c->next = d->items;
    c->used = bytes;
    c->cap = STR_CHUNK;
    c->owner = NULL;
    d->items = c;
    return (pk_value_t **)(void *)c->data;
}

/* An item array of n (at most ITEMS_OWN bytes) from the newest chunk. */
static inline __attribute__((always_inline)) pk_value_t **new_items(parser_t *ps, size_t n) {
    schunk_t *h = ps->doc->items;
    size_t bytes = n * sizeof(pk_value_t *);
    if (__builtin_expect(h == NULL || h->cap - h->used < bytes, 0))
        return new_items_chunk(ps, bytes);
    pk_value_t **it = (pk_value_t **)(void *)(h->data + h->used);
    h->used += bytes;
    return it;
}

/* Where seq's array has a chunk of its own among the two newest (own_items puts the newest
 * such chunk second, and the head is one when it was the first chunk): the link to it, NULL
 * when it has none there. */
static schunk_t **own_link(pk_doc_t *d, const pk_value_t *seq) {
    schunk_t **at = &d->items;
    for (int k = 0; k < 2 && *at != NULL; k++, at = &(*at)->next)
        if ((*at)->owner == seq && (char *)seq->u.seq.items == (*at)->data)
            return at;
    return NULL;
}

/* Once the document is read: each array with a chunk of its own cut to its items, and the rest
 * given back to the heap (the analysis takes it): what the last doubling left unused (nhf's
 * entries: 56 KB of 128). Shrinking leaves the array in place in glibc; elsewhere it may move. */
static void trim_own_items(pk_doc_t *d) {
    for (schunk_t **at = &d->items; *at != NULL; at = &(*at)->next) {
        schunk_t *c = *at;
        pk_value_t *seq = c->owner;
        if (seq == NULL || (char *)seq->u.seq.items != c->data ||
            c->cap - seq->u.seq.n * sizeof(pk_value_t *) < 4096)
            continue;
        size_t bytes = seq->u.seq.n * sizeof(pk_value_t *);
        schunk_t *nc = realloc(c, sizeof(*c) + bytes);
        if (nc == NULL)
            continue;
        nc->used = nc->cap = bytes;
        *at = nc;
        seq->u.seq.items = (pk_value_t **)(void *)nc->data;
        seq->u.seq.cap = seq->u.seq.n;
    }
}

/* Room for `more` items in seq. */
static bool seq_reserve(parser_t *ps, pk_value_t *seq, size_t more) {
    if (seq->u.seq.cap - seq->u.seq.n >= more)
        return true;
    size_t cap = seq->u.seq.cap * 2;
    if (cap < seq->u.seq.n + more)
        cap = seq->u.seq.n + more;
    pk_doc_t *d = ps->doc;
    size_t bytes = cap * sizeof(pk_value_t *), had = seq->u.seq.cap * sizeof(pk_value_t *);
    schunk_t *h = d->items;
    if (had > 0 && h != NULL && (char *)seq->u.seq.items + had == h->data + h->used &&
        h->cap != h->used && bytes - had <= h->cap - h->used) {
        h->used += bytes - had; /* the newest array of the small ones' chunk: grown in place */
        seq->u.seq.cap = cap;
        return true;
    }
    schunk_t **own = had > ITEMS_OWN ? own_link(d, seq) : NULL;
    if (own != NULL) {
        schunk_t *c = realloc(*own, sizeof(**own) + bytes);
        if (c == NULL)
            return fail(ps, "out of memory");
        c->used = c->cap = bytes;
        *own = c;
        seq->u.seq.items = (pk_value_t **)(void *)c->data;
        seq->u.seq.cap = cap;
        return true;
    }
    pk_value_t **ni = bytes > ITEMS_OWN ? own_items(ps, seq, bytes) : new_items(ps, cap);
    if (ni == NULL)
        return false;
    if (seq->u.seq.n > 0)
        memcpy(ni, seq->u.seq.items, seq->u.seq.n * sizeof(*ni));
    seq->u.seq.items = ni;
    seq->u.seq.cap = cap;
    return true;
}

/* ---- stack ------------------------------------------------------------------------------ */

static inline __attribute__((always_inline)) size_t base(const parser_t *ps) {
    return ps->nmarks ? ps->marks[ps->nmarks - 1] : 0;
}

static inline __attribute__((always_inline)) bool push(parser_t *ps, pk_value_t *v) {
    if (v == NULL)
        return false;
    if (ps->sp == ps->scap) {
        size_t cap = ps->scap ? ps->scap * 2 : 256;
        pk_value_t **ns = realloc(ps->stack, cap * sizeof(*ns));
        if (ns == NULL)
            return fail(ps, "out of memory");
        ps->stack = ns;
        ps->scap = cap;
    }
    ps->stack[ps->sp++] = v;
    ps->skipped_at = 0; /* push_str sets it again after a skipped string */
    return true;
}

/* Room for another MARK: marks (and mark_scratch) twice as large, up to lim.max_depth. Its
 * callers check nmarks == markcap inline. */
static __attribute__((noinline)) bool grow_marks(parser_t *ps) {
    if (ps->markcap >= ps->lim.max_depth)
        return fail(ps, "nesting deeper than %zu", ps->lim.max_depth);
    size_t cap = ps->markcap > ps->lim.max_depth / 2 ? ps->lim.max_depth : ps->markcap * 2;
    if (cap > SIZE_MAX / sizeof(size_t))
        return fail(ps, "out of memory");
    size_t *m = realloc(ps->marks, cap * sizeof(*m));
    if (m == NULL)
        return fail(ps, "out of memory");
    ps->marks = m;
    if (ps->mark_scratch != NULL) {
        m = realloc(ps->mark_scratch, cap * sizeof(*m));
        if (m == NULL)
            return fail(ps, "out of memory");
        ps->mark_scratch = m;
    }
    ps->markcap = cap;
    return true;
}

/* Require n values above the innermost MARK. */
static inline __attribute__((always_inline)) bool need_stack(parser_t *ps, size_t n,
                                                             const char *opname) {
    if (ps->sp - base(ps) < n)
        return fail(ps, "%s needs %zu value%s on the stack", opname, n, n == 1 ? "" : "s");
    return true;
}

/* Pop to the innermost MARK: the items are stack[*first_p .. sp) until the next push. */
static inline __attribute__((always_inline)) bool pop_mark(parser_t *ps, size_t *first_p,
                                                           const char *opname) {
    if (ps->nmarks == 0)
        return fail(ps, "%s without MARK", opname);
    *first_p = ps->marks[--ps->nmarks];
    /* Still skipping, a MARK below the skipped value closes: the value ended before what was
     * skipped after it (a key that is no string, an item of a list), which belongs outside. */
    if (ps->skipping && *first_p <= ps->skip_base)
        return fail_whole(ps, "%s ends the value under \"%s\" after values skipped past its end",
                          opname, ps->skip_key);
    return true;
}

/* ---- input ------------------------------------------------------------------------------ */

static inline __attribute__((always_inline)) bool need(parser_t *ps, size_t n, const char *opname) {
    if (n > ps->len - ps->pos)
        return fail(ps, "truncated %s (needs %zu bytes, %zu left)", opname, n, ps->len - ps->pos);
    return true;
}

static inline __attribute__((always_inline)) uint64_t le_uint(const unsigned char *b, size_t n) {
    /* The widths opcodes use as straight-line loads (the compiler merges the shifted bytes). */
    switch (n) {
    case 1:
        return b[0];
    case 2:
        return (uint64_t)b[0] | (uint64_t)b[1] << 8;
    case 4:
        return (uint64_t)b[0] | (uint64_t)b[1] << 8 | (uint64_t)b[2] << 16 | (uint64_t)b[3] << 24;
    default: {
        uint64_t v = 0;
        for (size_t i = 0; i < n; i++)
            v |= (uint64_t)b[i] << (8 * i);
        return v;
    }
    }
}

/* The n-byte little-endian unsigned argument of opname, consumed. */
static inline __attribute__((always_inline)) bool take_uint(parser_t *ps, size_t n,
                                                            const char *opname, uint64_t *out) {
    if (!need(ps, n, opname))
        return false;
    *out = le_uint(ps->p + ps->pos, n);
    ps->pos += n;
    return true;
}

/* A LONG1/LONG4 argument: n bytes of two's complement, little-endian, sorted into the three
 * integer kinds by range. Bytes beyond the 8th must be pure sign extension (or, for PK_UINT, one
 * zero byte above a set top bit); anything else is wider than [-2^63, 2^64). */
static pk_type_t le_long(const unsigned char *b, size_t n, int64_t *i_p, uint64_t *u_p) {
    if (n == 0) {
        *i_p = 0;
        return PK_INT;
    }
    bool neg = (b[n - 1] & 0x80) != 0; /* the sign of the whole number */
    size_t k = n > 8 ? 8 : n;
    for (size_t i = 8; i < n; i++)
        if (b[i] != (neg ? 0xff : 0x00))
            return PK_BIGINT;
    uint64_t u = le_uint(b, k);
    if (k < 8 && neg)
        u |= ~(uint64_t)0 << (8 * k);
    bool top = (u >> 63) != 0; /* bit 63 of the low 8 bytes */
    if (neg && !top)
        return PK_BIGINT; /* below -2^63 */
    if (!neg && top) {
        *u_p = u; /* [2^63, 2^64): 9 bytes with a zero sign byte */
        return PK_UINT;
    }
    *i_p = (int64_t)u;
    return PK_INT;
}

/* le_long's commonest case in one load: 1 to 8 bytes (always a PK_INT, sign-extended from the
 * top byte) with 8 bytes readable at b (`avail` of them are). Anything else goes to le_long. */
static inline __attribute__((always_inline)) pk_type_t
le_long_fast(const unsigned char *b, size_t n, size_t avail, int64_t *i_p, uint64_t *u_p) {
    if (n - 1 >= 8 || avail < 8)
        return le_long(b, n, i_p, u_p);
    uint64_t w;
    memcpy(&w, b, sizeof(w));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    unsigned sh = (unsigned)(64 - 8 * n);
    *i_p = (int64_t)(w << sh) >> sh;
    return PK_INT;
}

/* The string cache's slot for n bytes (at most STR_CACHE_MAX) of type at src. */
static inline pk_value_t **str_slot(parser_t *ps, pk_type_t type, const unsigned char *src,
                                    size_t n) {
    uint64_t h = (uint64_t)n * 0x9e3779b97f4a7c15ull + (uint64_t)type;
    for (size_t i = 0; i < n; i++)
        h = (h ^ src[i]) * 0x100000001b3ull;
    return &ps->strs[(h * 0x9e3779b97f4a7c15ull) >> (64 - STR_CACHE_BITS)];
}

/* Whether the cached value c is that string. */
static inline bool str_hit(const pk_value_t *c, pk_type_t type, const unsigned char *src,
                           size_t n) {
    if (c == NULL || c->type != type || c->u.str.len != n)
        return false;
    /* Compared here, not by a call to memcmp: the strings are short (at most STR_CACHE_MAX
     * bytes; a trace entry's compile_context "N/A" and user_metadata "" are 3 and 0). */
    const unsigned char *s = (const unsigned char *)c->u.str.s;
    for (size_t i = 0; i < n; i++)
        if (s[i] != src[i])
            return false;
    return true;
}

/* How pickle.load decodes a string's bytes. */
typedef enum {
    AS_BYTES,     /* bytes (SHORT_BINBYTES, BINBYTES, BINBYTES8) */
    AS_BYTEARRAY, /* a bytearray (BYTEARRAY8): bytes that cannot be a dict key */
    AS_UTF8,      /* a str from UTF-8, lone surrogates allowed (BINUNICODE*: 'surrogatepass') */
    AS_ASCII      /* a str from ASCII (SHORT_BINSTRING, BINSTRING: pickle.load's encoding) */
} str_as_t;

/* The offset of the first byte of s[0..n) that is not UTF-8 as Python's 'surrogatepass' reads
 * it (what BINUNICODE's str is decoded with: a sequence of three bytes may encode U+D800 to
 * U+DFFF), or n when there is none. Overlong forms, code points past U+10FFFF and cut sequences
 * are refused as there. ASCII goes sixteen or eight bytes at a time. */
static size_t utf8_bad(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { /* ASCII: as many bytes at once as are ASCII */
#if defined(__SSE2__)
            if (n - i >= 16 &&
                _mm_movemask_epi8(_mm_loadu_si128((const __m128i *)(const void *)(s + i))) == 0) {
                i += 16;
                continue;
            }
#endif
            if (n - i >= 8) {
                uint64_t w;
                memcpy(&w, s + i, sizeof(w));
                if ((w & 0x8080808080808080ull) == 0) {
                    i += 8;
                    continue;
                }
            }
            i++;
            continue;
        }
        if (c - 0xc2 < 0x1e) { /* two bytes (the commonest past ASCII: Latin, Greek, ...) */
            if (n - i < 2 || (s[i + 1] & 0xc0) != 0x80)
                return i;
            i += 2;
            continue;
        }
        size_t k;                      /* continuation bytes */
        unsigned lo = 0x80, hi = 0xbf; /* the range of the first of them */
        if (c >= 0xe0 && c <= 0xef) {
            k = 2;
            lo = c == 0xe0 ? 0xa0 : 0x80;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3;
            lo = c == 0xf0 ? 0x90 : 0x80;
            hi = c == 0xf4 ? 0x8f : 0xbf;
        } else {
            return i;
        }
        if (n - i - 1 < k || s[i + 1] < lo || s[i + 1] > hi || (s[i + 2] & 0xc0) != 0x80 ||
            (k == 3 && (s[i + 3] & 0xc0) != 0x80))
            return i;
        i += 1 + k;
    }
    return n;
}

/* The offset of the first byte of s[0..n) that is not ASCII, or n. */
static size_t ascii_bad(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] >= 0x80)
            return i;
    return n;
}

/* Whether a string's n bytes at pos are what pickle.load decodes as `as` says (fails if not). */
static bool str_decodes(parser_t *ps, str_as_t as, size_t n, const char *opname) {
    const unsigned char *src = ps->p + ps->pos;
    size_t bad = as == AS_UTF8 ? utf8_bad(src, n) : as == AS_ASCII ? ascii_bad(src, n) : n;
    if (bad == n)
        return true;
    return fail(ps, "%s is not %s (byte 0x%02x at %zu of its %zu): pickle.load refuses it", opname,
                as == AS_UTF8 ? "UTF-8" : "ASCII", src[bad], bad, n);
}

static bool push_str(parser_t *ps, str_as_t as, size_t n, const char *opname) {
    pk_type_t type = as == AS_UTF8 || as == AS_ASCII ? PK_STR : PK_BYTES;
    if (!need(ps, n, opname))
        return false;
    if (n > ps->lim.max_str)
        return fail(ps, "%s of %zu bytes exceeds the limit of %zu", opname, n, ps->lim.max_str);
    if (ps->skipping) {
        if (!str_decodes(ps, as, n, opname))
            return false;
        if (as == AS_BYTEARRAY) { /* not a string the memo may make later: its kind alone */
            ps->pos += n;
            return push(ps, ps->skipv + SK_UNHASHABLE);
        }
        /* Made only if the memo keeps it (it may be used again outside the skipped value). */
        ps->skipped_str = ps->pos;
        ps->skipped_len = n;
        ps->skipped_type = type;
        ps->pos += n;
        return push(ps, ps->skipped) && (ps->skipped_at = ps->sp, true);
    }
    /* A short string seen lately is shared, as ints are: newer snapshots write a fresh "N/A"
     * (compile_context) in every trace entry, a value and a copy each. */
    const unsigned char *src = ps->p + ps->pos;
    pk_value_t **slot = NULL;
    if (n <= STR_CACHE_MAX && as != AS_BYTEARRAY) { /* a bytearray is no bytes to share */
        slot = str_slot(ps, type, src, n);
        if (str_hit(*slot, type, src, n)) { /* decoded when it was made */
            ps->pos += n;
            return push(ps, *slot);
        }
    }
    if (!str_decodes(ps, as, n, opname))
        return false;
    pk_value_t *v = new_value(ps, type);
    if (v == NULL)
        return false;
    char *s = new_bytes(ps, src, n);
    if (s == NULL)
        return false;
    v->u.str.s = s;
    v->u.str.len = n;
    v->unhashable = as == AS_BYTEARRAY;
    ps->pos += n;
    if (slot != NULL)
        *slot = v;
    return push(ps, v);
}

/* Scratch values: with a record hook, an int pushed as a value of a dict being filled (its MARK
 * sits right above it) goes to a small reusable array instead of the document. Every path that
 * keeps a value beyond its MARK (a container's items, the memo, the root) makes it a document
 * value first (keep_values); when the MARK closes, everything made above it is gone from the
 * stack, so the scratch goes back to where it stood at that MARK. */
static inline __attribute__((always_inline)) bool in_taken_dict(const parser_t *ps) {
    if (ps->rec_fn == NULL || ps->nmarks == 0 || ps->scratch_used == SCRATCH_VALUES)
        return false;
    size_t b = ps->marks[ps->nmarks - 1];
    return b > 0 && ps->stack[b - 1]->type == PK_DICT;
}

static inline __attribute__((always_inline)) bool is_scratch(const parser_t *ps,
                                                             const pk_value_t *v) {
    return ps->scratch != NULL && v >= ps->scratch && v < ps->scratch + SCRATCH_VALUES;
}

static pk_value_t *shared_int(parser_t *ps, int64_t iv);

/* The scratch values among stack[first..sp) become document values. A moved scratch value
 * keeps the address of its copy (as a PK_RECORD, a type no scratch value has otherwise), so
 * that its other slots (DUP) follow it in one pass. */
static bool keep_values(parser_t *ps, size_t first) {
    for (size_t i = first; ps->scratch != NULL && i < ps->sp; i++) {
        pk_value_t *s = ps->stack[i];
        if (!is_scratch(ps, s))
            continue;
        if (s->type != PK_RECORD) {
            /* Scratch holds only ints: kept, one is shared through the int cache as if it
             * had been made in the document. */
            pk_value_t *v = shared_int(ps, s->u.i);
            if (v == NULL)
                return false;
            size_t j = (size_t)(s - ps->scratch);
            if (j < ps->moved_min)
                ps->moved_min = j;
            s->type = PK_RECORD;
            s->u.u = (uint64_t)(uintptr_t)v;
        }
        ps->stack[i] = (pk_value_t *)(uintptr_t)s->u.u;
    }
    return true;
}

/* Slots of stack[first..sp) whose scratch value moved take its copy. */
static void follow_moved(parser_t *ps, size_t first) {
    if (ps->moved_min >= ps->scratch_used)
        return; /* none of the scratch in use has moved: nothing to follow */
    for (size_t i = first; ps->scratch != NULL && i < ps->sp; i++)
        if (is_scratch(ps, ps->stack[i]) && ps->stack[i]->type == PK_RECORD)
            ps->stack[i] = (pk_value_t *)(uintptr_t)ps->stack[i]->u.u;
}

/* A MARK closed (its items consumed or dropped): the scratch made above it is free again. */
static void scratch_back(parser_t *ps) {
    if (ps->scratch != NULL && ps->mark_scratch[ps->nmarks] < ps->scratch_used) {
        ps->scratch_used = ps->mark_scratch[ps->nmarks];
        /* Every moved value is at moved_min or above; once all of them are free, a value
         * handed out again is an int (push_int, entry_fast), never a moved one. */
        if (ps->moved_min >= ps->scratch_used)
            ps->moved_min = SIZE_MAX;
    }
}

/* Slots cleared past memocap at a time: a put beyond memocap clears this many more, so that
 * the MEMOIZEs after it find theirs cleared already. */
#define MEMO_STEP 4096

/* Room in the memo for index idx (at least memocap): slots up to it and a step beyond are
 * cleared (NULL), the memo grown first if it is too small. The slots are cleared as the puts
 * reach them, not when allocated: a snapshot's memo, sized from the input, is larger than
 * what it memoizes, and clearing all of it at once touched memory nothing used. An index far
 * past the memo (a ten-byte pickle can name index 2^24 - 1) gets a new one from calloc, as
 * fresh pages: the slots below it that are never set cost nothing. */
static __attribute__((noinline)) bool memo_room(parser_t *ps, size_t idx) {
    size_t alloc = ps->memoalloc ? ps->memoalloc : 1024;
    if (idx >= 2 * alloc) {
        size_t cap = alloc;
        while (cap <= idx)
            cap *= 2;
        pk_value_t **nm = calloc(cap, sizeof(*nm));
        if (nm == NULL)
            return fail(ps, "out of memory");
        if (ps->memocap > 0)
            memcpy(nm, ps->memo, ps->memocap * sizeof(*nm));
        free(ps->memo);
        ps->memo = nm;
        ps->memocap = ps->memoalloc = cap;
        return true;
    }
    if (idx >= ps->memoalloc) {
        size_t cap = ps->memoalloc ? ps->memoalloc + ps->memoalloc / 2 : 1024;
        while (cap <= idx)
            cap *= 2;
        pk_value_t **nm = realloc(ps->memo, cap * sizeof(*nm));
        if (nm == NULL)
            return fail(ps, "out of memory");
        ps->memo = nm;
        ps->memoalloc = cap;
    }
    size_t top = ps->memoalloc - idx > MEMO_STEP ? idx + MEMO_STEP : ps->memoalloc;
    memset(ps->memo + ps->memocap, 0, (top - ps->memocap) * sizeof(*ps->memo));
    ps->memocap = top;
    return true;
}

static bool memo_put(parser_t *ps, size_t idx) {
    if (!need_stack(ps, 1, "memo put"))
        return false;
    if (idx >= ps->lim.max_memo)
        return fail(ps, "memo index %zu exceeds the limit of %zu", idx, ps->lim.max_memo);
    if (idx >= ps->memocap && !memo_room(ps, idx))
        return false;
    if (ps->memo[idx] == NULL) {
        if (idx != ps->memoused)
            ps->memo_holes = true;
        ps->memoused++;
    }
    if (is_scratch(ps, ps->stack[ps->sp - 1]) && !keep_values(ps, ps->sp - 1))
        return false;
    pk_value_t *top = ps->stack[ps->sp - 1];
    if (top == ps->skipped && top != NULL && ps->skipped_at == ps->sp) {
        /* A skipped string the memo keeps: it is made now. */
        pk_value_t *v = new_value(ps, ps->skipped_type);
        char *str = v ? new_bytes(ps, ps->p + ps->skipped_str, ps->skipped_len) : NULL;
        if (str == NULL)
            return false;
        v->u.str.s = str;
        v->u.str.len = ps->skipped_len;
        top = v;
    }
    ps->memo[idx] = top;
    return true;
}

/* MEMOIZE: memo_put at the next index, its common case inline (a slot within the memo, free,
 * under a value that is neither scratch nor a skipped string waiting to be made: a trace's
 * dicts and lists, and the frames of a skipped stack, a value every few opcodes). */
static inline __attribute__((always_inline)) bool memoize(parser_t *ps) {
    size_t idx = ps->memoused;
    if (idx < ps->memocap && idx < ps->lim.max_memo && ps->memo[idx] == NULL && ps->sp > base(ps)) {
        pk_value_t *top = ps->stack[ps->sp - 1];
        if (!is_scratch(ps, top) && !(top == ps->skipped && ps->skipped_at == ps->sp)) {
            ps->memo[idx] = top;
            ps->memoused++;
            return true;
        }
    }
    return memo_put(ps, idx);
}

static bool starts_skip(const parser_t *ps);

static inline __attribute__((always_inline)) bool memo_get(parser_t *ps, size_t idx) {
    if (idx >= ps->memocap || ps->memo[idx] == NULL)
        return fail(ps, "memo key %zu is not defined", idx);
    /* A skipped value read again outside skipped values is none of them (a stack's value under
     * another key reads as absent, as the first one does). */
    if (is_skipped(ps, ps->memo[idx]) && !ps->skipping && !starts_skip(ps))
        return fail_whole(ps, "memo key %zu is a value skipped under \"%s\"", idx, ps->skip_key);
    return push(ps, ps->memo[idx]);
}

/* Every pickle opcode's name (pickletools'), by its byte. */
static const char *const opcode_names[256] = {
    ['('] = "MARK",          [')'] = "EMPTY_TUPLE",
    ['.'] = "STOP",          ['0'] = "POP",
    ['1'] = "POP_MARK",      ['2'] = "DUP",
    ['B'] = "BINBYTES",      ['C'] = "SHORT_BINBYTES",
    ['F'] = "FLOAT",         ['G'] = "BINFLOAT",
    ['I'] = "INT",           ['J'] = "BININT",
    ['K'] = "BININT1",       ['L'] = "LONG",
    ['M'] = "BININT2",       ['N'] = "NONE",
    ['P'] = "PERSID",        ['Q'] = "BINPERSID",
    ['R'] = "REDUCE",        ['S'] = "STRING",
    ['T'] = "BINSTRING",     ['U'] = "SHORT_BINSTRING",
    ['V'] = "UNICODE",       ['X'] = "BINUNICODE",
    [']'] = "EMPTY_LIST",    ['a'] = "APPEND",
    ['b'] = "BUILD",         ['c'] = "GLOBAL",
    ['d'] = "DICT",          ['e'] = "APPENDS",
    ['g'] = "GET",           ['h'] = "BINGET",
    ['i'] = "INST",          ['j'] = "LONG_BINGET",
    ['l'] = "LIST",          ['o'] = "OBJ",
    ['p'] = "PUT",           ['q'] = "BINPUT",
    ['r'] = "LONG_BINPUT",   ['s'] = "SETITEM",
    ['t'] = "TUPLE",         ['u'] = "SETITEMS",
    ['}'] = "EMPTY_DICT",    [0x80] = "PROTO",
    [0x81] = "NEWOBJ",       [0x82] = "EXT1",
    [0x83] = "EXT2",         [0x84] = "EXT4",
    [0x85] = "TUPLE1",       [0x86] = "TUPLE2",
    [0x87] = "TUPLE3",       [0x88] = "NEWTRUE",
    [0x89] = "NEWFALSE",     [0x8a] = "LONG1",
    [0x8b] = "LONG4",        [0x8c] = "SHORT_BINUNICODE",
    [0x8d] = "BINUNICODE8",  [0x8e] = "BINBYTES8",
    [0x8f] = "EMPTY_SET",    [0x90] = "ADDITEMS",
    [0x91] = "FROZENSET",    [0x92] = "NEWOBJ_EX",
    [0x93] = "STACK_GLOBAL", [0x94] = "MEMOIZE",
    [0x95] = "FRAME",        [0x96] = "BYTEARRAY8",
    [0x97] = "NEXT_BUFFER",  [0x98] = "READONLY_BUFFER",
};

const char *pk_opcode_name(unsigned char op) {
    return opcode_names[op];
}

/* Names of opcodes we refuse because they build arbitrary objects or call code. */
static const char *forbidden_name(unsigned op) {
    switch (op) {
    case 'c':
        return "GLOBAL";
    case 0x93:
        return "STACK_GLOBAL";
    case 'R':
        return "REDUCE";
    case 'b':
        return "BUILD";
    case 'i':
        return "INST";
    case 'o':
        return "OBJ";
    case 0x81:
        return "NEWOBJ";
    case 0x92:
        return "NEWOBJ_EX";
    case 0x82:
        return "EXT1";
    case 0x83:
        return "EXT2";
    case 0x84:
        return "EXT4";
    case 'P':
        return "PERSID";
    case 'Q':
        return "BINPERSID";
    case 0x97:
        return "NEXT_BUFFER";
    case 0x98:
        return "READONLY_BUFFER";
    default:
        return NULL;
    }
}

/* The text opcodes (protocol 0's; protocol 1 writes INT for a bool and LONG past 2^31 too): an
 * argument of a line each. */
static const char *text_name(unsigned op) {
    switch (op) {
    case 'I':
        return "INT";
    case 'L':
        return "LONG";
    case 'F':
        return "FLOAT";
    case 'S':
        return "STRING";
    case 'V':
        return "UNICODE";
    case 'p':
        return "PUT";
    case 'g':
        return "GET";
    default:
        return NULL;
    }
}

/* What Python's hash() makes of v, a dict key: 1 it hashes it, 0 it refuses it (TypeError: a
 * list, a dict, a bytearray, a tuple holding one), -1 not known here (a reference skip_fast
 * pushed without a look, or a tuple holding one). */
static inline __attribute__((always_inline)) int hashable(const parser_t *ps, const pk_value_t *v) {
    if (v->type == PK_STR || v->type == PK_INT) /* the keys of a snapshot (skipped ones are
                                                 * PK_NONE, scratch ones ints) */
        return 1;
    if (is_skipped(ps, v)) {
        size_t k = (size_t)(v - ps->skipv);
        return k < SK_ANY ? 1 : k < SK_DICT ? -1 : 0;
    }
    if (is_scratch(ps, v)) /* an int, or one moved to the document (a PK_RECORD here) */
        return 1;
    return v->type == PK_LIST || v->type == PK_DICT || v->type == PK_RECORD || v->unhashable ? 0
                                                                                             : 1;
}

/* The keys among stack[first..sp) (every other one): pickle.load refuses a key it cannot hash
 * where the opcode adds it to the dict, and so do we. One not known (inside a skipped value)
 * leaves the document to be read whole. */
static bool key_refused(parser_t *ps, int h, const char *opname) {
    if (h == 0)
        return fail(ps,
                    "%s with a dict key Python cannot hash (a list, a dict, a bytearray, "
                    "a tuple holding one)",
                    opname);
    return fail_whole(ps, "%s with a dict key a reference inside \"%s\" pushed", opname,
                      ps->skip_key);
}

static inline __attribute__((always_inline)) bool keys_hashable(parser_t *ps, size_t first,
                                                                const char *opname) {
    for (size_t i = first; i < ps->sp; i += 2) {
        int h = hashable(ps, ps->stack[i]);
        if (h != 1)
            return key_refused(ps, h, opname);
    }
    return true;
}

/* Build a dict/list/tuple from stack[first..sp) and replace those items with it. */
static bool collapse(parser_t *ps, size_t first, pk_type_t type, const char *opname) {
    size_t n = ps->sp - first;
    if (type == PK_DICT && n % 2 != 0)
        return fail(ps, "%s with an odd number of items", opname);
    if (ps->skipping && first <= ps->skip_base) /* TUPLEn taking the skipped value in */
        return fail_whole(ps, "%s ends the value under \"%s\" after values skipped past its end",
                          opname, ps->skip_key);
    if (type == PK_DICT && !keys_hashable(ps, first, opname))
        return false;
    /* A tuple hashes as its items do (none is the tuple itself: it is made from them). */
    int h = 1;
    for (size_t i = first; type == PK_TUPLE && i < ps->sp && h != 0; i++) {
        int hi = hashable(ps, ps->stack[i]);
        h = hi < h ? hi : h;
    }
    if (ps->skipping && first > ps->skip_base) {
        ps->sp = first;
        return push(ps, type != PK_TUPLE ? skipped_of(ps, type)
                        : h == 0         ? ps->skipv + SK_UNHASHABLE
                        : h < 0          ? ps->skipv + SK_TUPLE_ANY
                                         : ps->skipv + SK_TUPLE);
    }
    if (h < 0) /* only a skipped reference is not known, and this tuple is outside them */
        return fail_whole(ps, "%s holds a value a reference inside \"%s\" pushed", opname,
                          ps->skip_key);
    if (!keep_values(ps, first))
        return false;
    pk_value_t *v = new_value(ps, type);
    if (v == NULL || !seq_reserve(ps, v, n))
        return false;
    v->unhashable = h == 0;
    if (n > 0) /* an empty container has no item array */
        memcpy(v->u.seq.items, ps->stack + first, n * sizeof(*v->u.seq.items));
    v->u.seq.n = n;
    ps->sp = first;
    return push(ps, v);
}

/* The n values from the stack's slot `first` on appended to target's items, and the stack cut
 * back to `first` (APPENDS, SETITEMS, ADDITEMS, FROZENSET). */
static inline bool take_from_stack(parser_t *ps, pk_value_t *target, size_t first, size_t n) {
    if (!seq_reserve(ps, target, n))
        return false;
    if (n > 0)
        memcpy(target->u.seq.items + target->u.seq.n, ps->stack + first,
               n * sizeof(*target->u.seq.items));
    target->u.seq.n += n;
    ps->sp = first;
    return true;
}

/* Add stack[first..sp) to the container just below `first` (SETITEMS/APPENDS: from_mark;
 * SETITEM/APPEND: one item). */
static bool extend(parser_t *ps, size_t first, pk_type_t type, const char *opname, bool from_mark) {
    if (first == 0 || first - 1 < base(ps))
        return fail(ps, "%s has no target", opname);
    pk_value_t *target = ps->stack[first - 1];
    size_t n = ps->sp - first;
    if (is_skipped(ps, target)) {
        /* What can be checked of a skipped value: its kind, as the target's type is. A value
         * a memo reference pushed while skipping (no pickler adds items to one) was not
         * looked up: the whole document tells what it is. */
        if (target == ps->skipv + SK_ANY)
            return fail_whole(ps, "%s adds to a value a reference inside \"%s\" pushed", opname,
                              ps->skip_key);
        if (target != skipped_of(ps, type))
            return fail(ps, "%s target is not a %s", opname, type == PK_DICT ? "dict" : "list");
        if (type == PK_DICT && n % 2 != 0)
            return fail(ps, "%s with an odd number of items", opname);
        if (type == PK_DICT && !keys_hashable(ps, first, opname))
            return false;
        /* Inside a skipped value, anything goes to a skipped container; outside, only items
         * of the skipped list itself (what its own APPEND adds after a string ended the skip).
         * The skipped list as a dict, or a value above it when it has ended, is what skipping
         * cannot read. */
        if ((ps->skipping ? first - 1 <= ps->skip_base : true) &&
            !(type == PK_LIST && first - 1 == ps->skip_base))
            return fail_whole(ps, "%s adds to the value under \"%s\" that was skipped", opname,
                              ps->skip_key);
        ps->sp = first;
        return true;
    }
    /* Items for a dict the hook took are its items too (pickle adds them to the one dict):
     * only a reader of the whole document keeps them. */
    if (target->type == PK_RECORD && type == PK_DICT && !is_scratch(ps, target))
        return fail_whole(ps, "%s adds to a dict the record hook took", opname);
    if (target->type != type)
        return fail(ps, "%s target is not a %s", opname, type == PK_DICT ? "dict" : "list");
    if (type == PK_DICT && n % 2 != 0)
        return fail(ps, "%s with an odd number of items", opname);
    if (type == PK_DICT && !keys_hashable(ps, first, opname))
        return false;
    if (type == PK_DICT && ps->rec_fn != NULL && target->u.seq.n == 0 && from_mark &&
        n < 2 * SETITEMS_BATCH) {
        /* SETITEMS into a new dict: the hook may take it whole (a full batch may have more
         * coming, for which the dict must stay a dict) */
        follow_moved(ps, first);
        uint64_t id = 0;
        int took = ps->rec_fn(ps->rec_arg, ps->stack + first, n, &id);
        if (took < 0)
            return fail(ps, "out of memory");
        if (took > 0) {
            target->type = PK_RECORD;
            target->u.seq.items = NULL;
            target->u.seq.n = target->u.seq.cap = 0;
            target->u.u = id;
            ps->sp = first;
            return true;
        }
    }
    if (!keep_values(ps, first))
        return false;
    if (type == PK_DICT && ps->skipped != NULL) {
        /* A skipped value's pair is left out of its dict (the key reads as absent): a trace
         * entry's items then take a sixth less memory. */
        size_t k = first;
        for (size_t i = first; i < ps->sp; i += 2)
            if (!is_skipped(ps, ps->stack[i + 1])) {
                ps->stack[k++] = ps->stack[i];
                ps->stack[k++] = ps->stack[i + 1];
            }
        n = k - first;
    }
    return take_from_stack(ps, target, first, n);
}

/* ADDITEMS (the items above the MARK at first into the set below it) and FROZENSET (a new one of
 * them), as pickle.load reads them: ADDITEMS of no items changes nothing, whatever lies below;
 * else its target must be a set (a frozenset has no add()), and an item Python cannot hash is
 * refused. A set keeps its items as written (pickle.load drops repeats; a pickler writes none).
 * No snapshot holds a set: consumers read one as a value of no use to them. Inside a skipped
 * value a set is skipped as a list is; what skipping cannot tell is read whole. */
static bool set_items(parser_t *ps, size_t first, bool frozen) {
    const char *opname = frozen ? "FROZENSET" : "ADDITEMS";
    pk_value_t *target = NULL;
    if (!frozen) {
        if (first == 0 || first - 1 < base(ps))
            return fail(ps, "ADDITEMS has no target");
        if (ps->sp == first)
            return true;
        target = ps->stack[first - 1];
        if (is_skipped(ps, target) && target == ps->skipv + SK_ANY)
            return fail_whole(ps, "ADDITEMS adds to a value a reference inside \"%s\" pushed",
                              ps->skip_key);
        if (is_skipped(ps, target) ? target != ps->skipv + SK_SET
                                   : target->type != PK_SET || !target->unhashable)
            return fail(ps, "ADDITEMS target is not a set");
    }
    for (size_t i = first; i < ps->sp; i++) {
        int h = hashable(ps, ps->stack[i]);
        if (h < 0)
            return fail_whole(ps, "%s holds a value a reference inside \"%s\" pushed", opname,
                              ps->skip_key);
        if (h == 0)
            return fail(ps,
                        "%s with an item Python cannot hash (a list, a dict, a set, a bytearray, "
                        "a tuple holding one)",
                        opname);
    }
    if (ps->skipping || (target != NULL && is_skipped(ps, target))) {
        /* Inside a skipped value, to a skipped set (or a new skipped frozenset): nothing is
         * kept. A set outside it, or one skipped before, is what skipping cannot read. */
        if (target != NULL && (!ps->skipping || !is_skipped(ps, target)))
            return fail_whole(ps, "ADDITEMS adds to a set outside the value under \"%s\"",
                              ps->skip_key);
        ps->sp = first;
        return frozen ? push(ps, ps->skipv + SK_HASHED) : true;
    }
    if (!keep_values(ps, first))
        return false;
    size_t n = ps->sp - first;
    if (frozen && (target = new_value(ps, PK_SET)) == NULL)
        return false;
    if (!take_from_stack(ps, target, first, n))
        return false;
    return frozen ? push(ps, target) : true;
}

/* The document's PK_INT of value iv: one seen lately (values never change once made, so an int
 * is shared: a trace repeats its addresses, sizes and streams, and a value made per int was
 * most of the memory, and the page faults, of loading one), else a new one. */
static pk_value_t *shared_int(parser_t *ps, int64_t iv) {
    size_t slot = (size_t)(((uint64_t)iv * 0x9e3779b97f4a7c15ull) >> (64 - INT_CACHE_BITS));
    pk_value_t *v = ps->ints[slot];
    if (v != NULL && v->u.i == iv)
        return v;
    v = new_value(ps, PK_INT);
    if (v == NULL)
        return NULL;
    v->u.i = iv;
    ps->ints[slot] = v;
    return v;
}

static inline __attribute__((always_inline)) bool push_int(parser_t *ps, int64_t iv) {
    if (ps->skipping)
        return push(ps, ps->skipped);
    /* An int of a dict the record hook may take goes to scratch without a look at the cache
     * (whose misses were a sixth of parsing a trace): the hook reads it and it is gone, and
     * one kept after all is shared then (keep_values). */
    if (in_taken_dict(ps)) {
        pk_value_t *v = &ps->scratch[ps->scratch_used++];
        *v = (pk_value_t){.type = PK_INT, .u.i = iv};
        return push(ps, v);
    }
    return push(ps, shared_int(ps, iv));
}

/* Skipping (pk_parse_skip): a list pushed right after the key string starts a skipped value. */
static bool starts_skip(const parser_t *ps) {
    const pk_value_t *k = ps->sp > base(ps) ? ps->stack[ps->sp - 1] : NULL;
    return k != NULL && k->type == PK_STR && k->u.str.len == ps->skip_len &&
           memcmp(k->u.str.s, ps->skip_key, ps->skip_len) == 0;
}

/* Whether the GET whose argument starts at a names a str in the memo (a malformed one: true, and
 * the opcode itself reports it). Out of line: only protocol 0's GET comes here. */
static __attribute__((noinline, cold)) bool text_get_is_str(const parser_t *ps,
                                                            const unsigned char *a) {
    size_t idx;
    const unsigned char *nl = memchr(a, '\n', ps->len - ps->pos);
    if (nl == NULL || !pk_text_index(a, (size_t)(nl - a), &idx, NULL, 0))
        return true;
    return idx < ps->memocap && ps->memo[idx] != NULL && ps->memo[idx]->type == PK_STR;
}

/* The skipped value is complete once the stack is back at it and the dict being built goes on:
 * the next key (a string) is pushed, or the dict is finished. (Its items are dicts, so a string
 * pushed right above it is never one of them.) */
static bool end_of_skip(const parser_t *ps, unsigned op, const unsigned char *a) {
    if (ps->sp <= ps->skip_base)
        return true;
    if (ps->sp != ps->skip_base + 1)
        return false;
    switch (op) {
    case 0x8c:
    case 'X':
    case 0x8d:
    case 'C':
    case 'U':
    case 'T':
    case 'B':
    case 0x8e:
    case 'V': /* UNICODE */
    case 'S': /* STRING */
    case 'u':
    case 's':
    case 'd':
    case '.':
        return true;
    case 'h':
    case 'j': {
        size_t n = op == 'h' ? 1 : 4;
        if (n > ps->len - ps->pos)
            return true; /* the opcode itself reports the truncation */
        size_t idx = (size_t)le_uint(a, n);
        return idx < ps->memocap && ps->memo[idx] != NULL && ps->memo[idx]->type == PK_STR;
    }
    case 'g': /* GET */
        return text_get_is_str(ps, a);
    default:
        return false;
    }
}

/* How many of the k memo references at b (stride bytes apart, each an opcode and an n-byte key)
 * in a row name a key that is set: a skipped value's references are not followed, but one to a
 * key never set is refused there as anywhere (the general loop reports it). The keys below
 * set_below are set, known without a look at the memo (memoused without holes, else 0: see
 * memo_set_below()); every BINGET's is once 256 slots are. */
static inline __attribute__((always_inline)) size_t refs_defined(const parser_t *ps,
                                                                 const unsigned char *b, size_t k,
                                                                 size_t stride, size_t n,
                                                                 size_t set_below) {
    if (n == 1 && set_below >= 256)
        return k;
    size_t top = 0; /* the largest key, compared once */
    for (size_t i = 0; i < k; i++) {
        size_t idx = (size_t)le_uint(b + i * stride + 1, n);
        top = idx > top ? idx : top;
    }
    if (top < set_below)
        return k;
    for (size_t i = 0; i < k; i++) {
        size_t idx = (size_t)le_uint(b + i * stride + 1, n);
        if (idx >= ps->memocap || ps->memo[idx] == NULL)
            return i;
    }
    return k;
}

/* refs_defined of four LONG_BINGETs in a row (a step of skip_fast's), their keys read as words:
 * the commonest case, once a snapshot's memo has 256 slots. */
static inline __attribute__((always_inline)) size_t
four_refs_defined(const parser_t *ps, const unsigned char *b, size_t set_below) {
    uint32_t x[4];
    for (int i = 0; i < 4; i++) {
        memcpy(&x[i], b + 5 * i + 1, sizeof(x[i]));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        x[i] = __builtin_bswap32(x[i]);
#endif
    }
    uint32_t a = x[0] > x[1] ? x[0] : x[1], c = x[2] > x[3] ? x[2] : x[3];
    if ((a > c ? a : c) < set_below)
        return 4;
    return refs_defined(ps, b, 4, 5, 4, set_below);
}

/* The memo keys below which every key is set (refs_defined): memoused, or 0 once a put left a
 * hole below it. Read once per run of references: nothing a run does sets a slot. */
static inline __attribute__((always_inline)) size_t memo_set_below(const parser_t *ps) {
    return ps->memo_holes ? 0 : ps->memoused;
}

/* A run of whole memo references (BINGET, LONG_BINGET) from pos, each to a key that is set:
 * where it ends, with the number of references added to *count_p. A cut one ends it; one to a key
 * never set ends it with *undefined_p true (the general loop refuses it, as anywhere). */
static inline __attribute__((always_inline)) size_t ref_run(const parser_t *ps,
                                                            const unsigned char *p, size_t len,
                                                            size_t pos, size_t *count_p,
                                                            bool *undefined_p) {
    /* In locals, not through the pointers: a store to *count_p could be one to ps->memoused for
     * all the compiler knows, and then every step read the memo's state again. */
    const size_t below = memo_set_below(ps);
    size_t count = 0;
    for (;;) {
#if defined(__SSE2__)
        if (len - pos >= 20) {
            /* A step of one kind from 16 bytes: up to eight BINGETs (the 'h' bytes among
             * the even ones) or four LONG_BINGETs (the 'j' bytes among every fifth;
             * the fourth one's argument ends at byte 20). */
            __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(p + pos));
            unsigned t;
            size_t k, ok;
            if (p[pos] == 'h') {
                t = ~(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8('h')));
                t &= 0x5555u;
                k = t ? (unsigned)__builtin_ctz(t) >> 1 : 8;
                /* Eight in a row (a stack's frames, in runs of dozens): the next sixteen
                 * bytes in the same step, while they are eight more. */
                for (size_t more = k; more == 8 && len - pos - 2 * k >= 16; k += more) {
                    __m128i w = _mm_loadu_si128((const __m128i *)(const void *)(p + pos + 2 * k));
                    t = ~(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(w, _mm_set1_epi8('h')));
                    t &= 0x5555u;
                    more = t ? (unsigned)__builtin_ctz(t) >> 1 : 8;
                }
                ok = refs_defined(ps, p + pos, k, 2, 1, below);
                pos += 2 * ok;
            } else if (p[pos] == 'j') {
                t = ~(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8('j')));
                t &= 0x8421u;
                /* ctz / 5 for ctz in {0, 5, 10, 15}, as a multiply: written as a division, it
                 * became a div instruction where record_fast inlines this loop */
                k = t ? (unsigned)__builtin_ctz(t) * 205u >> 10 : 4;
                ok = k == 4 ? four_refs_defined(ps, p + pos, below)
                            : refs_defined(ps, p + pos, k, 5, 4, below);
                pos += 5 * ok;
            } else {
                break;
            }
            count += ok;
            if (ok < k) {
                *undefined_p = true;
                break;
            }
            continue;
        }
#else
        /* Up to four BINGETs at once: the 'h' bytes among the even bytes of 8. */
        if (len - pos >= 8 && p[pos] == 'h') {
            uint64_t w;
            memcpy(&w, p + pos, sizeof(w));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            w = __builtin_bswap64(w);
#endif
            const uint64_t lo7 = 0x7f7f7f7f7f7f7f7full;
            uint64_t x = w ^ 0x6868686868686868ull; /* 'h' bytes: 0 */
            uint64_t hi = (((x & lo7) + lo7) | x) & 0x0080008000800080ull;
            size_t k = hi ? (size_t)__builtin_ctzll(hi) >> 4 : 4;
            size_t ok = refs_defined(ps, p + pos, k, 2, 1, below);
            count += ok;
            pos += 2 * ok;
            if (ok < k) {
                *undefined_p = true;
                break;
            }
            continue;
        }
#endif
        size_t n1 = len - pos >= 2 && p[pos] == 'h'   ? 1 /* one at a time near the end */
                    : len - pos >= 5 && p[pos] == 'j' ? 4
                                                      : 0;
        if (n1 == 0)
            break;
        if (refs_defined(ps, p + pos, 1, 0, n1, below) == 0) {
            *undefined_p = true;
            break;
        }
        pos += 1 + n1;
        count++;
    }
    *count_p += count;
    return pos;
}

/* The opcodes a skipped value is made of, without building anything: every value is one of the
 * skipped PK_NONEs, of its kind; a reference does not read the memo (but the one right above the
 * skipped value, which may end it), only that its key is set; only the stack depth, the MARKs
 * and the memo (for later references outside) are kept. What references push is not written
 * either: those slots, from `filled` up, are SK_ANY and are written only when something is
 * pushed above them or the general loop gets the stack back (most skipped values end with the
 * depth back where it started, so nothing is written). An APPENDS or SETITEMS onto a target
 * not of its kind goes to the general loop. Returns at the first opcode it does not take (or
 * that would fail), or when the stack is back at the skipped value and the opcode is not a
 * MARK, MEMOIZE or reference there, for the general loop to decide; false only when the stack
 * cannot grow to the depth. */
static bool skip_fast(parser_t *ps) {
    /* The hot state in locals (written back at every exit and around memoize). */
    const unsigned char *p = ps->p;
    const size_t len = ps->len, floor = ps->skip_base + 1;
    pk_value_t *const skipped = ps->skipped, *const any = ps->skipv + SK_ANY;
    size_t pos = ps->pos, sp = ps->sp, filled = sp, skipped_at = ps->skipped_at;
    /* A value pushed here is written at once, with its kind (an APPEND or SETITEM onto it is
     * checked as onto what it stands for); with no room, the general loop pushes it. What a
     * reference pushed is counted and left unwritten (SK_ANY when written): the reference is
     * not followed. */
#define SKIP_PUSH(v)                                                                               \
    do {                                                                                           \
        if (sp >= ps->scap)                                                                        \
            goto out;                                                                              \
        while (filled < sp)                                                                        \
            ps->stack[filled++] = any;                                                             \
        ps->stack[sp++] = (v);                                                                     \
        filled = sp;                                                                               \
    } while (0)
    while (pos < len) {
        size_t left = len - pos - 1, n = 0;
        unsigned op = p[pos];
        pk_value_t *kind = skipped;
        if (sp <= floor) {
            /* Right above the skipped value only what cannot end it: MARK, MEMOIZE, and a
             * reference to a memoized value other than a string (pushed as the general loop
             * pushes it: the value itself). */
            if (sp < floor)
                break;
            if (op == 'h' || op == 'j') {
                n = op == 'h' ? 1 : 4;
                if (left < n || sp >= ps->scap)
                    break;
                size_t idx = (size_t)le_uint(p + pos + 1, n);
                if (idx >= ps->memocap || ps->memo[idx] == NULL || ps->memo[idx]->type == PK_STR)
                    break;
                while (filled < sp)
                    ps->stack[filled++] = any;
                ps->stack[sp++] = ps->memo[idx];
                filled = sp;
                skipped_at = 0;
                pos += 1 + n;
                continue;
            }
            if (op != '(' && op != 0x94)
                break;
        }
        if ((op == 'h' && left >= 1) || (op == 'j' && left >= 4)) {
            size_t first = ps->nmarks ? ps->marks[ps->nmarks - 1] : 0;
            if (first > 0 && first - 1 < filled && ps->stack[first - 1] == ps->skipv + SK_DICT) {
                /* In a dict being filled (a skipped stack's frame), one reference at a time:
                 * a key (its keys are references) is looked up, since Python refuses a key it
                 * cannot hash; one that is (or may be) such a key goes to the general loop. A
                 * value is counted as a run's are. */
                n = op == 'h' ? 1 : 4;
                size_t idx = (size_t)le_uint(p + pos + 1, n);
                if (idx >= ps->memocap || ps->memo[idx] == NULL)
                    goto out; /* the general loop refuses it */
                if ((sp - first) % 2 == 0) {
                    if (hashable(ps, ps->memo[idx]) != 1)
                        goto out;
                    SKIP_PUSH(ps->skipv + SK_HASHED);
                } else {
                    sp++;
                }
                skipped_at = 0;
                pos += 1 + n;
                continue;
            }
            /* A run of memo references (a stack's memoized frames: three in four opcodes of a
             * snapshot with stacks), counted without a pass through the switch per opcode. The
             * first one is whole; a cut one is the general loop's to report, as is one to a key
             * never set. */
            size_t sp0 = sp;
            bool undefined = false;
            pos = ref_run(ps, p, len, pos, &sp, &undefined);
            if (sp != sp0)
                skipped_at = 0;
            if (undefined)
                goto out;
            continue;
        }
        switch (op) {
        case 'K': /* BININT1 */
            n = 1;
            break;
        case 'M': /* BININT2 */
            n = 2;
            break;
        case 'J': /* BININT */
            n = 4;
            break;
        case 0x8a: /* LONG1 */
            if (left < 1 || left - 1 < p[pos + 1])
                goto out;
            n = 1 + (size_t)p[pos + 1];
            break;
        case '}':
            kind = ps->skipv + SK_DICT;
            break;
        case ']':
            kind = ps->skipv + SK_LIST;
            break;
        case ')':
            kind = ps->skipv + SK_TUPLE;
            break;
        case 'N':
        case 0x88:
        case 0x89:
            break;
        case 0x8c:  /* SHORT_BINUNICODE: made if the memo keeps it */
        case 'X': { /* BINUNICODE */
            size_t hdr = op == 0x8c ? 1 : 4;
            if (left < hdr)
                goto out;
            size_t slen = (size_t)le_uint(p + pos + 1, hdr);
            if (left - hdr < slen || slen > ps->lim.max_str ||
                utf8_bad(p + pos + 1 + hdr, slen) != slen) /* the general loop refuses it */
                goto out;
            ps->skipped_str = pos + 1 + hdr;
            ps->skipped_len = slen;
            ps->skipped_type = PK_STR;
            SKIP_PUSH(skipped);
            skipped_at = sp;
            pos += 1 + hdr + slen;
            continue;
        }
        case 0x94: { /* MEMOIZE */
            size_t idx = ps->memoused;
            size_t b = ps->nmarks ? ps->marks[ps->nmarks - 1] : 0;
            pk_value_t *top = sp <= filled ? ps->stack[sp - 1] : any;
            if (idx < ps->memocap && idx < ps->lim.max_memo && ps->memo[idx] == NULL && sp > b &&
                !(top == skipped && skipped_at == sp)) {
                ps->memo[idx] = top; /* never scratch: nothing above the skipped value is */
                ps->memoused++;
                pos++;
                continue;
            }
            goto out; /* the general loop makes the string, or fails */
        }
        case '(': /* MARK */
            if (ps->nmarks == ps->markcap)
                goto out; /* the general loop grows marks */
            if (ps->mark_scratch != NULL)
                ps->mark_scratch[ps->nmarks] = ps->scratch_used;
            ps->marks[ps->nmarks++] = sp;
            pos++;
            continue;
        case 'u':   /* SETITEMS */
        case 'e': { /* APPENDS */
            if (ps->nmarks == 0)
                goto out;
            size_t first = ps->marks[ps->nmarks - 1];
            size_t below = ps->nmarks > 1 ? ps->marks[ps->nmarks - 2] : 0;
            /* The target's kind (a value a reference pushed is not known here). */
            pk_value_t *target = first > 0 && first - 1 < filled ? ps->stack[first - 1] : any;
            if (first == 0 || first - 1 < below || (op == 'u' && (sp - first) % 2 != 0) ||
                first <= ps->skip_base || /* the general loop refuses those */
                target != ps->skipv + (op == 'u' ? SK_DICT : SK_LIST))
                goto out; /* the general loop adds to that target, or refuses it */
            /* Keys Python cannot hash (or not known: SK_ANY, unwritten) are the general
             * loop's to refuse. References pushed as keys were looked up (SK_HASHED). */
            for (size_t i = first; op == 'u' && i < sp; i += 2)
                if (i >= filled || hashable(ps, ps->stack[i]) != 1)
                    goto out;
            ps->nmarks--;
            sp = first;
            if (filled > sp)
                filled = sp;
            pos++;
            continue;
        }
        default:
            goto out;
        }
        if (left < n)
            goto out;
        SKIP_PUSH(kind);
        skipped_at = 0;
        pos += 1 + n;
    }
#undef SKIP_PUSH
out:
    if (sp > ps->scap) {
        size_t cap = ps->scap ? ps->scap : 256;
        while (cap < sp)
            cap *= 2;
        pk_value_t **ns = realloc(ps->stack, cap * sizeof(*ns));
        if (ns == NULL) {
            ps->op = pos;
            return fail(ps, "out of memory");
        }
        ps->stack = ns;
        ps->scap = cap;
    }
    while (filled < sp)
        ps->stack[filled++] = any;
    ps->pos = pos;
    ps->sp = sp;
    ps->skipped_at = skipped_at;
    return true;
}

/* The opcodes entry_fast takes: memo references and ints. */
static const bool entry_op[256] = {
    ['h'] = true, ['j'] = true, ['K'] = true, ['M'] = true, ['J'] = true, [0x8a] = true};

/* Inside a dict the record hook may take (a trace entry being filled: its MARK sits right above
 * the new dict), the opcodes of its keys and values - memo references and ints - in one loop
 * with the state in locals, instead of a pass through the general loop's checks and switch
 * each (a dozen per entry). It does what the general loop does with them: a reference pushes
 * the memo's value, an int goes to scratch. Returns at the first opcode it does not take, or
 * that would fail (the general loop then reports it), or when scratch or the stack is full. */
static void entry_fast(parser_t *ps) {
    const unsigned char *p = ps->p;
    const size_t len = ps->len, scap = ps->scap, memocap = ps->memocap;
    pk_value_t **stack = ps->stack, **memo = ps->memo;
    const uintptr_t skip_lo = (uintptr_t)ps->skipv, skip_span = ps->skip_span;
    size_t pos = ps->pos, sp = ps->sp, used = ps->scratch_used;
    while (pos < len && sp < scap) {
        unsigned op = p[pos];
        size_t left = len - pos - 1, n;
        pk_value_t *v;
        if (op == 'h' || op == 'j') { /* BINGET, LONG_BINGET */
            n = op == 'h' ? 1 : 4;
            if (left < n)
                break;
            size_t idx = (size_t)le_uint(p + pos + 1, n);
            if (idx >= memocap || memo[idx] == NULL ||
                (uintptr_t)memo[idx] - skip_lo < skip_span) /* a skipped value: is_skipped */
                break;
            v = memo[idx];
        } else if (op == 'K' || op == 'M' || op == 'J' || op == 0x8a) {
            int64_t iv;
            if (op == 0x8a) { /* LONG1 */
                uint64_t uv;
                if (left < 1 || left - 1 < p[pos + 1] ||
                    le_long_fast(p + pos + 2, p[pos + 1], len - pos - 2, &iv, &uv) != PK_INT)
                    break;
                n = 1 + (size_t)p[pos + 1];
            } else { /* BININT1, BININT2, BININT */
                n = op == 'K' ? 1 : op == 'M' ? 2 : 4;
                if (left < n)
                    break;
                uint64_t a = le_uint(p + pos + 1, n);
                iv = op == 'J' ? (int64_t)(int32_t)(uint32_t)a : (int64_t)a;
            }
            if (used == SCRATCH_VALUES)
                break;
            v = &ps->scratch[used++];
            *v = (pk_value_t){.type = PK_INT, .u.i = iv};
        } else {
            break;
        }
        stack[sp++] = v;
        pos += 1 + n;
    }
    if (sp != ps->sp)
        ps->skipped_at = 0; /* as push does */
    ps->pos = pos;
    ps->sp = sp;
    ps->scratch_used = used;
}

/* ---- whole records ---------------------------------------------------------------------- */

/* Pairs of the longest dict record_fast reads (a trace entry has 6 to 10). */
#define REC_PAIRS 32
/* Dicts in a row opening with one key that record_fast gives up on before it passes the next
 * ones with that key to the general loop at once. */
#define REC_GIVE_UP 8
/* Memo slots record_fast may set in one dict: its own, the skipped list's and a string each. */
#define REC_PUTS (REC_PAIRS + 2)

/* What record_fast has done so far, to be undone when the general loop must read the dict. */
typedef struct rec_try {
    size_t puts[REC_PUTS]; /* memo slots set (each was free) */
    size_t nputs;          /* entries in puts */
    size_t memoused;       /* ps->memoused before */
} rec_try_t;

/* The PUT opcode at p[pos] (MEMOIZE, BINPUT, LONG_BINPUT) stores v: its length, 0 when p[pos] is
 * no PUT, -1 when its slot is not a free one inside the memo (memo_put grows the memo or
 * replaces a value: the general loop's business). */
static inline __attribute__((always_inline)) long rec_put(parser_t *ps, rec_try_t *t, size_t pos,
                                                          pk_value_t *v) {
    const unsigned char *p = ps->p;
    size_t left = ps->len - pos, idx, n;
    if (p[pos] == 0x94) {
        idx = ps->memoused;
        n = 1;
    } else if ((p[pos] == 'q' && left >= 2) || (p[pos] == 'r' && left >= 5)) {
        /* A slot past the next one leaves a hole below it, as memo_put notes (noted here even
         * if the put is undone or refused: only a slower check of references then) */
        idx = p[pos] == 'q' ? p[pos + 1] : (size_t)le_uint(p + pos + 1, 4);
        n = p[pos] == 'q' ? 2 : 5;
        ps->memo_holes |= idx != ps->memoused;
    } else {
        return p[pos] == 'q' || p[pos] == 'r' ? -1 : 0;
    }
    if (idx >= ps->memocap || idx >= ps->lim.max_memo || ps->memo[idx] != NULL ||
        t->nputs == REC_PUTS)
        return -1;
    ps->memo[idx] = v;
    ps->memoused++;
    t->puts[t->nputs++] = idx;
    return (long)n;
}

/* Undo what a fast path did (t) before the general loop reads the dict. */
static inline __attribute__((always_inline)) void rec_undo(parser_t *ps, const rec_try_t *t) {
    for (size_t i = 0; i < t->nputs; i++)
        ps->memo[t->puts[i]] = NULL;
    ps->memoused = t->memoused;
}

/* Whether a fast path passes a dict opening with first_key to the general loop at once: its
 * dicts of that key were given up on again and again (REC_GIVE_UP in a row), but one in 64 is
 * still tried (they may change). */
static inline __attribute__((always_inline)) bool fast_passes(fast_fails_t *f,
                                                              const pk_value_t *first_key) {
    return first_key == f->key && f->fails >= REC_GIVE_UP && (++f->skips & 63) != 0;
}

/* A fast path gave up on a dict opening with first_key (NULL: none read). */
static inline __attribute__((always_inline)) void fast_failed(fast_fails_t *f,
                                                              const pk_value_t *first_key) {
    if (first_key == f->key) {
        if (f->fails < REC_GIVE_UP)
            f->fails++;
    } else if (first_key != NULL) {
        f->key = first_key;
        f->fails = 1;
    }
}

/* The memo value a BINGET or LONG_BINGET at p[pos] names (its length in *n_p), or NULL. */
static inline pk_value_t *rec_ref(const parser_t *ps, size_t pos, size_t *n_p) {
    const unsigned char *p = ps->p;
    size_t left = ps->len - pos - 1, n, idx;
    if (p[pos] == 'h')
        n = 1;
    else if (p[pos] == 'j')
        n = 4;
    else
        return NULL;
    if (left < n)
        return NULL;
    idx = (size_t)le_uint(p + pos + 1, n);
    if (idx >= ps->memocap)
        return NULL;
    *n_p = n;
    return ps->memo[idx];
}

/* A dict the record hook is offered, read from its EMPTY_DICT to its SETITEMS in one pass: no
 * value on the stack, no scratch, no pass through the general loop per opcode, the hook called
 * with the pairs as the general loop would have called it. Only the common shape is taken: the
 * dict memoized and opened at once (PUT, MARK), keys that are memo references to strings,
 * values that are memo references, ints of 64 bits, short strings the string cache holds
 * (optionally memoized), or, under the skipped key, a list of memo references (memoized, empty,
 * one APPEND or one MARK ... APPENDS); then SETITEMS, and the hook takes the dict. Anything
 * else (another opcode, a FRAME, a cut, an undefined reference, a PUT that would grow or
 * overwrite the memo, the hook leaving it a dict) undoes what was done (the memo slots it set)
 * and returns false with ps untouched: the general loop reads the dict from its EMPTY_DICT on,
 * and is the one that fails, with its message. ps->pos is just after the EMPTY_DICT. */
static bool record_fast(parser_t *ps) {
    const unsigned char *p = ps->p;
    const size_t len = ps->len;
    size_t pos = ps->pos;
    /* The general loop would open two MARKs (the dict's, the skipped list's), push the dict and
     * put the dict's ints in scratch: with less room than that, it decides. */
    if (ps->skipping || ps->nmarks + 2 > ps->markcap || ps->sp >= ps->scap || ps->scratch == NULL ||
        ps->scratch_used + REC_PAIRS > SCRATCH_VALUES || pos >= len)
        return false;
    rec_try_t t;
    t.nputs = 0;
    t.memoused = ps->memoused;
    pk_value_t *pairs[2 * REC_PAIRS];
    pk_value_t ints[REC_PAIRS];
    size_t np = 0, nints = 0;
    const pk_value_t *first_key = NULL; /* the dict's first key (NULL: none read) */
    /* The dict's slot holds `reserved` until the dict is made: a reference to it inside the
     * dict is left to the general loop. */
    long k = rec_put(ps, &t, pos, &ps->reserved);
    if (k <= 0)
        goto undo;
    size_t dict_slot = t.puts[0];
    pos += (size_t)k;
    if (pos >= len || p[pos] != '(')
        goto undo;
    pos++;
    for (;;) {
        if (pos >= len)
            goto undo;
        if (p[pos] == 'u')
            break;
        if (np == REC_PAIRS)
            goto undo;
        size_t n = 0;
        pk_value_t *key = rec_ref(ps, pos, &n), *val;
        if (key == NULL || key->type != PK_STR)
            goto undo;
        if (np == 0) {
            /* The dicts this path gives up on again and again: a final state's segments (their
             * pool id tuple and their blocks are the general loop's). */
            first_key = key;
            if (fast_passes(&ps->rf, key))
                goto pass;
        }
        pos += 1 + n;
        if (pos >= len)
            goto undo;
        unsigned op = p[pos];
        size_t left = len - pos - 1;
        switch (op) {
        case 'h':
        case 'j':
            val = rec_ref(ps, pos, &n);
            /* A skipped value read again under another key than the skipped one is what the
             * general loop reads whole (memo_get): it is the one to say so. */
            if (val == NULL || val == &ps->reserved ||
                (is_skipped(ps, val) && key != ps->skip_str &&
                 (ps->skip_key == NULL || key->u.str.len != ps->skip_len ||
                  memcmp(key->u.str.s, ps->skip_key, ps->skip_len) != 0)))
                goto undo;
            pos += 1 + n;
            break;
        case 'K':
        case 'M':
        case 'J':
        case 0x8a: {
            int64_t iv;
            if (op == 0x8a) { /* LONG1: what fits int64_t is the general loop's PK_INT too */
                uint64_t uv;
                if (left < 1 || left - 1 < p[pos + 1] ||
                    le_long_fast(p + pos + 2, p[pos + 1], len - pos - 2, &iv, &uv) != PK_INT)
                    goto undo;
                n = 1 + (size_t)p[pos + 1];
            } else {
                n = op == 'K' ? 1 : op == 'M' ? 2 : 4;
                if (left < n)
                    goto undo;
                uint64_t a = le_uint(p + pos + 1, n);
                iv = op == 'J' ? (int64_t)(int32_t)(uint32_t)a : (int64_t)a;
            }
            val = &ints[nints++];
            val->type = PK_INT; /* the rest of the value is not read for an int */
            val->u.i = iv;
            pos += 1 + n;
            break;
        }
        case 0x8c:  /* SHORT_BINUNICODE */
        case 'X': { /* BINUNICODE */
            size_t hdr = op == 0x8c ? 1 : 4;
            if (left < hdr)
                goto undo;
            size_t slen = (size_t)le_uint(p + pos + 1, hdr);
            if (left - hdr < slen || slen > STR_CACHE_MAX || slen > ps->lim.max_str)
                goto undo;
            const unsigned char *src = p + pos + 1 + hdr;
            val = *str_slot(ps, PK_STR, src, slen);
            if (!str_hit(val, PK_STR, src, slen))
                goto undo; /* made once by the general loop, then cached */
            pos += 1 + hdr + slen;
            if (pos < len && (k = rec_put(ps, &t, pos, val)) != 0) {
                if (k < 0)
                    goto undo;
                pos += (size_t)k;
            }
            break;
        }
        case ']': { /* EMPTY_LIST: only a skipped one */
            if (key != ps->skip_str && (ps->skip_key == NULL || key->u.str.len != ps->skip_len ||
                                        memcmp(key->u.str.s, ps->skip_key, ps->skip_len) != 0))
                goto undo;
            ps->skip_str = key; /* a value never changes: the next entry's key is known by it */
            val = ps->skipv + SK_LIST; /* as the general loop pushes a skipped EMPTY_LIST */
            pos++;
            if (pos < len && (k = rec_put(ps, &t, pos, val)) != 0) {
                if (k < 0)
                    goto undo;
                pos += (size_t)k;
            }
            if (pos >= len)
                goto undo;
            bool mark = p[pos] == '(';
            if (mark) {
                pos++;
                if (pos < len && p[pos] == 'e') /* MARK APPENDS: nothing to skip */
                    goto undo;
            }
            if (pos < len && (p[pos] == 'h' || p[pos] == 'j')) {
                /* The first item, right above the list: the general loop reads the memo for
                 * it (a string there ends the skip), and fails on an undefined one. */
                pk_value_t *first = rec_ref(ps, pos, &n);
                if (first == NULL || first->type == PK_STR)
                    goto undo;
                pos += 1 + n;
                size_t items = 1;
                bool undefined = false;
                if (mark) /* the rest are passed over, not read, as skip_fast does */
                    pos = ref_run(ps, p, len, pos, &items, &undefined);
                if (undefined)
                    goto undo; /* the general loop refuses it */
                if (pos >= len || p[pos] != (mark ? 'e' : 'a'))
                    goto undo;
                pos++;
            } else if (mark) {
                goto undo;
            }
            break;
        }
        default:
            goto undo;
        }
        pairs[2 * np] = key;
        pairs[2 * np + 1] = val;
        np++;
    }
    /* SETITEMS at p[pos]: the dict is made (as the general loop makes it at its EMPTY_DICT) and
     * offered to the hook. */
    ps->op = ps->pos - 1;
    /* The dict's value, as new_value makes it: inline, as a call it cost some 37 instructions
     * a trace entry */
    pk_doc_t *d = ps->doc;
    pk_value_t *v;
    if (d->values != NULL && d->values->used < VALUES_PER_CHUNK &&
        d->nvalues < ps->lim.max_values) {
        v = &d->values->v[d->values->used++];
        d->nvalues++;
        /* What new_value makes of it, but u.u, set below, and padding */
        v->type = PK_DICT;
        v->unhashable = false;
        v->u.seq.n = v->u.seq.cap = 0;
    } else if ((v = new_value(ps, PK_DICT)) == NULL) {
        goto undo; /* the general loop fails there the same */
    }
    uint64_t id = 0;
    if (ps->rec_fn(ps->rec_arg, pairs, 2 * np, &id) <= 0) {
        /* Left a dict (or out of memory): the general loop offers it again and decides. v was
         * the last value made: it is given back, so that the values made count as the general
         * loop's do. */
        ps->doc->values->used--;
        ps->doc->nvalues--;
        goto undo;
    }
    v->type = PK_RECORD;
    v->u.u = id;
    if (first_key == ps->rf.key)
        ps->rf.fails = 0;
    ps->memo[dict_slot] = v;
    ps->stack[ps->sp++] = v;
    ps->skipped_at = 0; /* as push does */
    ps->pos = pos + 1;
    return true;
undo:
    fast_failed(&ps->rf, first_key);
pass:
    rec_undo(ps, &t);
    return false;
}

/* The int opcode (BININT1, BININT2, BININT, or a LONG1 that fits int64_t) at p[pos] of the len
 * bytes at p: its length, its value in *iv_p; 0 when p[pos] is none of those, cut, or a LONG1 past
 * int64_t. */
static inline __attribute__((always_inline)) size_t int_at(const unsigned char *p, size_t len,
                                                           size_t pos, int64_t *iv_p) {
    size_t left = len - pos - 1;
    switch (p[pos]) {
    case 'K':
        if (left < 1)
            return 0;
        *iv_p = p[pos + 1];
        return 2;
    case 'M':
        if (left < 2)
            return 0;
        *iv_p = (int64_t)le_uint(p + pos + 1, 2);
        return 3;
    case 'J':
        if (left < 4)
            return 0;
        *iv_p = (int64_t)(int32_t)(uint32_t)le_uint(p + pos + 1, 4);
        return 5;
    case 0x8a: {
        uint64_t uv;
        if (left < 1 || left - 1 < p[pos + 1] ||
            le_long_fast(p + pos + 2, p[pos + 1], len - pos - 2, iv_p, &uv) != PK_INT)
            return 0;
        return 2 + (size_t)p[pos + 1];
    }
    default:
        return 0;
    }
}

/* rec_ref on what the caller holds in locals: the memo value a BINGET or LONG_BINGET at p[pos]
 * names (its length in *n_p), or NULL. segment_fast writes through pointers that might be ps's
 * fields for all the compiler knows: read through ps, each reference loaded them again. */
static inline __attribute__((always_inline)) pk_value_t *ref_at(const unsigned char *p, size_t len,
                                                                pk_value_t *const *memo,
                                                                size_t memocap, size_t pos,
                                                                size_t *n_p) {
    size_t left = len - pos - 1, idx;
    if (p[pos] == 'h') {
        if (left < 1)
            return NULL;
        idx = p[pos + 1];
        *n_p = 1;
    } else if (p[pos] == 'j') {
        if (left < 4)
            return NULL;
        idx = (size_t)le_uint(p + pos + 1, 4);
        *n_p = 4;
    } else {
        return NULL;
    }
    return idx < memocap ? memo[idx] : NULL;
}

/* A new value of the document's, made as new_value makes it: inline when its chunk has room. */
static inline __attribute__((always_inline)) pk_value_t *value_of(parser_t *ps, pk_type_t type) {
    pk_doc_t *d = ps->doc;
    if (d->values == NULL || d->values->used == VALUES_PER_CHUNK ||
        d->nvalues >= ps->lim.max_values)
        return new_value(ps, type);
    pk_value_t *v = &d->values->v[d->values->used++];
    d->nvalues++;
    memset(v, 0, sizeof(*v));
    v->type = type;
    return v;
}

/* Whether key (a str) is skip_key; the last one found to be is known by its address (a value
 * never changes). */
static inline bool is_skip_key(parser_t *ps, const pk_value_t *key) {
    if (key == ps->skip_str)
        return true;
    /* The first bytes at once: a segment's "blocks" is as long as "frames" */
    if (ps->skip_key == NULL || key->u.str.len != ps->skip_len || ps->skip_len == 0 ||
        key->u.str.s[0] != ps->skip_key[0] || memcmp(key->u.str.s, ps->skip_key, ps->skip_len) != 0)
        return false;
    ps->skip_str = key;
    return true;
}

/* Pairs segment_fast reads before the list it hands over (a final state's segment has 11). */
#define SEG_PAIRS 24

/* A dict record_fast refused, read as the general loop would read it up to its first list that is
 * not skipped (a final state's segment: a dozen pairs, its pool id a tuple of two ints, then its
 * blocks), and then handed over there: the stack, the MARK, the scratch and the memo made as the
 * general loop makes them, ps->pos at that list's EMPTY_LIST, the general loop reading on (the
 * blocks through record_fast, the hook at SETITEMS). Only the common shape is taken: the dict
 * memoized and opened at once, keys that are memo references to strings; values that are memo
 * references, ints of 64 bits, True and False once made, one tuple of two ints (TUPLE2,
 * optionally memoized), or the skipped key's list, empty or of one item (a segment's own frames:
 * a stack of them, MARK ... APPENDS, is the general loop's to skip). Anything else
 * undoes the memo slots it set and returns 0 with ps untouched (what it wrote above the stack's
 * and the scratch's tops is nothing the general loop reads), for the general loop to read the
 * dict from its EMPTY_DICT on. Returns 1 when handed over, -1 when making a value failed (as it
 * fails in the general loop: same message, same offset). It saves the general loop's pass per
 * opcode, the scratch moves and the collapse of the pool id: most of what a segment cost outside
 * its blocks. ps->pos is just after the EMPTY_DICT. */
static __attribute__((noinline)) int segment_fast(parser_t *ps) {
    const unsigned char *const p = ps->p;
    const size_t len = ps->len;
    pk_value_t *const *const memo = ps->memo;
    const size_t memocap = ps->memocap;
    size_t pos = ps->pos;
    /* The pairs go straight to where the general loop would push them (above the dict and its
     * MARK), the ints to scratch above what is in use: both are written, not yet counted. */
    if (ps->skipping || ps->scratch == NULL || ps->mark_scratch == NULL ||
        ps->nmarks == ps->markcap || pos >= len || ps->scap - ps->sp < 2 * SEG_PAIRS + 2 ||
        SCRATCH_VALUES - ps->scratch_used < SEG_PAIRS)
        return 0;
    pk_value_t **const out = ps->stack + ps->sp + 1;
    pk_value_t *const ints = ps->scratch + ps->scratch_used;
    rec_try_t t;
    t.nputs = 0;
    t.memoused = ps->memoused;
    size_t tup_at = 0, tup_op = 0, tup_slot = SIZE_MAX; /* the tuple's index in out (0: none),
                                                         * TUPLE2's offset, memo slot */
    int64_t tup_a = 0, tup_b = 0;
    size_t np = 0, nints = 0;
    const pk_value_t *first_key = NULL; /* the dict's first key (NULL: none read) */
    /* The dict's slot, and the tuple's until it is made, hold `reserved`: a reference to
     * either inside the dict is left to the general loop. */
    long k = rec_put(ps, &t, pos, &ps->reserved);
    if (k <= 0)
        goto undo;
    const size_t dict_slot = t.puts[0];
    pos += (size_t)k;
    if (pos >= len || p[pos] != '(')
        goto undo;
    pos++;
    for (;; np++) {
        size_t n = 0;
        if (pos >= len || np == SEG_PAIRS)
            goto undo;
        pk_value_t *key = ref_at(p, len, memo, memocap, pos, &n), *val;
        if (key == NULL || key->type != PK_STR)
            goto undo;
        if (np == 0) {
            /* The dicts this path gives up on again and again: trace entries record_fast
             * refused (they hold no list to hand over at). */
            first_key = key;
            if (fast_passes(&ps->sf, key))
                goto pass;
        }
        pos += 1 + n;
        out[2 * np] = key;
        if (pos >= len)
            goto undo;
        switch (p[pos]) {
        case 'h':
        case 'j':
            val = ref_at(p, len, memo, memocap, pos, &n);
            /* A skipped value under another key than the skipped one (a segment's frames are
             * often the first segment's empty list, memoized), or a value of this dict's: the
             * general loop's. */
            if (val == NULL || val == &ps->reserved ||
                (is_skipped(ps, val) && !is_skip_key(ps, key)))
                goto undo;
            pos += 1 + n;
            break;
        case 'K':
        case 'M':
        case 'J':
        case 0x8a: {
            int64_t a, b;
            size_t m = int_at(p, len, pos, &a), m2;
            if (m == 0)
                goto undo;
            pos += m;
            if (pos >= len || (m2 = int_at(p, len, pos, &b)) == 0) {
                /* In scratch, as entry_fast puts a taken dict's ints (scratch values are
                 * never read for more than their type and value) */
                val = &ints[nints++];
                val->type = PK_INT;
                val->unhashable = false;
                val->u.i = a;
                break;
            }
            /* Two ints and TUPLE2: a segment's pool id, made when handed over. */
            if (m2 >= len - pos || p[pos + m2] != 0x86 || tup_at != 0)
                goto undo;
            tup_at = 2 * np + 1;
            tup_op = pos + m2;
            tup_a = a;
            tup_b = b;
            pos += m2 + 1;
            if (pos < len && (k = rec_put(ps, &t, pos, &ps->reserved)) != 0) {
                if (k < 0)
                    goto undo;
                tup_slot = t.puts[t.nputs - 1];
                pos += (size_t)k;
            }
            val = NULL; /* made when handed over */
            break;
        }
        case 0x88: /* NEWTRUE */
        case 0x89: /* NEWFALSE */
            val = ps->bools[p[pos] == 0x88];
            if (val == NULL)
                goto undo; /* made once by the general loop */
            pos++;
            break;
        case ']': /* EMPTY_LIST */
            if (!is_skip_key(ps, key))
                goto hand_over; /* a list the general loop reads: its key pushed */
            /* The skipped list, as record_fast reads it (memoized, empty or one APPEND of a
             * memo reference), but for what may follow it here: the next key (a reference to a
             * string ends the list, as in the general loop). */
            val = ps->skipv + SK_LIST;
            pos++;
            if (pos < len && (k = rec_put(ps, &t, pos, val)) != 0) {
                if (k < 0)
                    goto undo;
                pos += (size_t)k;
            }
            if (pos >= len)
                goto undo;
            bool mark = p[pos] == '(';
            if (mark) {
                pos++;
                if (pos < len && p[pos] == 'e')
                    goto undo;
            }
            if (pos < len && (p[pos] == 'h' || p[pos] == 'j')) {
                /* The first item, right above the list: the general loop reads the memo for
                 * it (a string there ends the skip), and fails on an undefined one. */
                pk_value_t *first = ref_at(p, len, memo, memocap, pos, &n);
                if (first != NULL && first->type == PK_STR && !mark)
                    break; /* the next key: the list is empty */
                if (first == NULL || first->type == PK_STR)
                    goto undo;
                /* A stack of frames (MARK ... APPENDS) is the general loop's to skip: a run of
                 * references read here too (ref_run) made record_fast's own copy of it slower
                 * in the general loop. */
                if (mark)
                    goto undo;
                pos += 1 + n;
                if (pos >= len || p[pos] != 'a')
                    goto undo;
                pos++;
            } else if (mark) {
                goto undo;
            }
            break;
        default:
            goto undo;
        }
        out[2 * np + 1] = val;
    }
hand_over : {
    /* Values made in the general loop's order, each failing as it fails there (at its
     * opcode's offset): the dict at its EMPTY_DICT, the tuple's ints and the tuple at its
     * TUPLE2. */
    ps->op = ps->pos - 1;
    pk_value_t *d = value_of(ps, PK_DICT);
    if (d == NULL)
        return -1;
    if (tup_at != 0) {
        ps->op = tup_op;
        pk_value_t *a = shared_int(ps, tup_a);
        pk_value_t *b = a != NULL ? shared_int(ps, tup_b) : NULL;
        pk_value_t *tv = b != NULL ? value_of(ps, PK_TUPLE) : NULL;
        pk_value_t **items = tv != NULL ? new_items(ps, 2) : NULL;
        if (items == NULL)
            return -1;
        items[0] = a;
        items[1] = b;
        tv->u.seq.items = items;
        tv->u.seq.n = tv->u.seq.cap = 2;
        out[tup_at] = tv;
        if (tup_slot != SIZE_MAX)
            ps->memo[tup_slot] = tv;
    }
    ps->memo[dict_slot] = d;
    ps->stack[ps->sp] = d;
    ps->mark_scratch[ps->nmarks] = ps->scratch_used;
    ps->marks[ps->nmarks++] = ps->sp + 1;
    ps->sp += 2 * np + 2; /* the dict, its pairs, the list's key */
    ps->scratch_used += nints;
    ps->skipped_at = 0; /* as push does */
    ps->pos = pos;
    /* The list (EMPTY_LIST at pos) made, memoized and opened as the general loop does: a
     * segment's blocks, the dicts in it record_fast's. Room for it was checked above. */
    ps->op = pos;
    pk_value_t *l = value_of(ps, PK_LIST);
    if (l == NULL)
        return -1;
    ps->stack[ps->sp++] = l;
    ps->pos = ++pos;
    if (pos < len && p[pos] == 0x94) { /* MEMOIZE */
        ps->op = pos;
        if (!memoize(ps))
            return -1;
        ps->pos = ++pos;
    }
    if (pos < len && p[pos] == '(') { /* MARK: more than one block */
        ps->op = pos;
        if (ps->nmarks == ps->markcap && !grow_marks(ps))
            return -1;
        ps->mark_scratch[ps->nmarks] = ps->scratch_used;
        ps->marks[ps->nmarks++] = ps->sp;
        ps->pos = ++pos;
    }
    if (first_key == ps->sf.key)
        ps->sf.fails = 0;
    return 1;
}
undo:
    fast_failed(&ps->sf, first_key);
pass:
    rec_undo(ps, &t);
    return 0;
}

/* ---- text opcodes --------------------------------------------------------------------- */

/* The line that is opname's argument (its bytes up to the next '\n', consumed with it): no
 * newline before the end is a cut pickle, as pickle.load says. A number's may not hold a NUL
 * (pickle.load reads it up to the NUL; no pickler writes one); a string's may (it is part of
 * the string there too). The search stops at the input's end. */
static bool take_line(parser_t *ps, const char *opname, bool number, const unsigned char **s_p,
                      size_t *n_p) {
    const unsigned char *s = ps->p + ps->pos;
    const unsigned char *nl = memchr(s, '\n', ps->len - ps->pos);
    if (nl == NULL)
        return fail(ps, "truncated %s (no newline ends its argument)", opname);
    size_t n = (size_t)(nl - s);
    if (number && memchr(s, '\0', n) != NULL)
        return fail(ps, "%s argument holds a NUL byte", opname);
    *s_p = s;
    *n_p = n;
    ps->pos += n + 1;
    return true;
}

/* "<opname> argument '<s>' <why>". */
static __attribute__((cold)) bool text_fail(parser_t *ps, const char *opname,
                                            const unsigned char *s, size_t n, const char *why) {
    char shown[48];
    pk_text_show(s, n, shown, sizeof(shown));
    return fail(ps, "%s argument '%s' %s", opname, shown, why);
}

/* A str made of n decoded bytes at s (UTF-8), shared through the string cache as push_str
 * shares one. Made even inside a skipped value: its input bytes are not the string, so it
 * cannot wait there for the memo to keep it, as a BINUNICODE does. */
static bool push_text_str(parser_t *ps, const unsigned char *s, size_t n) {
    pk_value_t **slot = n <= STR_CACHE_MAX ? str_slot(ps, PK_STR, s, n) : NULL;
    if (slot != NULL && str_hit(*slot, PK_STR, s, n))
        return push(ps, *slot);
    pk_value_t *v = new_value(ps, PK_STR);
    char *c = v != NULL ? new_bytes(ps, s, n) : NULL;
    if (c == NULL)
        return false;
    v->u.str.s = c;
    v->u.str.len = n;
    if (slot != NULL)
        *slot = v;
    return push(ps, v);
}

/* One text opcode (protocol 0's INT, LONG, FLOAT, STRING, UNICODE, PUT, GET; protocol 1's INT
 * and LONG), its argument decoded by pickle_text.c: its value is what the binary opcode of that
 * value makes (an INT of 1 is a BININT1's, a LONG of 2^64 - 1 a LONG1's, a UNICODE a
 * BINUNICODE's UTF-8), so that a snapshot reads the same in every protocol. Out of line: no
 * pickler of protocols 2-5 writes one. */
static __attribute__((noinline)) bool text_op(parser_t *ps, unsigned op) {
    const char *name = text_name(op);
    const unsigned char *s = NULL;
    size_t n = 0;
    char why[200];
    if (!take_line(ps, name, op != 'S' && op != 'V', &s, &n))
        return false;
    switch (op) {
    case 'I':
    case 'L': {
        pk_value_t x;
        if (!pk_text_int(s, n, op == 'L', &x, why, sizeof(why)))
            return text_fail(ps, name, s, n, why);
        if (x.type == PK_INT)
            return push_int(ps, x.u.i);
        if (x.type == PK_BOOL) { /* I00, I01: False and True, one value each (as NEWFALSE's) */
            pk_value_t **b = &ps->bools[x.u.b];
            if (*b == NULL && (*b = new_value(ps, PK_BOOL)) != NULL)
                (*b)->u.b = x.u.b;
            return push(ps, *b);
        }
        pk_value_t *v = new_value(ps, x.type); /* kept, as LONG1's are */
        if (v == NULL)
            return false;
        v->u = x.u;
        return push(ps, v);
    }
    case 'F': {
        double d;
        if (!pk_text_float(s, n, &d, why, sizeof(why)))
            return text_fail(ps, name, s, n, why);
        pk_value_t *v = new_value(ps, PK_FLOAT);
        if (v == NULL)
            return false;
        v->u.f = d;
        return push(ps, v);
    }
    case 'S':
    case 'V': {
        if (n > ps->lim.max_str)
            return fail(ps, "%s of %zu bytes exceeds the limit of %zu", name, n, ps->lim.max_str);
        /* Decoded, STRING is at most as long as its argument, UNICODE at most twice (a byte
         * past 0x7f is a character of two bytes of UTF-8). */
        size_t room = op == 'V' ? 2 * n : n, k = 0;
        unsigned char small[256];
        unsigned char *buf = room <= sizeof(small) ? small : malloc(room);
        if (buf == NULL)
            return fail(ps, "out of memory");
        bool ok = op == 'S' ? pk_text_string(s, n, buf, &k, why, sizeof(why))
                            : pk_text_unicode(s, n, buf, &k, why, sizeof(why));
        if (!ok)
            text_fail(ps, name, s, n, why);
        else if (k > ps->lim.max_str)
            ok = fail(ps, "%s of %zu bytes exceeds the limit of %zu", name, k, ps->lim.max_str);
        else
            ok = push_text_str(ps, buf, k);
        if (buf != small)
            free(buf);
        return ok;
    }
    default: { /* 'p' PUT, 'g' GET */
        size_t idx;
        if (!pk_text_index(s, n, &idx, why, sizeof(why)))
            return text_fail(ps, name, s, n, why);
        if (idx == SIZE_MAX) /* past SIZE_MAX: named as written */
            return text_fail(ps, name, s, n,
                             op == 'p' ? "exceeds the memo's limit" : "is no memo key defined");
        return op == 'p' ? memo_put(ps, idx) : memo_get(ps, idx);
    }
    }
}

static bool run(parser_t *ps) {
    int64_t iv;
    uint64_t arg; /* an opcode's unsigned argument, from take_uint */
    while (ps->pos < ps->len) {
        if (ps->skipping && ps->sp > ps->skip_base) {
            if (!skip_fast(ps))
                return false;
            if (ps->pos >= ps->len)
                break;
        } else if (!ps->skipping && entry_op[ps->p[ps->pos]] && in_taken_dict(ps)) {
            entry_fast(ps);
            if (ps->pos >= ps->len)
                break;
        }
        ps->op = ps->pos;
        unsigned op = ps->p[ps->pos++];
        const unsigned char *a = ps->p + ps->pos; /* argument bytes (after need()) */
        if (ps->skipping && end_of_skip(ps, op, a))
            ps->skipping = false;
        size_t first = 0; /* set by pop_mark before every use; 0 quiets -O2 */
        switch (op) {
        case 0x80: /* PROTO */
            if (!need(ps, 1, "PROTO"))
                return false;
            if (a[0] > 5) /* pickle.load reads 0 to 5 (a pickler writes PROTO from 2 on) */
                return fail(ps, "protocol %u not supported (0-5 are)", a[0]);
            ps->pos++;
            break;
        case 0x95: /* FRAME */
            /* A length that must be there, not a boundary: what pickle.load (the C unpickler,
             * _pickle.c's load_frame) checks, and all it checks. An opcode read past the frame's
             * end, or a FRAME inside a frame, loads there; only the pure-Python unpickler
             * refuses them ("pickle exhausted before end of frame"), and pickle.load is not it
             * (test_pickle's AFrameIsALengthAsPickleLoadReadsIt). */
            if (!need(ps, 8, "FRAME"))
                return false;
            if (le_uint(a, 8) > ps->len - ps->pos - 8)
                return fail(ps, "FRAME of %llu bytes runs past the end",
                            (unsigned long long)le_uint(a, 8));
            ps->pos += 8;
            break;
        case '.': /* STOP */
            /* What pickle.load returns: the value on top of the stack, above the innermost
             * MARK (none there: it refuses); values below it and open MARKs are left unread.
             * No pickler leaves any, and skipping or the record hook may have changed what
             * they left: such a document is read whole. */
            if (ps->sp <= base(ps))
                return ps->nmarks != 0 ? fail(ps, "STOP with an open MARK and no value after it")
                                       : fail(ps, "STOP with 0 values on the stack (1 expected)");
            if ((ps->sp != 1 || ps->nmarks != 0) && (ps->skip_key != NULL || ps->rec_fn != NULL))
                return fail_whole(ps, "STOP with more than the document on the stack");
            if (!keep_values(ps, ps->sp - 1))
                return false;
            ps->doc->root = ps->stack[ps->sp - 1];
            return true;
        case '(': /* MARK */
            if (ps->nmarks == ps->markcap && !grow_marks(ps))
                return false;
            if (ps->mark_scratch != NULL)
                ps->mark_scratch[ps->nmarks] = ps->scratch_used;
            ps->marks[ps->nmarks++] = ps->sp;
            break;
        case '0': /* POP */
            if (ps->sp > base(ps))
                ps->sp--;
            else if (!pop_mark(ps, &first, "POP"))
                return false;
            else
                scratch_back(ps);
            break;
        case '1': /* POP_MARK */
            if (!pop_mark(ps, &first, "POP_MARK"))
                return false;
            ps->sp = first;
            scratch_back(ps);
            break;
        case '2': /* DUP */
            if (!need_stack(ps, 1, "DUP") || !push(ps, ps->stack[ps->sp - 1]))
                return false;
            break;
        case 'N':
            if (!push(ps, ps->skipping ? ps->skipped : new_value(ps, PK_NONE)))
                return false;
            break;
        case 0x88:   /* NEWTRUE */
        case 0x89: { /* NEWFALSE */
            /* One value for each of True and False (values never change once made): a
             * segment's is_expandable is one in every segment. */
            pk_value_t **b = &ps->bools[op == 0x88];
            if (*b == NULL && (*b = new_value(ps, PK_BOOL)) != NULL)
                (*b)->u.b = op == 0x88;
            if (!push(ps, *b))
                return false;
            break;
        }
        case 'J':   /* BININT */
        case 'K':   /* BININT1 */
        case 'M': { /* BININT2 */
            size_t n = op == 'J' ? 4 : op == 'K' ? 1 : 2;
            if (!take_uint(ps, n, op == 'J' ? "BININT" : op == 'K' ? "BININT1" : "BININT2", &arg))
                return false;
            iv = op == 'J' ? (int64_t)(int32_t)(uint32_t)arg : (int64_t)arg;
            if (!push_int(ps, iv))
                return false;
            break;
        }
        case 0x8a:   /* LONG1 */
        case 0x8b: { /* LONG4 */
            const char *name = op == 0x8a ? "LONG1" : "LONG4";
            size_t hdr = op == 0x8a ? 1 : 4;
            uint64_t n64;
            if (!take_uint(ps, hdr, name, &n64))
                return false;
            if (op == 0x8b && (n64 & 0x80000000u))
                return fail(ps, "LONG4 with a negative length");
            if (!need(ps, (size_t)n64, name))
                return false;
            uint64_t uv = 0;
            pk_type_t kind =
                le_long_fast(ps->p + ps->pos, (size_t)n64, ps->len - ps->pos, &iv, &uv);
            ps->pos += (size_t)n64;
            if (kind == PK_INT) {
                if (!push_int(ps, iv))
                    return false;
                break;
            }
            /* Kept, not refused: only a consumer that needs this number will fail. */
            pk_value_t *v = new_value(ps, kind);
            if (v == NULL)
                return false;
            if (kind == PK_UINT)
                v->u.u = uv;
            else
                v->u.bits = n64;
            if (!push(ps, v))
                return false;
            break;
        }
        case 'G': { /* BINFLOAT, big-endian */
            if (!need(ps, 8, "BINFLOAT"))
                return false;
            uint64_t u = 0;
            for (int i = 0; i < 8; i++)
                u = (u << 8) | a[i];
            ps->pos += 8;
            pk_value_t *v = new_value(ps, PK_FLOAT);
            if (v == NULL)
                return false;
            memcpy(&v->u.f, &u, sizeof(u));
            if (!push(ps, v))
                return false;
            break;
        }
        case 0x8c: /* SHORT_BINUNICODE */
        case 'C':  /* SHORT_BINBYTES */
        case 'U':  /* SHORT_BINSTRING */
            if (!take_uint(ps, 1, "string length", &arg) || !push_str(ps,
                                                                      op == 0x8c  ? AS_UTF8
                                                                      : op == 'U' ? AS_ASCII
                                                                                  : AS_BYTES,
                                                                      (size_t)arg, "string"))
                return false;
            break;
        case 'X': /* BINUNICODE */
        case 'B': /* BINBYTES */
        case 'T': /* BINSTRING (signed length) */
            if (!take_uint(ps, 4, "string length", &arg))
                return false;
            if (op == 'T' && (arg & 0x80000000u))
                return fail(ps, "BINSTRING with a negative length");
            if (!push_str(ps,
                          op == 'X'   ? AS_UTF8
                          : op == 'T' ? AS_ASCII
                                      : AS_BYTES,
                          (size_t)arg, "string"))
                return false;
            break;
        case 0x8d: /* BINUNICODE8 */
        case 0x8e: /* BINBYTES8 */
        case 0x96: /* BYTEARRAY8 */
            if (!take_uint(ps, 8, "string length", &arg))
                return false;
            if (arg > ps->len - ps->pos)
                return fail(ps, "truncated string (needs %llu bytes, %zu left)",
                            (unsigned long long)arg, ps->len - ps->pos);
            if (!push_str(ps,
                          op == 0x8d   ? AS_UTF8
                          : op == 0x8e ? AS_BYTES
                                       : AS_BYTEARRAY,
                          (size_t)arg, "string"))
                return false;
            break;
        case '}': /* EMPTY_DICT */
            if (ps->rec_fn != NULL && record_fast(ps))
                break;
            if (ps->rec_fn != NULL) { /* a segment: read up to its blocks and handed back */
                int seg = segment_fast(ps);
                if (seg < 0)
                    return false;
                if (seg > 0)
                    break;
            }
            if (!push(ps, ps->skipping ? ps->skipv + SK_DICT : new_value(ps, PK_DICT)))
                return false;
            /* A dict is memoized and opened at once (every trace entry, block and segment):
             * the MEMOIZE and MARK after it here, as their own passes through the loop would
             * take them (outside a skipped value neither looks ahead). */
            if (!ps->skipping && ps->len - ps->pos >= 2 && ps->p[ps->pos] == 0x94 &&
                ps->p[ps->pos + 1] == '(') {
                ps->op = ps->pos;
                if (!memoize(ps))
                    return false;
                ps->op = ++ps->pos;
                if (ps->nmarks == ps->markcap && !grow_marks(ps))
                    return false;
                if (ps->mark_scratch != NULL)
                    ps->mark_scratch[ps->nmarks] = ps->scratch_used;
                ps->marks[ps->nmarks++] = ps->sp;
                ps->pos++;
            }
            break;
        case ']': /* EMPTY_LIST */
            if (!ps->skipping && ps->skip_key != NULL && starts_skip(ps)) {
                ps->skipping = true;
                ps->skip_base = ps->sp;
            }
            if (!push(ps, ps->skipping ? ps->skipv + SK_LIST : new_value(ps, PK_LIST)))
                return false;
            break;
        case ')': /* EMPTY_TUPLE */
            if (!push(ps, ps->skipping ? ps->skipv + SK_TUPLE : new_value(ps, PK_TUPLE)))
                return false;
            break;
        case 'd': /* DICT */
            if (!pop_mark(ps, &first, "DICT") || !collapse(ps, first, PK_DICT, "DICT"))
                return false;
            scratch_back(ps);
            break;
        case 'l': /* LIST */
            if (!pop_mark(ps, &first, "LIST") || !collapse(ps, first, PK_LIST, "LIST"))
                return false;
            scratch_back(ps);
            break;
        case 't': /* TUPLE */
            if (!pop_mark(ps, &first, "TUPLE") || !collapse(ps, first, PK_TUPLE, "TUPLE"))
                return false;
            scratch_back(ps);
            break;
        case 0x85:   /* TUPLE1 */
        case 0x86:   /* TUPLE2 */
        case 0x87: { /* TUPLE3 */
            size_t n = op - 0x84;
            if (!need_stack(ps, n, "TUPLEn") || !collapse(ps, ps->sp - n, PK_TUPLE, "TUPLEn"))
                return false;
            break;
        }
        case 's': /* SETITEM */
            if (!need_stack(ps, 3, "SETITEM") || !extend(ps, ps->sp - 2, PK_DICT, "SETITEM", false))
                return false;
            break;
        case 'u': /* SETITEMS */
            if (!pop_mark(ps, &first, "SETITEMS") || !extend(ps, first, PK_DICT, "SETITEMS", true))
                return false;
            scratch_back(ps);
            break;
        case 'a': /* APPEND */
            if (!need_stack(ps, 2, "APPEND") || !extend(ps, ps->sp - 1, PK_LIST, "APPEND", false))
                return false;
            break;
        case 'e': /* APPENDS */
            if (!pop_mark(ps, &first, "APPENDS") || !extend(ps, first, PK_LIST, "APPENDS", true))
                return false;
            scratch_back(ps);
            break;
        case 0x8f: { /* EMPTY_SET */
            pk_value_t *v = ps->skipping ? ps->skipv + SK_SET : new_value(ps, PK_SET);
            if (v != NULL && !ps->skipping)
                v->unhashable = true; /* a set; a frozenset is hashable */
            if (!push(ps, v))
                return false;
            break;
        }
        case 0x90: /* ADDITEMS */
        case 0x91: /* FROZENSET */
            if (!pop_mark(ps, &first, op == 0x90 ? "ADDITEMS" : "FROZENSET") ||
                !set_items(ps, first, op == 0x91))
                return false;
            scratch_back(ps);
            break;
        case 'q': /* BINPUT */
            if (!take_uint(ps, 1, "BINPUT", &arg) || !memo_put(ps, (size_t)arg))
                return false;
            break;
        case 'r': /* LONG_BINPUT */
            if (!take_uint(ps, 4, "LONG_BINPUT", &arg) || !memo_put(ps, (size_t)arg))
                return false;
            break;
        case 0x94: /* MEMOIZE */
            if (!memoize(ps))
                return false;
            break;
        case 'h': /* BINGET */
            if (!take_uint(ps, 1, "BINGET", &arg) || !memo_get(ps, (size_t)arg))
                return false;
            break;
        case 'j': /* LONG_BINGET */
            if (!take_uint(ps, 4, "LONG_BINGET", &arg) || !memo_get(ps, (size_t)arg))
                return false;
            break;
        default: {
            /* The text opcodes (INT, LONG, FLOAT, STRING, UNICODE, PUT, GET) come here: no
             * pickler of protocols 2-5 writes them, and without cases of their own the code of
             * the binary ones above stays as it was (callgrind counted it 0.2-0.3% slower with
             * them). */
            if (text_name(op) != NULL) {
                if (!text_op(ps, op))
                    return false;
                break;
            }
            const char *name = forbidden_name(op);
            if (name != NULL)
                return fail_opcode(ps, name, "not allowed");
            return fail(ps, "unknown opcode 0x%02x", op);
        }
        }
    }
    ps->op = ps->pos;
    return fail(ps, "truncated pickle (no STOP)");
}

/* The skipped values, one of each kind in a row: the document's first values, all in its first
 * chunk. */
static bool make_skipped(parser_t *ps) {
    for (int k = 0; k < SK_COUNT; k++) {
        pk_value_t *v = new_value(ps, PK_NONE);
        if (v == NULL)
            return false;
        if (k == 0)
            ps->skipv = v;
        else if (v != ps->skipv + k)
            return fail(ps, "internal error: the skipped values are not in a row");
    }
    ps->skipped = ps->skipv + SK_SCALAR;
    ps->skip_span = SK_COUNT * sizeof(*ps->skipv);
    return true;
}

/* The refusal of a document whose first byte is no opcode. Out of line, as every error path of
 * the loader. */
static __attribute__((noinline, cold)) bool not_a_pickle(parser_t *ps) {
    return fail(ps,
                "not a pickle (its first byte, 0x%02x, is no pickle opcode; a pickle of protocol "
                "2-5 starts with 0x80, PROTO)",
                ps->p[0]);
}

int pk_protocol(const void *buf, size_t len) {
    const unsigned char *p = buf;
    if (len >= 2 && p[0] == 0x80)
        return p[1];
    /* Opcodes of protocol 0 (those without an argument, those with lines) are passed over;
     * the first of another protocol says 1 (a pickle with no PROTO, from a pickler of
     * protocol 1, or one of 0 edited). */
    for (size_t i = 0; i < len;) {
        unsigned op = p[i++];
        int lines = 0;
        switch (op) {
        case '.':
            return 0;
        case '(':
        case '0':
        case '2':
        case 'N':
        case 'R':
        case 'b':
        case 'd':
        case 'l':
        case 't':
        case 'a':
        case 's':
            break;
        case 'c': /* GLOBAL, INST: a module and a name */
        case 'i':
            lines = 2;
            break;
        case 'I':
        case 'L':
        case 'F':
        case 'S':
        case 'V':
        case 'p':
        case 'g':
        case 'P':
            lines = 1;
            break;
        default:
            return 1;
        }
        for (; lines > 0; lines--) {
            const unsigned char *nl = memchr(p + i, '\n', len - i);
            if (nl == NULL)
                return 0;
            i = (size_t)(nl - p) + 1;
        }
    }
    return 0;
}

bool pk_parse(const void *buf, size_t len, const pk_limits_t *lim, pk_doc_t **doc_p, char *err,
              size_t errlen) {
    return pk_parse_skip(buf, len, lim, NULL, doc_p, err, errlen);
}

bool pk_parse_skip(const void *buf, size_t len, const pk_limits_t *lim, const char *skip_key,
                   pk_doc_t **doc_p, char *err, size_t errlen) {
    return pk_parse_records(buf, len, lim, skip_key, NULL, NULL, doc_p, err, errlen);
}

bool pk_parse_records(const void *buf, size_t len, const pk_limits_t *lim, const char *skip_key,
                      pk_record_fn fn, void *arg, pk_doc_t **doc_p, char *err, size_t errlen) {
    parser_t ps;
    memset(&ps, 0, sizeof(ps));
    ps.moved_min = SIZE_MAX;
    ps.rec_fn = fn;
    ps.rec_arg = arg;
    ps.skip_key = skip_key;
    ps.skip_len = skip_key != NULL ? strlen(skip_key) : 0;
    ps.p = buf;
    ps.len = buf != NULL ? len : 0;
    ps.err = err;
    ps.errlen = errlen;
    if (lim != NULL)
        ps.lim = *lim;
    else
        pk_limits_default(&ps.lim);
    size_t memo_by_len = ps.len > ((size_t)1 << 24) ? ps.len : (size_t)1 << 24;
    if (ps.lim.max_memo > memo_by_len)
        ps.lim.max_memo = memo_by_len;
    if (ps.lim.max_depth == 0)
        ps.lim.max_depth = 1;
    ps.doc = calloc(1, sizeof(*ps.doc));
    ps.markcap = ps.lim.max_depth < 64 ? ps.lim.max_depth : 64;
    ps.marks = malloc(ps.markcap * sizeof(*ps.marks));
    /* The memo sized once from the input: PyTorch's snapshots memoize a value every 30-130
     * bytes (most every 60-110), and growing it left each smaller copy behind, below the next
     * one, so that the heap spread over another huge page on traces of a MB or two. Its slots
     * are cleared as the puts reach them (memo_room): the part a document does not use is not
     * touched. A 48th of the input, grown by half when short (the LinYun xl ctx512 full step
     * trace was 25 slots short of a 64th, and its memo then doubled), touched fewer huge pages
     * over 32 large real traces than a 40th or a 64th. */
    size_t memo0 = ps.len / 48 < ps.lim.max_memo ? ps.len / 48 : ps.lim.max_memo;
    if (memo0 > 1024 && (ps.memo = malloc(memo0 * sizeof(*ps.memo))) != NULL)
        ps.memoalloc = memo0; /* cleared as the puts reach its slots (memo_room) */
    if (fn != NULL) {
        ps.scratch = malloc(SCRATCH_VALUES * sizeof(*ps.scratch));
        ps.mark_scratch = malloc(ps.markcap * sizeof(*ps.mark_scratch));
    }
    bool ok;
    if (ps.doc == NULL || ps.marks == NULL ||
        (fn != NULL && (ps.scratch == NULL || ps.mark_scratch == NULL)))
        ok = fail(&ps, "out of memory");
    else if (ps.len == 0)
        ok = fail(&ps, "empty input");
    else if (skip_key != NULL && !make_skipped(&ps))
        ok = false;
    else if (opcode_names[ps.p[0]] == NULL) /* protocols 2-5 open with PROTO, 0 and 1 with any */
        ok = not_a_pickle(&ps);
    else
        ok = run(&ps);
    free(ps.stack);
    free(ps.marks);
    free(ps.memo);
    free(ps.scratch);
    free(ps.mark_scratch);
    if (!ok) {
        pk_free(ps.doc);
        return false;
    }
    trim_own_items(ps.doc);
    *doc_p = ps.doc;
    return true;
}

/* Whether buf[0..len) may start a snapshot: its first byte is a pickle opcode (PROTO, 0x80, for
 * protocols 2-5; any for 0 and 1), or its first byte that is not white space (if any, after a
 * byte order mark) is a JSON document's '{' or '['. (White space or a mark before a 0x80 is no
 * pickle: the loader refuses a pickle that does not start at byte 0.) */
static bool may_be_snapshot(const unsigned char *buf, size_t len) {
    if (len > 0 && opcode_names[buf[0]] != NULL)
        return true;
    /* A UTF-8 byte order mark before a JSON document (tr_load_opts skips it). */
    size_t i = len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
    if (i == 0 && len < 3 && memcmp(buf, "\xEF\xBB\xBF", len) == 0)
        return true; /* too few bytes yet to tell */
    while (i < len && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t'))
        i++;
    return i == len || buf[i] == '{' || buf[i] == '[';
}

/* How a stream's pickle is read so far (pk_read_file): the opcodes are walked as they arrive,
 * only far enough to see where the parser will refuse the input whatever follows. */
typedef struct opscan {
    size_t pos;        /* the next opcode's offset */
    size_t need;       /* bytes the parser looks at before that refusal: the frames' ends */
    bool refused;      /* an opcode at or before pos is refused, whatever bytes follow */
    bool stopped;      /* STOP met: the parser reads no further */
    size_t next_check; /* when to parse what arrived (stream_refused) */
    bool stop_checked; /* parsed up to the STOP */
    bool done;         /* the first STREAM_CHECK_MAX bytes were looked at */
    size_t zip_pos;    /* a zip archive's: where the next local header starts */
    bool zip_done;     /* a zip archive's directory (or a member of unknown size) reached */
} opscan_t;

/* The bytes of opcode op's argument at a (avail of them there): its fixed part plus the length
 * it gives, SIZE_MAX when more bytes are needed to tell, or 0 for none. Lines (the text opcodes'
 * arguments) end at a '\n'. */
static uint64_t op_arg_bytes(unsigned op, const unsigned char *a, size_t avail) {
    int fixed = 0, count = 0, lines = 0; /* count: bytes of a length that follows fixed ones */
    switch (op) {
    case 0x80:
    case 'K':
    case 'h':
    case 'q':
        fixed = 1;
        break;
    case 'M':
        fixed = 2;
        break;
    case 'J':
    case 'j':
    case 'r':
        fixed = 4;
        break;
    case 'G':
    case 0x95:
        fixed = 8;
        break;
    case 'U':
    case 'C':
    case 0x8c:
    case 0x8a:
        count = 1;
        break;
    case 'T':
    case 'X':
    case 'B':
    case 0x8b:
        count = 4;
        break;
    case 0x8d:
    case 0x8e:
    case 0x96:
        count = 8;
        break;
    case 'I':
    case 'L':
    case 'F':
    case 'S':
    case 'V':
    case 'p':
    case 'g':
        lines = 1;
        break;
    default:
        return 0;
    }
    if (lines > 0) {
        const unsigned char *nl = memchr(a, '\n', avail);
        return nl == NULL ? SIZE_MAX : (uint64_t)(nl - a) + 1;
    }
    if (count == 0)
        return avail >= (size_t)fixed ? (uint64_t)fixed : SIZE_MAX;
    if (avail < (size_t)count)
        return SIZE_MAX;
    uint64_t n = le_uint(a, (size_t)count);
    return n > UINT64_MAX - 8 ? UINT64_MAX - 1 : n + (uint64_t)count;
}

/* Whether the parser reads opcode op at all (the rest it refuses where it meets them: an
 * unknown byte, or one that builds objects or calls code). Its own switch and text_name. */
static bool op_read(unsigned op) {
    static const char ops[] = ".(012NJKMGCUXBT}])dltsuaeqrhjILFSVpg";
    return (op >= 0x80 && op <= 0x96 && forbidden_name(op) == NULL) ||
           (op != 0 && strchr(ops, (int)op) != NULL); /* strchr finds the terminator's 0 */
}

/* Walk the opcodes of buf[s->pos..len) (a prefix of the input, max_bytes at most in all). */
static void opscan(opscan_t *s, const unsigned char *buf, size_t len, size_t max_bytes) {
    while (!s->refused && !s->stopped && s->pos < len) {
        unsigned op = buf[s->pos];
        if (!op_read(op)) {
            s->refused = true;
            return;
        }
        uint64_t n = op_arg_bytes(op, buf + s->pos + 1, len - s->pos - 1);
        if (n == SIZE_MAX)
            return; /* its argument is not all here yet */
        if (op == 0x80 && buf[s->pos + 1] > 5) {
            s->refused = true; /* a protocol pickle.load does not read */
            return;
        }
        if ((op == 'T' || op == 0x8b) && (buf[s->pos + 4] & 0x80) != 0) {
            /* A negative length (BINSTRING's, LONG4's), refused whatever follows: the string
             * it would wait for was read to the 4 GiB cap first (/dev/urandom: GBs). */
            s->refused = true;
            return;
        }
        if (op == 0x95) {
            /* The parser checks that a frame's bytes are there: the input must reach its end
             * before a later refusal reads alike; one that ends past max_bytes is refused. */
            uint64_t end = le_uint(buf + s->pos + 1, 8);
            end = end > max_bytes ? UINT64_MAX : end + s->pos + 9;
            if (end > max_bytes) {
                s->refused = true;
                return;
            }
            s->need = s->need > end ? s->need : (size_t)end;
        }
        if (n > len - s->pos - 1)
            return; /* a string that has not all arrived: read on */
        s->stopped = op == '.';
        s->pos += 1 + (size_t)n;
    }
}

/* Where the pickle at the start of buf[0..len) ends: the offset just past its STOP, or 0 when the
 * walk meets none there (or an opcode the parser refuses, or an argument past len). What the
 * values are is the parser's business: this only finds the end, for a file of several pickles one
 * after another (torch.save's format before torch 1.6). */
size_t pk_pickle_end(const void *buf, size_t len) {
    opscan_t s = {0};
    opscan(&s, buf, len, len);
    return s.stopped ? s.pos : 0;
}

/* Whether a JSON stream's bytes so far hold one that no JSON document the loader reads has
 * anywhere (inside a string or out): a control character other than the white space, or one
 * that is never UTF-8 (0xc0, 0xc1, 0xf5-0xff). Its reader (core/json_read.c) goes from the
 * start and refuses at that byte or before it, as it would on the whole input; s->pos is where
 * the walk goes on. */
static bool json_refused(opscan_t *s, const unsigned char *buf, size_t len) {
    for (; s->pos < len; s->pos++) {
        unsigned char b = buf[s->pos];
        if ((b < 0x20 && b != ' ' && b != '\t' && b != '\n' && b != '\r') || b == 0xc0 ||
            b == 0xc1 || b >= 0xf5)
            return true;
    }
    return false;
}

/* Where err (a parser's refusal) says it stopped: the offset after its last "offset ", or
 * SIZE_MAX when it names none. */
static size_t err_offset(const char *err) {
    const char *at = NULL;
    for (const char *p = strstr(err, "offset "); p != NULL; p = strstr(p + 1, "offset "))
        at = p + strlen("offset ");
    if (at == NULL || *at < '0' || *at > '9')
        return SIZE_MAX;
    size_t v = 0;
    for (; *at >= '0' && *at <= '9' && v < SIZE_MAX / 16; at++)
        v = v * 10 + (size_t)(*at - '0');
    return v;
}

/* A stream's bytes are walked, and parsed whole at doublings of what has arrived, up to this
 * many: junk is refused in its first bytes (every junk stream of tests/cli/stream_junk.py in
 * its first read), and a valid stream costs little more than its file (walked and parsed to
 * 1 MiB, a 1 MB trace through a pipe took 2.3x the instructions of `info` on its file;
 * bench/results/2026-11-30-s27-stream-junk.jsonl). */
#define STREAM_CHECK_MAX ((size_t)64 << 10)

/* A stream that began as a zip archive (what torch.save writes; tr_load_opts reads the snapshot
 * in it) is read to its end, where the archive's directory is, as long as what arrived is a run
 * of members: each a local file header (PKWARE's APPNOTE.TXT 4.3.7: signature, sizes, name and
 * extra field lengths; a ZIP64 size in the extra field's id 1, 4.5.3) and its data, up to the
 * central directory. Junk after a "PK\3\4" is refused at the first place a header should be,
 * not read to the 4 GiB limit. A member whose sizes follow its data (flag bit 3) ends the walk:
 * read on. */
static bool zip_stream_refused(opscan_t *s, const unsigned char *b, size_t len) {
    /* Resumed where the last call stopped: a stream of many members is walked once, not from
     * its start at every read. */
    size_t p = s->zip_pos;
    while (!s->zip_done && len - p >= 4) {
        if (memcmp(b + p, "PK\1\2", 4) == 0 || memcmp(b + p, "PK\6\6", 4) == 0 ||
            memcmp(b + p, "PK\5\6", 4) == 0) {
            s->zip_done = true; /* the directory: the end is near */
            break;
        }
        if (memcmp(b + p, "PK\3\4", 4) != 0)
            return true;
        if (len - p < 30)
            break;
        const unsigned char *h = b + p;
        uint64_t flags = le_uint(h + 6, 2), size = le_uint(h + 18, 4), nl = le_uint(h + 26, 2),
                 xl = le_uint(h + 28, 2);
        if (flags & 8) {
            s->zip_done = true;
            break;
        }
        if (len - p - 30 < nl + xl)
            break;
        if (size == 0xFFFFFFFFu) { /* the compressed size, after the original one */
            const unsigned char *x = h + 30 + nl;
            size_t at = 0;
            while (at + 4 <= xl && le_uint(x + at, 2) != 1)
                at += 4 + le_uint(x + at + 2, 2);
            if (at + 20 > xl || le_uint(x + at + 2, 2) < 16)
                return true;
            size = le_uint(x + at + 12, 8);
        }
        if (size > len - p - 30 - nl - xl)
            break; /* its data still arriving: this header is read again next time */
        p += 30 + nl + xl + size;
    }
    s->zip_pos = p;
    return false;
}

/* Whether a stream's bytes so far, buf[0..len), show the input refused whatever follows, read
 * as the loaders read it (a pickle from byte 0; a JSON document after white space): what the
 * parser then says of these bytes is what it says of the whole. The opcodes are walked as they
 * arrive (opscan); a refusal the walk cannot see (a value the stack does not have, a memo key
 * never put) is the parser's own, on what has arrived: one at an opcode whose arguments all
 * arrived, before the frames' ends, reads alike on the whole input. */
static bool stream_refused(opscan_t *s, const unsigned char *buf, size_t len, size_t max_bytes) {
    if (memcmp(buf, "PK\3\4", len < 4 ? len : 4) == 0)
        return len >= 4 && zip_stream_refused(s, buf, len);
    if (!may_be_snapshot(buf, len))
        return true;
    if (s->refused)
        return len >= s->need;
    /* Only the first bytes are looked at; past them a stream is read on to its end, as a file
     * is: the walk and the parses cost a valid one more than its load (a full parse at its STOP
     * was 4x the instructions of `info` on it). */
    if (s->done)
        return false;
    size_t n = len < STREAM_CHECK_MAX ? len : STREAM_CHECK_MAX;
    s->done = n == STREAM_CHECK_MAX;
    if (opcode_names[buf[0]] == NULL)
        return s->refused = json_refused(s, buf, n);
    opscan(s, buf, n, max_bytes);
    if (s->refused)
        return len >= s->need;
    /* Past a STOP the parser reads nothing more: what it says of these bytes is final, and it
     * is asked once; the last look parses what it has. */
    if (n < s->need || s->stop_checked || (!s->stopped && !s->done && n < s->next_check))
        return false;
    s->next_check = n * 2;
    s->stop_checked = s->stopped;
    char err[256] = "";
    pk_doc_t *doc = NULL;
    if (pk_parse(buf, n, NULL, &doc, err, sizeof err)) {
        pk_free(doc);
        return false;
    }
    return s->refused = !pk_err_whole(err) && err_offset(err) < s->pos;
}

bool pk_read_file(const char *path, size_t max_bytes, unsigned char **buf_p, size_t *len_p,
                  char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return false;
    }
    /* A regular file's size (plus one byte, to see the end without growing) is all we read: one
     * allocation, no copies while growing. */
    size_t cap = 1 << 20, len = 0;
    struct stat sb;
    bool regular = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
    if (regular && (uint64_t)sb.st_size >= max_bytes) {
        /* Refused from its size: reading max_bytes of it first took that much memory and tens
         * of seconds (a sparse 20 GiB file: 4 GiB resident, 20 s) before the same refusal, or
         * ended as "out of memory" under a memory limit. */
        snprintf(err, errlen, "%s is larger than %zu bytes (%llu bytes): too large to be read",
                 path, max_bytes, (unsigned long long)sb.st_size);
        close(fd);
        return false;
    }
    if (regular && sb.st_size >= 0)
        cap = (size_t)sb.st_size + 1;
    unsigned char *buf = malloc(cap);
    bool ok = buf != NULL;
    if (!ok)
        snprintf(err, errlen, "out of memory reading %s", path);
    opscan_t scan = {0};
    while (ok) {
        if (len == cap) {
            if (cap >= max_bytes) {
                snprintf(err, errlen, "%s is larger than %zu bytes", path, max_bytes);
                ok = false;
                break;
            }
            cap = cap * 2 > max_bytes ? max_bytes : cap * 2;
            unsigned char *nb = realloc(buf, cap);
            if (nb == NULL) {
                snprintf(err, errlen, "out of memory reading %s", path);
                ok = false;
                break;
            }
            buf = nb;
        }
        /* read, not fread: a pipe's bytes are looked at as they come (fread waited for its
         * whole buffer, a MB, from a writer that may send no more). */
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
            ok = false;
            break;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        /* A stream (/dev/zero, /dev/urandom, a pipe) whose first bytes are refused is not read
         * to max_bytes first: the caller refuses it from these bytes. A regular file is read
         * whole (its size is known, and the parser walks it anyway). */
        if (!regular ? stream_refused(&scan, buf, len, max_bytes) : !may_be_snapshot(buf, len))
            break;
    }
    close(fd);
    if (!ok) {
        free(buf);
        return false;
    }
    *buf_p = buf;
    *len_p = len;
    return true;
}

bool pk_parse_file(const char *path, size_t max_bytes, const pk_limits_t *lim, pk_doc_t **doc_p,
                   char *err, size_t errlen) {
    unsigned char *buf = NULL;
    size_t len = 0;
    if (!pk_read_file(path, max_bytes, &buf, &len, err, errlen))
        return false;
    bool ok = pk_parse(buf, len, lim, doc_p, err, errlen);
    free(buf);
    return ok;
}

/* ---- accessors -------------------------------------------------------------------------- */

const pk_value_t *pk_root(const pk_doc_t *doc) {
    return doc ? doc->root : NULL;
}

const pk_value_t *pk_get(const pk_value_t *dict, const char *key) {
    if (dict == NULL || dict->type != PK_DICT)
        return NULL;
    size_t klen = strlen(key);
    for (size_t i = dict->u.seq.n; i >= 2; i -= 2) {
        const pk_value_t *k = dict->u.seq.items[i - 2];
        if (k->type == PK_STR && k->u.str.len == klen && memcmp(k->u.str.s, key, klen) == 0)
            return dict->u.seq.items[i - 1];
    }
    return NULL;
}

bool pk_num(const pk_value_t *v, double *out) {
    int64_t i;
    if (v != NULL && v->type == PK_FLOAT) {
        *out = v->u.f;
        return true;
    }
    if (v != NULL && v->type == PK_UINT) {
        *out = (double)v->u.u;
        return true;
    }
    if (!pk_int(v, &i))
        return false;
    *out = (double)i;
    return true;
}

bool pk_get_int(const pk_value_t *dict, const char *key, int64_t *out) {
    return pk_int(pk_get(dict, key), out);
}

bool pk_get_uint(const pk_value_t *dict, const char *key, uint64_t *out) {
    return pk_uint(pk_get(dict, key), out);
}

const char *pk_get_str(const pk_value_t *dict, const char *key) {
    return pk_str(pk_get(dict, key));
}
