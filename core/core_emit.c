/*
 * core_emit.c: the structured emitter behind snapshots (pickle protocol 4 or JSON) and the
 * atomic file writer. See core_emit.h for the opcode set.
 *
 * Invariants: in pickle mode every open container has a MARK on the unpickler's stack at
 * mark[depth-1]; items are flushed with SETITEMS/APPENDS every BATCH items (as CPython does) so
 * that no unpickler has to splice an unbounded stack slice at once; an empty container leaves no
 * MARK behind. Once `failed` is set every call is a no-op and finish reports the failure
 * (`oom` says whether it was host memory, so that a failure with containers still open is not
 * mistaken for the caller's imbalance). No lock: an emitter belongs to one thread; the fault hook
 * is one atomic counter.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "core/core_emit.h"
#include "sympool/experimental.h" /* SP_X_TEMP_*: the temporaries observer's events */

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define BATCH 1000

enum {
    OP_MARK = '(',
    OP_STOP = '.',
    OP_BINFLOAT = 'G',
    OP_BININT = 'J',
    OP_BININT1 = 'K',
    OP_BININT2 = 'M',
    OP_NONE = 'N',
    OP_BINUNICODE = 'X',
    OP_EMPTY_DICT = '}',
    OP_APPENDS = 'e',
    OP_EMPTY_LIST = ']',
    OP_SETITEMS = 'u',
    OP_PROTO = 0x80,
    OP_TUPLE2 = 0x86,
    OP_NEWTRUE = 0x88,
    OP_NEWFALSE = 0x89,
    OP_LONG1 = 0x8a,
    OP_LONG4 = 0x8b,
    OP_SHORT_BINUNICODE = 0x8c,
    OP_MEMOIZE = 0x94,
    OP_BINGET = 'h',
    OP_LONG_BINGET = 'j'
};

/* Allocations left before the injected failure; 0 = no fault armed. */
static atomic_long g_fault_left;

void sp__emit_fault_after(long n) {
    atomic_store(&g_fault_left, n > 0 ? n : 0);
}

void *sp__emit_realloc(void *p, size_t n) {
    long left = atomic_load_explicit(&g_fault_left, memory_order_relaxed);
    if (SP_UNLIKELY(left > 0)) {
        /* Count down to 1, then stay there: the armed call and every later one fail. */
        if (left == 1 || atomic_fetch_sub(&g_fault_left, 1) <= 1) {
            atomic_store(&g_fault_left, 1);
            return NULL;
        }
    }
    return realloc(p, n);
}

/* Grow the buffer for n more bytes (the cold half of put). */
static __attribute__((noinline)) bool grow(sp__emit_t *e, size_t n) {
    size_t cap = e->cap ? e->cap : 4096;
    while (cap < e->len + n)
        cap *= 2;
    char *nb = sp__emit_realloc(e->buf, cap);
    if (nb == NULL) {
        e->failed = true;
        e->oom = true;
        return false;
    }
    e->buf = nb;
    e->cap = cap;
    return true;
}

static inline void put(sp__emit_t *e, const void *p, size_t n) {
    if (e->failed)
        return;
    if (e->len + n > e->cap && !grow(e, n))
        return;
    if (p != NULL)
        memcpy(e->buf + e->len, p, n);
    e->len += n;
}

static inline void put1(sp__emit_t *e, unsigned c) {
    if (SP_LIKELY(!e->failed && e->len < e->cap)) {
        e->buf[e->len++] = (char)c;
        return;
    }
    unsigned char b = (unsigned char)c;
    put(e, &b, 1);
}

/* Room for n more bytes at the end of the buffer, or NULL once the emitter failed: the caller
 * writes them and sets e->len past what it wrote (one check for a whole value). */
static inline unsigned char *room(sp__emit_t *e, size_t n) {
    if (SP_UNLIKELY(e->failed || (e->cap - e->len < n && !grow(e, n))))
        return NULL;
    return (unsigned char *)e->buf + e->len;
}

static inline void done(sp__emit_t *e, const unsigned char *end) {
    e->len = (size_t)(end - (const unsigned char *)e->buf);
}

/* The pickle encodings, written at p (at most 10 bytes), returning the end: the generic calls
 * and the pairs below share them, so both write the same bytes. */
static inline unsigned char *w_int(unsigned char *p, int64_t v) {
    if (v >= 0 && v <= 0xff) {
        p[0] = OP_BININT1;
        p[1] = (unsigned char)v;
        return p + 2;
    }
    if (v >= 0 && v <= 0xffff) {
        p[0] = OP_BININT2;
        p[1] = (unsigned char)(v & 0xff);
        p[2] = (unsigned char)(v >> 8);
        return p + 3;
    }
    if (v >= INT32_MIN && v <= INT32_MAX) {
        uint32_t u = (uint32_t)(int32_t)v;
        p[0] = OP_BININT;
        p[1] = (unsigned char)(u & 0xff);
        p[2] = (unsigned char)((u >> 8) & 0xff);
        p[3] = (unsigned char)((u >> 16) & 0xff);
        p[4] = (unsigned char)(u >> 24);
        return p + 5;
    }
    /* LONG1: minimal little-endian two's complement. */
    unsigned char le[8];
    uint64_t u = (uint64_t)v;
    size_t n = 8;
    for (size_t i = 0; i < 8; i++)
        le[i] = (unsigned char)(u >> (8 * i));
    /* Drop high bytes that only repeat the sign of the byte below them. */
    while (n > 1 && ((le[n - 1] == 0x00 && !(le[n - 2] & 0x80)) ||
                     (le[n - 1] == 0xff && (le[n - 2] & 0x80))))
        n--;
    p[0] = OP_LONG1;
    p[1] = (unsigned char)n;
    memcpy(p + 2, le, 8); /* room for 10 bytes either way; only n of them count */
    return p + 2 + n;
}

static inline unsigned char *w_memo_get(unsigned char *p, uint32_t index) {
    if (index <= 0xff) {
        p[0] = OP_BINGET;
        p[1] = (unsigned char)index;
        return p + 2;
    }
    p[0] = OP_LONG_BINGET;
    p[1] = (unsigned char)(index & 0xff);
    p[2] = (unsigned char)((index >> 8) & 0xff);
    p[3] = (unsigned char)((index >> 16) & 0xff);
    p[4] = (unsigned char)(index >> 24);
    return p + 5;
}

/* An unsigned value: as an int up to INT64_MAX, else LONG1 of 9 bytes (at most 11 bytes). */
static inline unsigned char *w_uint(unsigned char *p, uint64_t v) {
    if (v <= (uint64_t)INT64_MAX)
        return w_int(p, (int64_t)v);
    p[0] = OP_LONG1;
    p[1] = 9;
    for (size_t i = 0; i < 8; i++)
        p[2 + i] = (unsigned char)(v >> (8 * i));
    p[10] = 0; /* keeps it positive */
    return p + 11;
}

/* The slot holding s in the table of strings written once and then referred to, or the empty
 * slot where it would go (linear probing; the table never fills, see put_str_static). */
static inline size_t static_find(const sp__emit_t *e, const char *s) {
    size_t h = (size_t)(((uintptr_t)s >> 3) * 0x9e3779b97f4a7c15ull >> 56);
    for (size_t i = 0; i < SP__EMIT_STATIC; i++) {
        size_t k = (h + i) & (SP__EMIT_STATIC - 1);
        if (e->skey[k] == s || e->skey[k] == NULL)
            return k;
    }
    return SIZE_MAX;
}

static void puts_(sp__emit_t *e, const char *s) {
    put(e, s, strlen(s));
}

/* The open containers' array: the emitter's own. */
static void depth_inline(sp__emit_t *e) {
    e->lv = e->lv0;
    e->depth_cap = SP__EMIT_MAX_DEPTH;
}

static void depth_free(sp__emit_t *e) {
    if (e->lv != e->lv0)
        free(e->lv);
    depth_inline(e);
}

/* Room for twice as many open containers (on the heap; out of memory fails the document). */
static bool depth_grow(sp__emit_t *e) {
    if (e->depth_cap > INT_MAX / 2) {
        e->failed = true;
        return false;
    }
    size_t n = (size_t)e->depth_cap * 2;
    sp__emit_level_t *lv = sp__emit_realloc(NULL, n * sizeof(*lv)); /* the fault hook's too */
    if (lv == NULL) {
        e->failed = true;
        e->oom = true;
        return false;
    }
    memcpy(lv, e->lv, (size_t)e->depth * sizeof(*lv));
    depth_free(e);
    e->lv = lv;
    e->depth_cap = (int)n;
    return true;
}

void sp__emit_init(sp__emit_t *e, bool json) {
    memset(e, 0, sizeof(*e));
    e->json = json;
    depth_inline(e);
    if (!json) {
        put1(e, OP_PROTO);
        put1(e, 4);
    }
}

void sp__emit_discard(sp__emit_t *e) {
    free(e->buf);
    free(e->jmemo);
    free(e->jcopy);
    depth_free(e);
    memset(e, 0, sizeof(*e));
    depth_inline(e);
}

void sp__emit_to_file(sp__emit_t *e, sp__atomic_file_t *f) {
    e->sink = f;
}

/* Hand the buffer's bytes to the sink; the buffer is reused from its start. */
static void flush(sp__emit_t *e) {
    if (e->len == 0)
        return;
    if (sp__file_atomic_write(e->sink, e->buf, e->len) != SP_SUCCESS) {
        e->failed = true;
        e->sink_failed = true;
        return;
    }
    e->flushed += e->len;
    e->len = 0;
    /* The open containers' MARKs are in the file now: never "just after the MARK" again. Their
     * JSON openings are too: none of them can be memoized at its end. */
    for (int d = 0; d < e->depth; d++) {
        e->lv[d].mark = SIZE_MAX - 1;
        e->lv[d].vstart = SIZE_MAX;
    }
    e->last_len = 0;
}

#define FLUSH_AT ((size_t)256 * 1024)

void sp__emit_flush_point(sp__emit_t *e) {
    if (e->sink == NULL || e->failed || e->len < FLUSH_AT)
        return;
    for (int d = 0; d < e->depth && !e->json; d++)
        if (e->lv[d].count == 0)
            return;
    flush(e);
}

sp_status_t sp__emit_finish(sp__emit_t *e, char **buf_p, size_t *len_p) {
    if (!e->json)
        put1(e, OP_STOP);
    else
        put1(e, '\n');
    if (e->sink != NULL && !e->failed && e->depth == 0)
        flush(e);
    if (e->sink_failed) {
        sp__emit_discard(e);
        return SP_ERR_SYSTEM; /* the write's own error says why */
    }
    if (e->failed || e->depth != 0) {
        /* Out of memory stops the writer wherever it was, containers open or not: that is the
         * cause to report. Only a writer that never ran out and still ends unbalanced is our
         * bug. */
        bool oom = e->oom;
        size_t cap = e->cap;
        sp__emit_discard(e);
        return oom ? sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY,
                               "out of host memory writing a snapshot (growing its %zu-byte "
                               "buffer failed)",
                               cap)
                   : sp__error(SP_ERR_INTERNAL, SP_SUB_HISTORY,
                               "snapshot writer: unbalanced containers");
    }
    if (e->sink != NULL) {
        *buf_p = NULL;
        *len_p = e->flushed;
        free(e->buf);
    } else {
        *buf_p = e->buf;
        *len_p = e->len;
    }
    e->buf = NULL;
    e->len = e->cap = 0;
    free(e->jmemo);
    e->jmemo = NULL;
    e->jmemo_n = e->jmemo_cap = 0;
    free(e->jcopy);
    e->jcopy = NULL;
    e->jcopy_len = e->jcopy_cap = 0;
    depth_free(e);
    return SP_SUCCESS;
}

/* Called before every item of a list and every key of a dict: commas (JSON) and batching. */
static void before_item(sp__emit_t *e) {
    if (e->depth == 0)
        return;
    int d = e->depth - 1;
    if (e->json) {
        if (e->lv[d].count > 0)
            put1(e, ',');
    } else if (e->lv[d].count > 0 && e->lv[d].count % BATCH == 0) {
        put1(e, e->lv[d].kind == 'd' ? OP_SETITEMS : OP_APPENDS);
        e->lv[d].mark = e->len;
        put1(e, OP_MARK);
    }
    e->lv[d].count++;
}

/* Values in a list are items; values in a dict follow their key. */
static void before_value(sp__emit_t *e) {
    if (e->depth > 0 && e->lv[e->depth - 1].kind == 'l')
        before_item(e);
}

static void open_container(sp__emit_t *e, char kind) {
    before_value(e);
    if (e->depth == e->depth_cap && !depth_grow(e))
        return;
    int d = e->depth++;
    e->lv[d].kind = kind;
    e->lv[d].count = 0;
    if (e->json) {
        e->lv[d].vstart = e->len;
        put1(e, kind == 'd' ? '{' : '[');
    } else {
        put1(e, kind == 'd' ? OP_EMPTY_DICT : OP_EMPTY_LIST);
        e->lv[d].mark = e->len;
        put1(e, OP_MARK);
    }
}

static void close_container(sp__emit_t *e, char kind) {
    if (e->failed)
        return;
    if (e->depth == 0 || e->lv[e->depth - 1].kind != kind) {
        e->failed = true;
        return;
    }
    int d = --e->depth;
    if (e->json) {
        put1(e, kind == 'd' ? '}' : ']');
        e->last_start = e->lv[d].vstart;
        e->last_len = e->lv[d].vstart == SIZE_MAX ? 0 : e->len - e->lv[d].vstart;
    } else if (e->len == e->lv[d].mark + 1) {
        e->len--; /* nothing since the MARK: drop it rather than write an empty SETITEMS */
    } else {
        put1(e, kind == 'd' ? OP_SETITEMS : OP_APPENDS);
    }
}

void sp__emit_dict_begin(sp__emit_t *e) {
    open_container(e, 'd');
}
void sp__emit_dict_end(sp__emit_t *e) {
    close_container(e, 'd');
}
void sp__emit_list_begin(sp__emit_t *e) {
    open_container(e, 'l');
}
void sp__emit_list_end(sp__emit_t *e) {
    close_container(e, 'l');
}

/* sp__utf8_len (core.h). The two forms a Python str needs beyond UTF-8 (see core_emit.h: 0xC0
 * 0x80 for U+0000, a surrogate's 3-byte form) are invalid here: the callers look for them first. */
size_t sp__utf8_len(const unsigned char *s) {
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t n = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (n == 0 || (n == 2 && c < 0xc2) || (n == 4 && c > 0xf4))
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if (n == 3 && ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0)))
        return 0; /* overlong or a surrogate */
    if (n == 4 && ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90)))
        return 0;
    return n;
}

/* Whether s starts the 2-byte form of U+0000 (modified UTF-8's, the one a C string can hold). */
static inline bool is_nul2(const unsigned char *s) {
    return s[0] == 0xc0 && s[1] == 0x80;
}

/* The surrogate whose 3-byte form ('surrogatepass') s starts with, or 0. */
static inline unsigned surrogate_at(const unsigned char *s) {
    if (s[0] != 0xed || s[1] < 0xa0 || s[1] > 0xbf || (s[2] & 0xc0) != 0x80)
        return 0;
    return 0xd000u | (s[1] & 0x3fu) << 6 | (s[2] & 0x3fu);
}

/* How many of the n bytes at p are ASCII: sixteen a step with SSE2 (every x86-64), else eight
 * (bit 7 of each byte of a word). Every str of a snapshot (and of a JSON trace turned into a
 * pickle) goes through here; a byte a step was 2-3 instructions a byte. */
static size_t ascii_run(const unsigned char *p, size_t n) {
    size_t run = 0;
#if defined(__SSE2__)
    for (; n - run >= 16; run += 16) {
        unsigned high =
            (unsigned)_mm_movemask_epi8(_mm_loadu_si128((const __m128i *)(const void *)(p + run)));
        if (high != 0)
            return run + (size_t)__builtin_ctz(high);
    }
#else
    for (; n - run >= 8; run += 8) {
        uint64_t w;
        memcpy(&w, p + run, sizeof(w));
        if ((w & 0x8080808080808080ull) != 0)
            break;
    }
#endif
    while (run < n && p[run] < 0x80)
        run++;
    return run;
}

static void put_str_pickle(sp__emit_t *e, const char *s) {
    size_t n = strlen(s);
    size_t at = e->len + 1; /* where the length goes */
    if (n <= 255) {
        put1(e, OP_SHORT_BINUNICODE);
        put1(e, (unsigned)n);
    } else {
        uint32_t n32 = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
        n = n32;
        unsigned char le[4] = {n32 & 0xff, (n32 >> 8) & 0xff, (n32 >> 16) & 0xff, n32 >> 24};
        put1(e, OP_BINUNICODE);
        put(e, le, 4);
    }
    /* Copy, replacing each invalid byte with '?' so the length stays the same; runs of ASCII
     * (nearly every string: names, file names) in one piece. A lone surrogate is written in
     * its 3-byte form, as CPython's pickler writes it ('surrogatepass'); 0xC0 0x80 as the one
     * byte of U+0000, and the length written above is then made one less for each. */
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, m = n; /* bytes read, bytes the str has */
    while (i < n) {
        size_t run = ascii_run(p + i, n - i);
        if (run > 0) {
            put(e, p + i, run);
            i += run;
            continue;
        }
        size_t k = sp__utf8_len(p + i);
        if (k == 0 && i + 1 < n && is_nul2(p + i)) {
            put1(e, 0);
            i += 2;
            m--;
            continue;
        }
        if (k == 0 && surrogate_at(p + i) != 0)
            k = 3;
        if (k == 0 || i + k > n) {
            put1(e, '?');
            i++;
        } else {
            put(e, p + i, k);
            i += k;
        }
    }
    if (m != n && !e->failed) { /* no flush happens inside a value: the length is in buf */
        unsigned char *len = (unsigned char *)e->buf + at;
        if (e->buf[at - 1] == (char)OP_SHORT_BINUNICODE)
            len[0] = (unsigned char)m;
        else
            for (size_t q = 0; q < 4; q++)
                len[q] = (unsigned char)(m >> (8 * q));
    }
}

static void put_str_json(sp__emit_t *e, const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    put1(e, '"');
    while (*p) {
        const unsigned char *q = p;
        while (*q >= 0x20 && *q < 0x80 && *q != '"' && *q != '\\')
            q++;
        if (q > p) {
            put(e, p, (size_t)(q - p));
            p = q;
            continue;
        }
        unsigned c = *p;
        size_t k = sp__utf8_len(p);
        unsigned sur = k == 0 ? surrogate_at(p) : 0;
        if (c == '"' || c == '\\') {
            put1(e, '\\');
            put1(e, c);
        } else if (c < 0x20 || sur != 0 || (k == 0 && is_nul2(p))) {
            /* U+0000 and a lone surrogate as json.dumps escapes them (lowercase hex): no
             * other spelling of them is JSON. */
            char esc[8];
            snprintf(esc, sizeof(esc), "\\u%04x", c < 0x20 ? c : sur);
            puts_(e, esc);
            p += sur != 0 ? 3 : c < 0x20 ? 1 : 2;
            continue;
        } else if (k == 0) {
            put1(e, '?');
            k = 1;
        } else {
            put(e, p, k);
            p += k;
            continue;
        }
        p++;
    }
    put1(e, '"');
}

static void put_memo_get(sp__emit_t *e, uint32_t index);

/* Pickle: a string by address: BINGET once it has been written, else written and memoized.
 * An open-addressing table of SP__EMIT_STATIC slots, filled to three quarters at most (then a
 * string not in it is written again each time): which strings are referred back to depends only
 * on the order they come in, not on where the linker put them, as it did with a direct-mapped
 * table whose clashes wrote a colliding key in full on every entry. */
static void put_str_static(sp__emit_t *e, const char *s) {
    size_t h = static_find(e, s);
    if (h != SIZE_MAX && e->skey[h] == s) {
        put_memo_get(e, e->sidx[h]);
        return;
    }
    put_str_pickle(e, s);
    if (e->failed)
        return;
    put1(e, OP_MEMOIZE);
    uint32_t idx = e->memo_next++;
    if (h != SIZE_MAX && e->nstatic < SP__EMIT_STATIC / 4 * 3) {
        e->skey[h] = s;
        e->sidx[h] = idx;
        e->nstatic++;
    }
}

static void key(sp__emit_t *e, const char *k, bool fixed) {
    if (e->depth == 0 || e->lv[e->depth - 1].kind != 'd') {
        e->failed = true;
        return;
    }
    before_item(e);
    if (e->json) {
        put_str_json(e, k);
        put1(e, ':');
    } else if (fixed) {
        put_str_static(e, k);
    } else {
        put_str_pickle(e, k);
    }
}

void sp__emit_key(sp__emit_t *e, const char *k) {
    key(e, k, false);
}

void sp__emit_key_static(sp__emit_t *e, const char *k) {
    key(e, k, true);
}

/* A pair's key on the fast path: a pickle dict below its batch boundary, a key written before
 * (a reference to it), room for the value. Returns where the value goes, or NULL when the
 * general path must write the pair (it writes the same bytes, one call per piece). */
static inline unsigned char *fast_key(sp__emit_t *e, const char *k) {
    if (e->json || e->failed || e->depth == 0)
        return NULL;
    int d = e->depth - 1;
    if (e->lv[d].kind != 'd' || (e->lv[d].count > 0 && e->lv[d].count % BATCH == 0) ||
        e->cap - e->len < 32)
        return NULL;
    size_t h = static_find(e, k);
    if (h == SIZE_MAX || e->skey[h] != k)
        return NULL;
    e->lv[d].count++;
    return w_memo_get((unsigned char *)e->buf + e->len, e->sidx[h]);
}

/* Decimal digits of v into b (at least 21 bytes), NUL-terminated; the length. Two digits per
 * division (addresses and timestamps have 15-16 of them, in every JSON trace entry). */
static size_t fmt_u64(char *b, uint64_t v) {
    static const char pairs[] =
        "00010203040506070809101112131415161718192021222324252627282930313233"
        "34353637383940414243444546474849505152535455565758596061626364656667"
        "6869707172737475767778798081828384858687888990919293949596979899";
    char t[24];
    size_t i = sizeof(t);
    while (v >= 100) {
        size_t k = (size_t)(v % 100) * 2;
        v /= 100;
        t[--i] = pairs[k + 1];
        t[--i] = pairs[k];
    }
    if (v >= 10) {
        t[--i] = pairs[v * 2 + 1];
        t[--i] = pairs[v * 2];
    } else {
        t[--i] = (char)('0' + v);
    }
    size_t n = sizeof(t) - i;
    memcpy(b, t + i, n);
    b[n] = '\0';
    return n;
}

/* The JSON form of the same: a key of plain ASCII (no escapes: the literals snapshots use) written
 * in one piece with its comma and colon, room for `extra` more bytes. NULL: the general path. */
static inline unsigned char *json_key(sp__emit_t *e, const char *k, size_t extra) {
    if (!e->json || e->failed || e->depth == 0 || e->lv[e->depth - 1].kind != 'd')
        return NULL;
    size_t n = 0;
    for (; k[n] != '\0'; n++) {
        unsigned char c = (unsigned char)k[n];
        if (n == 64 || c < 0x20 || c >= 0x80 || c == '"' || c == '\\')
            return NULL;
    }
    unsigned char *p = room(e, n + 4 + extra);
    if (p == NULL)
        return NULL;
    int d = e->depth - 1;
    if (e->lv[d].count > 0)
        *p++ = ',';
    e->lv[d].count++;
    *p++ = '"';
    memcpy(p, k, n);
    p += n;
    *p++ = '"';
    *p++ = ':';
    return p;
}

void sp__emit_kv_int(sp__emit_t *e, const char *k, int64_t v) {
    unsigned char *p = e->json ? json_key(e, k, 24) : fast_key(e, k);
    if (p != NULL && e->json) {
        if (v < 0)
            *p++ = '-';
        done(e, p + fmt_u64((char *)p, v < 0 ? 0 - (uint64_t)v : (uint64_t)v));
        return;
    }
    if (p != NULL) {
        done(e, w_int(p, v));
        return;
    }
    sp__emit_key_static(e, k);
    sp__emit_int(e, v);
}

void sp__emit_kv_uint(sp__emit_t *e, const char *k, uint64_t v) {
    unsigned char *p = e->json ? json_key(e, k, 24) : fast_key(e, k);
    if (p != NULL && e->json) {
        done(e, p + fmt_u64((char *)p, v));
        return;
    }
    if (p != NULL) {
        done(e, w_uint(p, v));
        return;
    }
    sp__emit_key_static(e, k);
    sp__emit_uint(e, v);
}

void sp__emit_kv_str_static(sp__emit_t *e, const char *k, const char *v) {
    unsigned char *p = e->json ? json_key(e, k, 0) : fast_key(e, k);
    if (p != NULL && e->json) {
        done(e, p);
        put_str_json(e, v);
        return;
    }
    if (p != NULL) {
        size_t h = static_find(e, v);
        if (h != SIZE_MAX && e->skey[h] == v) {
            done(e, w_memo_get(p, e->sidx[h]));
            return;
        }
        done(e, p);
        put_str_static(e, v);
        return;
    }
    sp__emit_key_static(e, k);
    sp__emit_str_static(e, v);
}

/* `fixed`: s is a string that outlives the emitter (a literal), so a pickle may refer back to it
 * by address instead of writing it again. */
static void str(sp__emit_t *e, const char *s, bool fixed) {
    before_value(e);
    if (s == NULL)
        s = "";
    if (e->json)
        put_str_json(e, s);
    else if (fixed)
        put_str_static(e, s);
    else
        put_str_pickle(e, s);
}

void sp__emit_str(sp__emit_t *e, const char *s) {
    str(e, s, false);
}

void sp__emit_str_static(sp__emit_t *e, const char *s) {
    str(e, s, true);
}

static void put_int_pickle(sp__emit_t *e, int64_t v) {
    unsigned char *p = room(e, 10);
    if (p != NULL)
        done(e, w_int(p, v));
}

void sp__emit_int(sp__emit_t *e, int64_t v) {
    before_value(e);
    if (e->json) {
        char b[32];
        size_t n = 0;
        if (v < 0)
            b[n++] = '-';
        n += fmt_u64(b + n, v < 0 ? 0 - (uint64_t)v : (uint64_t)v);
        put(e, b, n);
    } else {
        put_int_pickle(e, v);
    }
}

void sp__emit_uint(sp__emit_t *e, uint64_t v) {
    if (v <= (uint64_t)INT64_MAX) {
        sp__emit_int(e, (int64_t)v);
        return;
    }
    before_value(e);
    if (e->json) {
        char b[32];
        put(e, b, fmt_u64(b, v));
    } else {
        unsigned char *p = room(e, 11);
        if (p != NULL)
            done(e, w_uint(p, v));
    }
}

void sp__emit_int_text(sp__emit_t *e, const char *s, size_t n) {
    before_value(e);
    if (e->json) {
        put(e, s, n);
        return;
    }
    bool neg = n > 0 && s[0] == '-';
    size_t first = neg ? 1 : 0;
    /* The magnitude in 32-bit limbs, least significant first, nine digits at a time. */
    size_t cap = (n - first) / 9 + 2, nl = 0;
    uint32_t *lim = sp__emit_realloc(NULL, cap * sizeof(*lim));
    unsigned char *b = sp__emit_realloc(NULL, cap * 4 + 1);
    if (lim == NULL || b == NULL) {
        free(lim);
        free(b);
        e->failed = e->oom = true;
        return;
    }
    for (size_t i = first; i < n;) {
        uint64_t mul = 1, add = 0;
        for (size_t k = 0; k < 9 && i < n; k++, i++) {
            mul *= 10;
            add = add * 10 + (uint64_t)(s[i] - '0');
        }
        for (size_t k = 0; k < nl; k++) {
            uint64_t v = (uint64_t)lim[k] * mul + add;
            lim[k] = (uint32_t)v;
            add = v >> 32;
        }
        if (add != 0)
            lim[nl++] = (uint32_t)add;
    }
    /* Two's complement, little-endian, one byte more than the magnitude (room for the sign),
     * then as short as it stays the same number: what CPython's pickler writes. */
    size_t nb = nl * 4 + 1;
    for (size_t k = 0; k < nl; k++)
        for (size_t q = 0; q < 4; q++)
            b[4 * k + q] = (unsigned char)(lim[k] >> (8 * q));
    b[nb - 1] = 0;
    if (neg) {
        unsigned carry = 1;
        for (size_t k = 0; k < nb; k++) {
            unsigned v = (unsigned)(unsigned char)~b[k] + carry;
            b[k] = (unsigned char)v;
            carry = v >> 8;
        }
    }
    while (nb > 1 &&
           ((b[nb - 1] == 0 && !(b[nb - 2] & 0x80)) || (b[nb - 1] == 0xff && (b[nb - 2] & 0x80))))
        nb--;
    if (nb < 256) {
        put1(e, OP_LONG1);
        put1(e, (unsigned)nb);
    } else {
        unsigned char le[4] = {nb & 0xff, (nb >> 8) & 0xff, (nb >> 16) & 0xff, (nb >> 24) & 0xff};
        put1(e, OP_LONG4);
        put(e, le, 4);
    }
    put(e, b, nb);
    free(lim);
    free(b);
}

void sp__emit_double(sp__emit_t *e, double v) {
    before_value(e);
    if (e->json) {
        /* As json.dumps writes a float (float.__repr__): the shortest digits that read back
         * as v, and always a float's form ("0.0", not "0", which json.load reads as the int 0:
         * a snapshot's garbage_collection_threshold of 0.0 came back an int). */
        char b[40];
        void *old = sp__c_numeric_begin(); /* a decimal point whatever the program's locale */
        if (!isfinite(v)) {
            snprintf(b, sizeof(b), "null");
        } else {
            int prec = 0; /* digits after the first */
            while (prec < 16) {
                snprintf(b, sizeof(b), "%.*e", prec, v);
                if (strtod(b, NULL) == v)
                    break;
                prec++;
            }
            snprintf(b, sizeof(b), "%.*e", prec, v);
            int exp10 = atoi(strchr(b, 'e') + 1);
            if (exp10 >= -4 && exp10 < 16) { /* repr's fixed-point range */
                snprintf(b, sizeof(b), "%.*f", prec > exp10 ? prec - exp10 : 0, v);
                if (strchr(b, '.') == NULL)
                    strcat(b, ".0");
            }
        }
        sp__c_numeric_end(old);
        puts_(e, b);
        return;
    }
    uint64_t u;
    memcpy(&u, &v, sizeof(u));
    unsigned char be[8];
    for (size_t i = 0; i < 8; i++)
        be[i] = (unsigned char)(u >> (56 - 8 * i));
    put1(e, OP_BINFLOAT);
    put(e, be, 8);
}

void sp__emit_bool(sp__emit_t *e, bool v) {
    before_value(e);
    if (e->json)
        puts_(e, v ? "true" : "false");
    else
        put1(e, v ? OP_NEWTRUE : OP_NEWFALSE);
}

void sp__emit_none(sp__emit_t *e) {
    before_value(e);
    if (e->json)
        puts_(e, "null");
    else
        put1(e, OP_NONE);
}

void sp__emit_tuple2(sp__emit_t *e, int64_t a, int64_t b) {
    if (e->json) {
        sp__emit_list_begin(e);
        sp__emit_int(e, a);
        sp__emit_int(e, b);
        sp__emit_list_end(e);
        return;
    }
    before_value(e);
    put_int_pickle(e, a);
    put_int_pickle(e, b);
    put1(e, OP_TUPLE2);
}

uint32_t sp__emit_memoize(sp__emit_t *e) {
    if (e->failed)
        return UINT32_MAX;
    if (e->json) {
        if (e->last_len == 0 || e->last_start + e->last_len != e->len)
            return UINT32_MAX; /* not right after a container: the caller writes it again */
        if (e->jmemo_n == e->jmemo_cap) {
            uint32_t cap = e->jmemo_cap ? e->jmemo_cap * 2 : 64;
            size_t *nm = sp__emit_realloc(e->jmemo, (size_t)cap * 2 * sizeof(*nm));
            if (nm == NULL)
                return UINT32_MAX;
            e->jmemo = nm;
            e->jmemo_cap = cap;
        }
        /* Copied aside: a flush may hand the buffer's bytes to the file before the next use. */
        size_t n = e->last_len;
        if (e->jcopy_cap - e->jcopy_len < n) {
            size_t cap = e->jcopy_cap ? e->jcopy_cap : 4096;
            while (cap - e->jcopy_len < n)
                cap *= 2;
            char *nc = sp__emit_realloc(e->jcopy, cap);
            if (nc == NULL)
                return UINT32_MAX;
            e->jcopy = nc;
            e->jcopy_cap = cap;
        }
        memcpy(e->jcopy + e->jcopy_len, e->buf + e->last_start, n);
        e->jmemo[2 * e->jmemo_n] = e->jcopy_len;
        e->jmemo[2 * e->jmemo_n + 1] = n;
        e->jcopy_len += n;
        return e->jmemo_n++;
    }
    put1(e, OP_MEMOIZE);
    return e->memo_next++;
}

void sp__emit_memo_get(sp__emit_t *e, uint32_t index) {
    before_value(e);
    if (e->json && index < e->jmemo_n && !e->failed) {
        put(e, e->jcopy + e->jmemo[2 * index], e->jmemo[2 * index + 1]);
        return;
    }
    if (e->json || index >= e->memo_next) {
        e->failed = true; /* a reference to nothing: the caller's bug */
        return;
    }
    put_memo_get(e, index);
}

static void put_memo_get(sp__emit_t *e, uint32_t index) {
    unsigned char *p = room(e, 5);
    if (p != NULL)
        done(e, w_memo_get(p, index));
}

/* ---- atomic file write ------------------------------------------------------------------ */

static void fsync_dir_of(const char *path) {
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == path)
        snprintf(dir, sizeof(dir), "/");
    else
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd); /* durability of the rename; best effort on filesystems without it */
        close(fd);
    }
}

/* A regular file this process may not write (mode 0444, another user's): the rename would
 * replace it all the same, which open(2), and PyTorch's own dump, refuse (EACCES). */
static sp_status_t writable(const char *path) {
    if (faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) != 0 && errno == EACCES)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY,
                         "cannot write %s: %s (it is not writable; it was left as it was)", path,
                         strerror(EACCES));
    return SP_SUCCESS;
}

/* Where the bytes for `path` go: path itself when it does not exist or is a regular file, the
 * file a symbolic link names when that is a regular file (resolved, so the temporary and the
 * rename happen in the real file's directory and the link survives); anything else is refused,
 * and so is a regular file this process may not write.
 * *mode_p: the permission bits of the file that will be replaced, -1 for a new file: read, write
 * and execute only (the set-user-ID, set-group-ID and sticky bits belong to the contents they
 * were set on, not to the snapshot that replaces them: cp and install drop them too). */
static sp_status_t resolve_target(const char *path, char *out, size_t cap, int *mode_p) {
    struct stat st;
    *mode_p = -1;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) {
            /* A new file (or a missing directory, which creating the temporary reports). */
            snprintf(out, cap, "%s", path);
            return SP_SUCCESS;
        }
        /* A name past NAME_MAX or a path past PATH_MAX is the caller's argument, as a pattern
         * that expands past PATH_MAX is (history.h): not a failure of the system. */
        if (errno == ENAMETOOLONG)
            return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_HISTORY,
                             "path too long: %.200s%s (%s; nothing was written)", path,
                             strlen(path) > 200 ? "..." : "", strerror(ENAMETOOLONG));
        return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY, "cannot inspect %s: %s", path,
                         strerror(errno));
    }
    if (S_ISREG(st.st_mode)) {
        SP_CHECK(writable(path));
        snprintf(out, cap, "%s", path);
        *mode_p = (int)(st.st_mode & 0777);
        return SP_SUCCESS;
    }
    if (S_ISLNK(st.st_mode)) {
        char real[PATH_MAX];
        struct stat ts;
        if (realpath(path, real) == NULL || stat(real, &ts) != 0)
            return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_HISTORY,
                             "%s is a symbolic link to nothing that exists (%s); files are "
                             "written through a link only to an existing regular file",
                             path, strerror(errno));
        if (!S_ISREG(ts.st_mode))
            return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_HISTORY,
                             "%s links to %s, which is not a regular file; refusing to replace "
                             "it",
                             path, real);
        if (strlen(real) + 1 > cap)
            return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_HISTORY, "path too long: %s", real);
        SP_CHECK(writable(real));
        snprintf(out, cap, "%s", real);
        *mode_p = (int)(ts.st_mode & 0777);
        return SP_SUCCESS;
    }
    const char *kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                                              : "not a regular file";
    return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_HISTORY,
                     "%s is %s, not a regular file; refusing to replace it", path, kind);
}

/* The observer of the temporaries (sp_x_temp_set_fn): a program that removes them when it is
 * killed. The library calls it and nothing else: it installs no signal handler. */
static void (*_Atomic g_temp_fn)(int event, const char *path, void *arg);
static void *_Atomic g_temp_arg;

void sp__file_temp_set_fn(void (*fn)(int event, const char *path, void *arg), void *arg) {
    atomic_store(&g_temp_arg, arg);
    atomic_store(&g_temp_fn, fn);
}

static void temp_event(int event, const char *path) {
    void (*fn)(int, const char *, void *) = atomic_load(&g_temp_fn);
    if (fn != NULL)
        fn(event, path, atomic_load(&g_temp_arg));
}

/* Remove f's temporary: renamed over the target (commit) or unlinked. The observer hears of it
 * before and after, so that a signal in between finds the name either still its to remove or
 * already gone, never a renamed file's name it would unlink. errno: rename's on failure. */
static int temp_end(sp__atomic_file_t *f, bool commit) {
    temp_event(SP_X_TEMP_REMOVE_BEGIN, f->tmp);
    int rc = commit ? rename(f->tmp, f->path) : unlink(f->tmp);
    int err = errno;
    if (commit && rc != 0)
        unlink(f->tmp);
    temp_event(SP_X_TEMP_REMOVE_END, f->tmp);
    errno = err;
    return rc;
}

/* Create the temporary `tmpl` (ending in XXXXXX, replaced) like mkstemp, but with mode 0666 so
 * that the umask applies as it does to any file a program creates (mkstemp's 0600 would make
 * every snapshot private, and opening it up afterwards would ignore a umask such as 077). */
static int make_temp(char *tmpl) {
    static const char digits[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static atomic_uint_fast64_t counter;
    size_t len = strlen(tmpl);
    if (len < 6 || strcmp(tmpl + len - 6, "XXXXXX") != 0) {
        errno = EINVAL;
        return -1;
    }
    for (int attempt = 0; attempt < 100; attempt++) {
        uint64_t x = sp__now_ns() ^ ((uint64_t)getpid() << 32) ^
                     (atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ull);
        for (size_t i = len - 6; i < len; i++, x /= sizeof digits - 1)
            tmpl[i] = digits[x % (sizeof digits - 1)];
        int fd = open(tmpl, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    errno = EEXIST;
    return -1;
}

sp_status_t sp__file_atomic_open(sp__atomic_file_t *f, const char *target) {
    f->fd = -1;
    SP_ARG_CHECK(target != NULL && target[0] != '\0', SP_SUB_HISTORY, "path is NULL or empty");
    SP_CHECK(resolve_target(target, f->path, sizeof(f->path), &f->mode));
    const char *path = f->path;
    /* The log's file replaced by a rename, the log would go on writing to the old (unlinked)
     * one; not yet open, its next line would be appended to what was written here. */
    char pattern[600];
    if (sp__log_is_file(path, pattern, sizeof pattern))
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_HISTORY,
                         "%s is the library's log file (SYMPOOL_DEBUG_FILE=%s): its later lines "
                         "would be lost or land in what is written there; write elsewhere or "
                         "log elsewhere (nothing was written)",
                         path, pattern);
    /* The temporary's name is the target's plus a suffix; a target name near NAME_MAX would make
     * it too long for the directory, so only as much of the name as fits is kept. */
    const char *slash = strrchr(path, '/');
    size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0, baselen = strlen(path + dirlen);
    const size_t room = NAME_MAX - (sizeof(".tmp.XXXXXX") - 1);
    if (baselen > room)
        baselen = room;
    int n = snprintf(f->tmp, sizeof(f->tmp), "%.*s%.*s.tmp.XXXXXX", (int)dirlen, path, (int)baselen,
                     path + dirlen);
    SP_ARG_CHECK(n > 0 && (size_t)n < sizeof(f->tmp), SP_SUB_HISTORY, "path too long: %s", path);
    /* A write past RLIMIT_FSIZE (ulimit -f, a batch job's limit) raises SIGXFSZ, which kills the
     * process by default: the temporary would be left behind, half written. The limit is read
     * here so that sp__file_atomic_write fails before such a write (see there). */
    struct rlimit rl;
    f->written = 0;
    f->fsize_max = getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                       ? (uint64_t)rl.rlim_cur
                       : UINT64_MAX;
    temp_event(SP_X_TEMP_CREATE_BEGIN, NULL);
    f->fd = make_temp(f->tmp);
    int err = errno;
    temp_event(SP_X_TEMP_CREATE_END, f->fd >= 0 ? f->tmp : NULL);
    errno = err;
    if (f->fd < 0)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY,
                         "cannot create a temporary file next to %s: %s", path, strerror(errno));
    return SP_SUCCESS;
}

void sp__file_atomic_abort(sp__atomic_file_t *f) {
    if (f->fd < 0)
        return;
    close(f->fd);
    (void)temp_end(f, false);
    f->fd = -1;
}

sp_status_t sp__file_atomic_write(sp__atomic_file_t *f, const void *buf, size_t len) {
    const char *p = buf;
    size_t left = len;
    if (len > f->fsize_max - f->written) {
        /* The file would grow past the process's file size limit: the write would raise SIGXFSZ
         * (death, by default) or fail with EFBIG. Refused without writing: the temporary is
         * removed and the target left as it was, as for a full disk. */
        sp__file_atomic_abort(f);
        return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY,
                         "cannot write %s: %s (the file size limit, ulimit -f, is %llu bytes)",
                         f->tmp, strerror(EFBIG), (unsigned long long)f->fsize_max);
    }
    f->written += len;
    while (left > 0) {
        ssize_t w = write(f->fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int err = errno;
            sp__file_atomic_abort(f);
            return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY, "cannot write %s: %s", f->tmp,
                             strerror(err));
        }
        p += w;
        left -= (size_t)w;
    }
    return SP_SUCCESS;
}

sp_status_t sp__file_atomic_commit(sp__atomic_file_t *f) {
    /* A replaced file keeps its permissions (a new one has the umask's, from make_temp). */
    if (f->mode >= 0)
        (void)fchmod(f->fd, (mode_t)f->mode);
    int rs = fsync(f->fd);
    int err = errno;
    if (close(f->fd) != 0 && rs == 0) {
        rs = -1;
        err = errno;
    }
    f->fd = -1;
    if (rs != 0) {
        (void)temp_end(f, false);
        return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY, "cannot flush %s: %s", f->tmp,
                         strerror(err));
    }
    if (temp_end(f, true) != 0) {
        err = errno;
        return sp__error(SP_ERR_SYSTEM, SP_SUB_HISTORY, "cannot rename %s to %s: %s", f->tmp,
                         f->path, strerror(err));
    }
    fsync_dir_of(f->path);
    return SP_SUCCESS;
}

sp_status_t sp__file_write_atomic(const char *target, const void *buf, size_t len) {
    sp__atomic_file_t f;
    SP_CHECK(sp__file_atomic_open(&f, target));
    SP_CHECK(sp__file_atomic_write(&f, buf, len));
    return sp__file_atomic_commit(&f);
}
