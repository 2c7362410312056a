/*
 * pickle_read.h: a restricted pickle reader for PyTorch memory snapshots, of every protocol a
 * pickler writes (0-5; pickles of protocols 0 and 1 have no PROTO and start with any opcode).
 *
 * Only data opcodes are accepted: dicts, lists, tuples, sets and frozensets (protocol 4's opcodes;
 * older protocols pickle a set with REDUCE, refused), ints, floats, str, bytes, bools, None, the
 * memo and FRAME, in their binary forms and in protocol 0's text forms (INT, LONG, FLOAT, STRING,
 * UNICODE, PUT, GET, decoded by pickle_text.c: a value reads the same in every protocol).
 * Integers keep their signedness: [-2^63, 2^63) is PK_INT, [2^63, 2^64) is PK_UINT (real
 * snapshots carry C++ line numbers of 2^64-1), and any wider integer is PK_BIGINT, which has no
 * value: the document still loads, and only a consumer that needs that number refuses it
 * (pk_int/pk_uint/pk_num return false). Anything that could name or run code (GLOBAL,
 * STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, EXT*, PERSID, buffers) is rejected with "opcode
 * GLOBAL at offset N not allowed" (protocols 0-2 pickle bytes with GLOBAL and REDUCE: refused;
 * no snapshot holds bytes). Every malformed, truncated or oversized input gives a one-line
 * error naming the byte offset; nothing aborts. Sizes and memo are bounded; nesting is not (as in
 * pickle.load: open MARKs live on the heap, each a byte of input).
 *
 * What Python's pickle.load (the C unpickler) refuses in the data opcodes is refused too: a str
 * (BINUNICODE*) that is not UTF-8 (lone surrogates allowed: it decodes with 'surrogatepass'), a
 * SHORT_BINSTRING/BINSTRING that is not ASCII (pickle.load's default encoding; it is a str, as
 * there), a dict key it cannot hash (a list, a dict, a bytearray, a tuple holding one). A FRAME
 * is what pickle.load makes of it: a length that must be there, not a boundary (see run()); so
 * is STOP: the document is the value on top of the stack above the innermost MARK.
 *
 * The result is a graph of pk_value_t in one arena (the memo lets a value appear many times, so
 * consumers must not assume a tree; nothing here walks it recursively). Not thread-safe per
 * document; documents are independent.
 */
#ifndef SP_TOOLS_PICKLE_READ_H
#define SP_TOOLS_PICKLE_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    PK_NONE,
    PK_BOOL,
    PK_INT,    /* fits int64_t: u.i */
    PK_UINT,   /* in [2^63, 2^64): u.u */
    PK_BIGINT, /* outside [-2^63, 2^64): u.bits holds its width in bytes, no value */
    PK_FLOAT,
    PK_STR,
    PK_BYTES,
    PK_LIST,
    PK_TUPLE,
    PK_DICT,
    PK_RECORD, /* a dict that pk_parse_records' hook took: u.u is the id the hook gave it */
    PK_SET     /* a set (unhashable) or frozenset: u.seq holds its items as written */
} pk_type_t;

typedef struct pk_value pk_value_t;
/* One unpickled value. Immutable once pk_parse returns; owned by its document. */
struct pk_value {
    pk_type_t type;  /* which member of u is valid */
    bool unhashable; /* a bytearray (PK_BYTES), a set (PK_SET), or a tuple holding a list, a dict or
                      * one of these: what Python's hash() refuses, so never a dict key */
    union {
        bool b;        /* PK_BOOL */
        int64_t i;     /* PK_INT */
        uint64_t u;    /* PK_UINT (always >= 2^63) */
        uint64_t bits; /* PK_BIGINT: bytes of its LONG1/LONG4 encoding */
        double f;      /* PK_FLOAT */
        struct {
            const char *s; /* NUL-terminated copy in the arena (may contain NULs for bytes) */
            size_t len;    /* bytes */
        } str;             /* PK_STR (UTF-8 as written) and PK_BYTES */
        struct {
            pk_value_t **items; /* lists, tuples, sets: items; dicts: key0, val0, key1, val1, ... */
            size_t n;           /* entries in items */
            size_t cap;         /* allocated entries */
        } seq;                  /* PK_LIST, PK_TUPLE, PK_DICT, PK_SET */
    } u;                        /* the value */
};

typedef struct pk_limits {
    size_t max_depth;  /* open MARKs at once (default: no limit, as pickle.load has none) */
    size_t max_memo;   /* memo entries (at most the document's bytes or 2^24, whichever is
                        * more; default: that bound alone) */
    size_t max_values; /* values created (default: no limit; see pk_limits_default) */
    size_t max_str;    /* bytes of one string (default 1 << 28) */
} pk_limits_t;

typedef struct pk_doc pk_doc_t;

void pk_limits_default(pk_limits_t *lim);

/* The name of pickle opcode op (as pickletools names it), NULL for a byte that is none. */
const char *pk_opcode_name(unsigned char op);

/* Parse buf[0..len). On success *doc_p owns the values and pk_root() is the top object; on failure
 * returns false and writes "pickle: <what> at offset N" into err. lim may be NULL (defaults). */
bool pk_parse(const void *buf, size_t len, const pk_limits_t *lim, pk_doc_t **doc_p, char *err,
              size_t errlen);
/* pk_parse, except that every value stored under the dict key skip_key (a list, e.g. "frames")
 * is not built: its dict holds no such key (a dict's SETITEM, one pair at a time, or a value
 * outside a dict reads as PK_NONE, as does everything inside it). Loading what a replay needs
 * then costs a fraction of the whole document. What pk_parse refuses as malformed inside a
 * skipped value is refused too (its limits on values made aside); what skipping cannot read as
 * pk_parse does is refused with PK_ERR_WHOLE.
 * skip_key NULL: pk_parse. */
bool pk_parse_skip(const void *buf, size_t len, const pk_limits_t *lim, const char *skip_key,
                   pk_doc_t **doc_p, char *err, size_t errlen);
/* The hook of pk_parse_records: a dict's pairs (key0, val0, key1, val1, ...; n entries) as its
 * SETITEMS completes it (one of fewer than 1000 pairs into a new dict: a full batch of a
 * pickler may be followed by more, and such a dict stays a dict). Returns 1 when it takes the dict
 * (it becomes a PK_RECORD with *id_p as u.u, and its pairs are not kept), 0 to leave it a dict, -1
 * when it fails (out of memory: the parse fails). The values it sees live only during the call: it
 * copies what it needs (strings and containers stay valid with the document). */
typedef int (*pk_record_fn)(void *arg, pk_value_t *const *pairs, size_t n, uint64_t *id_p);
/* pk_parse_skip, with a hook offered every dict as it is completed in one SETITEMS: the dicts it
 * takes (a trace's entries, by the thousand) then cost neither their pairs nor their integers. */
bool pk_parse_records(const void *buf, size_t len, const pk_limits_t *lim, const char *skip_key,
                      pk_record_fn fn, void *arg, pk_doc_t **doc_p, char *err, size_t errlen);
/* How pk_parse_skip and pk_parse_records start their message when they refuse a document only
 * because it cannot be read with its skipped values left out or its dicts handed over: a value
 * made inside a skipped one referenced outside it, a skipped value that turns out to end before
 * the values skipped after it, items added to a dict the hook took. Such a document means what it
 * says to pk_parse: read it whole (pk_parse_skip with no key, no hook), as a reader of the whole
 * document would, and the two agree. pk_parse never writes it. */
#define PK_ERR_WHOLE "pickle: to be read whole: "
static inline bool pk_err_whole(const char *err) {
    for (const char *w = PK_ERR_WHOLE; *w != '\0'; w++, err++)
        if (*err != *w)
            return false;
    return true;
}
/* The protocol of a pickle (pickletools.dis's "highest protocol among opcodes" where it has no
 * PROTO): PROTO's argument, else 1 if an opcode of protocol 1 or later comes before STOP, else
 * 0. For a document pk_parse read. */
int pk_protocol(const void *buf, size_t len);
/* Where the pickle at the start of buf[0..len) ends (just past its STOP), found by walking its
 * opcodes; 0 when there is no STOP to find there (a refused opcode, an argument past len). */
size_t pk_pickle_end(const void *buf, size_t len);
/* Read a whole file of at most max_bytes into a new buffer (caller frees). Reading stops early
 * (what was read is returned) once the first byte is no pickle opcode and the first that is not
 * white space is no JSON document's '{' or '[': the caller refuses it from those bytes, and a
 * stream (/dev/zero, a pipe) is not read to max_bytes first. */
bool pk_read_file(const char *path, size_t max_bytes, unsigned char **buf_p, size_t *len_p,
                  char *err, size_t errlen);
/* Read a whole file (at most max_bytes) and parse it. */
bool pk_parse_file(const char *path, size_t max_bytes, const pk_limits_t *lim, pk_doc_t **doc_p,
                   char *err, size_t errlen);
const pk_value_t *pk_root(const pk_doc_t *doc);
void pk_free(pk_doc_t *doc);

/* Accessors; all accept NULL and return NULL / false on a type mismatch. */
const pk_value_t *pk_get(const pk_value_t *dict, const char *key); /* last value for a str key */
bool pk_num(const pk_value_t *v, double *out); /* int (not BIGINT), bool or float */

/* The accessors below are inline: loading a trace reads five scalars per entry, and its analysis
 * walks every segment's blocks and every device's entries by index (a call each cost more than
 * the access). */
static inline size_t pk_len(const pk_value_t *seq) { /* list/tuple/dict entries */
    if (seq == NULL || (seq->type != PK_LIST && seq->type != PK_TUPLE && seq->type != PK_DICT))
        return 0;
    return seq->type == PK_DICT ? seq->u.seq.n / 2 : seq->u.seq.n;
}

static inline const pk_value_t *pk_at(const pk_value_t *seq, size_t i) { /* list or tuple item */
    if (seq == NULL || (seq->type != PK_LIST && seq->type != PK_TUPLE) || i >= seq->u.seq.n)
        return NULL;
    return seq->u.seq.items[i];
}

static inline bool pk_int(const pk_value_t *v, int64_t *out) { /* int or bool that fits int64_t */
    if (v == NULL)
        return false;
    if (v->type == PK_INT)
        *out = v->u.i;
    else if (v->type == PK_BOOL)
        *out = v->u.b;
    else
        return false; /* PK_UINT and PK_BIGINT do not fit */
    return true;
}

static inline bool pk_uint(const pk_value_t *v, uint64_t *out) { /* int or bool in [0, 2^64) */
    int64_t i;
    if (v != NULL && v->type == PK_UINT) {
        *out = v->u.u;
        return true;
    }
    if (!pk_int(v, &i) || i < 0)
        return false;
    *out = (uint64_t)i;
    return true;
}

static inline const char *pk_str(const pk_value_t *v) { /* str value or NULL */
    return v != NULL && v->type == PK_STR ? v->u.str.s : NULL;
}

/* Whether v is the str lit, all of it: a str holding a U+0000 (a 0 byte) is not the str before
 * it, as strcmp would have it. */
static inline bool pk_str_is(const pk_value_t *v, const char *lit) {
    size_t n = strlen(lit);
    return v != NULL && v->type == PK_STR && v->u.str.len == n && memcmp(v->u.str.s, lit, n) == 0;
}

bool pk_get_int(const pk_value_t *dict, const char *key, int64_t *out);
bool pk_get_uint(const pk_value_t *dict, const char *key, uint64_t *out);
const char *pk_get_str(const pk_value_t *dict, const char *key);

#ifdef __cplusplus
}
#endif

#endif /* SP_TOOLS_PICKLE_READ_H */
