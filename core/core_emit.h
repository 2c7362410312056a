/*
 * core_emit.h: a small structured emitter that writes the same tree either as a pickle
 * (protocol 4, using only the opcodes PyTorch's MemoryViz.js unpickler accepts) or as JSON, and
 * an atomic file writer. snapshot.c builds snapshots with it; tools/ and tests use it to write
 * synthetic traces. Not thread-safe: one emitter per writer.
 *
 * Opcodes used (pickle): PROTO 4, EMPTY_DICT, EMPTY_LIST, MARK, SETITEMS, APPENDS, TUPLE2,
 * BININT1, BININT2, BININT, LONG1, BINFLOAT, SHORT_BINUNICODE, BINUNICODE, NONE, NEWTRUE,
 * NEWFALSE, STOP, and for shared values MEMOIZE with BINGET/LONG_BINGET. No FRAME. LONG4 only
 * for an integer past 255 bytes, which no snapshot holds (sp__emit_int_text: read from JSON).
 */
#ifndef SP_CORE_EMIT_H
#define SP_CORE_EMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <limits.h>
#include <stdint.h>

#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Open containers the emitter holds in itself; more go to the heap. */
#define SP__EMIT_MAX_DEPTH 32
#define SP__EMIT_STATIC 256 /* slots of the table of fixed strings (a power of two) */

/* A file being written atomically (sp__file_atomic_open ... commit): the bytes go to a temporary
 * next to the target, renamed over it at the commit. */
typedef struct sp__atomic_file {
    int fd;              /* the temporary's descriptor, -1 when none is open */
    char path[PATH_MAX]; /* the target (a link resolved) */
    char tmp[PATH_MAX];  /* the temporary */
    int mode;            /* permission bits of the file replaced at the commit; -1: a new file */
    uint64_t written;    /* bytes written to the temporary so far */
    uint64_t fsize_max;  /* the process's file size limit (RLIMIT_FSIZE), UINT64_MAX if none */
} sp__atomic_file_t;

/* An open container of the emitter. */
typedef struct sp__emit_level {
    size_t mark;   /* pickle: offset of its MARK */
    size_t count;  /* items (dict: keys + values) written in it */
    size_t vstart; /* JSON: offset where it began in buf (SIZE_MAX: before a flush, its bytes are
                    * gone) */
    char kind;     /* 'd' dict, 'l' list */
} sp__emit_level_t;

typedef struct sp__emit {
    char *buf;                   /* output bytes */
    size_t len;                  /* bytes written */
    size_t cap;                  /* bytes allocated */
    bool json;                   /* JSON instead of pickle */
    bool failed;                 /* out of memory or misuse; every later call is a no-op */
    bool oom;                    /* the failure was out of host memory (not misuse) */
    int depth;                   /* open containers */
    int depth_cap;               /* open containers lv holds */
    sp__emit_level_t *lv;        /* the open containers, outermost first */
    uint32_t memo_next;          /* pickle: the index the next MEMOIZE gives */
    size_t last_start, last_len; /* JSON: the last container closed (its bytes) */
    size_t *jmemo;               /* JSON: memoized values as (start, len) pairs in jcopy */
    uint32_t jmemo_n, jmemo_cap; /* pairs held / allocated */
    char *jcopy;                 /* JSON: the memoized values' bytes, each copied once */
    size_t jcopy_len, jcopy_cap;
    const char *skey[SP__EMIT_STATIC]; /* pickle: strings memoized by address (keys, names) */
    uint32_t sidx[SP__EMIT_STATIC];    /* their memo indexes */
    uint32_t nstatic;                  /* skey entries in use */
    sp__atomic_file_t *sink;           /* where finished bytes go (NULL: kept in buf) */
    size_t flushed;                    /* bytes written to sink so far */
    bool sink_failed;                  /* writing to sink failed (its error is set already) */
    /* lv points here until a document nests deeper (a JSON document read by json_read.c:
     * what json.load reads may nest thousands deep); then to the heap. The emitter is never
     * copied (it points into itself). */
    sp__emit_level_t lv0[SP__EMIT_MAX_DEPTH];
} sp__emit_t;

/* Start a document (pickle: PROTO 4). */
void sp__emit_init(sp__emit_t *e, bool json);
/* Finish it (pickle: STOP) and hand back the bytes (caller frees *buf_p). SP_ERR_SYSTEM when out
 * of host memory at any point (whatever was left open then), SP_ERR_INTERNAL when the caller's
 * containers are unbalanced. Frees the buffer on failure. With a sink (sp__emit_to_file) the
 * rest of the bytes go to the file instead: *buf_p is NULL and *len_p the document's size;
 * a failed write is SP_ERR_SYSTEM with its cause. The file is neither committed nor aborted. */
sp_status_t sp__emit_finish(sp__emit_t *e, char **buf_p, size_t *len_p);
/* From now on sp__emit_flush_point may hand the bytes written so far to f, so that a large
 * document never sits whole in memory (a fresh buffer of megabytes costs more in page faults than
 * writing it does) and what is written is still in the cache. A JSON memo keeps its own copy of
 * each memoized value, so JSON can be flushed too. */
void sp__emit_to_file(sp__emit_t *e, sp__atomic_file_t *f);
/* A point between two values of the caller's: with a sink and enough bytes gathered, they are
 * written out. Pickle: only where every open container already holds an item (an empty one's
 * MARK is taken back at its end, which a written MARK cannot be). */
void sp__emit_flush_point(sp__emit_t *e);
void sp__emit_discard(sp__emit_t *e);

void sp__emit_dict_begin(sp__emit_t *e);
void sp__emit_dict_end(sp__emit_t *e);
void sp__emit_list_begin(sp__emit_t *e);
void sp__emit_list_end(sp__emit_t *e);
/* A dict key; the value follows with one of the value calls. */
void sp__emit_key(sp__emit_t *e, const char *key);

void sp__emit_int(sp__emit_t *e, int64_t v);
void sp__emit_uint(sp__emit_t *e, uint64_t v);
/* An integer of any width from its decimal text ('-'? digits, n bytes, no leading zeros): pickle
 * LONG1 (LONG4 past 255 bytes) as CPython's pickler writes it, JSON the text. */
void sp__emit_int_text(sp__emit_t *e, const char *s, size_t n);
void sp__emit_double(sp__emit_t *e, double v); /* JSON: NaN and infinities become null */
/* A str (keys likewise): UTF-8, plus the two forms any Python str needs in a C string: 0xC0 0x80
 * is U+0000 (modified UTF-8) and a surrogate's 3-byte form is that lone surrogate (what Python's
 * 'surrogatepass' writes). A pickle holds them as CPython's pickler writes them (a 0 byte, the 3
 * bytes), JSON as json.dumps escapes them (\u0000, \udXXX). Other invalid bytes become '?'. */
void sp__emit_str(sp__emit_t *e, const char *s);
void sp__emit_bool(sp__emit_t *e, bool v);
void sp__emit_none(sp__emit_t *e);
/* A 2-tuple of ints (pickle TUPLE2; a 2-item list in JSON). */
void sp__emit_tuple2(sp__emit_t *e, int64_t a, int64_t b);

/* A string whose bytes stay the same at this address for the whole document (a literal, a name
 * in a table): pickle writes it once and then refers to it (as Python's pickler does for every
 * string); JSON writes it in full. sp__emit_key_static: the same for a dict key. */
void sp__emit_str_static(sp__emit_t *e, const char *s);
void sp__emit_key_static(sp__emit_t *e, const char *key);
/* A dict pair in one call: sp__emit_key_static(key) and then the value call, the same bytes.
 * Once the key has been written, a pickle pair costs one check of the buffer (a snapshot
 * writes a handful of them per trace entry, by the hundred thousand). */
void sp__emit_kv_int(sp__emit_t *e, const char *key, int64_t v);
void sp__emit_kv_uint(sp__emit_t *e, const char *key, uint64_t v);
void sp__emit_kv_str_static(sp__emit_t *e, const char *key, const char *v);

/* Memo, so that a value written many times (a stack shared by thousands of trace entries) is
 * built once: after a value is complete, sp__emit_memoize returns its memo index and
 * sp__emit_memo_get writes it again. Pickle: MEMOIZE and BINGET/LONG_BINGET (a reference). JSON:
 * the memoized value must be a container (list or dict) just closed and not flushed since it was
 * opened; its bytes are copied aside once, and memo_get copies them (JSON has no references,
 * but copying is far cheaper than building it again). */
uint32_t sp__emit_memoize(sp__emit_t *e);
void sp__emit_memo_get(sp__emit_t *e, uint32_t index);

/* Write len bytes to path atomically: a temporary file in the same directory, fsync, rename over
 * path, fsync of the directory. On failure the temporary is removed and path is unchanged.
 * Targets: a new name or an existing regular file is (re)placed; a symbolic link to a regular
 * file is written through (the file it names is replaced, in its own directory, and the link
 * stays); anything else that exists (FIFO, directory, socket, device node such as /dev/null, a
 * link to one of those, a dangling link) is refused, because the rename would replace it with a
 * regular file. The check and the rename are not one atomic step: a target swapped for a
 * non-regular file in between is still replaced.
 * SP_ERR_INVALID_ARGUMENT (NULL/empty path, a target that is not a regular file), SP_ERR_SYSTEM
 * (with the errno text). */
sp_status_t sp__file_write_atomic(const char *path, const void *buf, size_t len);
/* The same in steps, for a writer that produces its bytes as it goes: open checks the target
 * (as above) and creates the temporary; write appends (on failure the file is aborted: the
 * temporary removed); commit flushes, renames and closes; abort removes the temporary. Every
 * failure leaves the target unchanged. */
sp_status_t sp__file_atomic_open(sp__atomic_file_t *f, const char *path);
sp_status_t sp__file_atomic_write(sp__atomic_file_t *f, const void *buf, size_t len);
sp_status_t sp__file_atomic_commit(sp__atomic_file_t *f);
void sp__file_atomic_abort(sp__atomic_file_t *f);
/* The temporaries' observer (sp_x_temp_set_fn, experimental.h): told before and after each
 * temporary is created and before and after it is renamed or unlinked. */
void sp__file_temp_set_fn(void (*fn)(int event, const char *path, void *arg), void *arg);

/* Host allocations of the snapshot writer (the emitter's buffer, snapshot.c's collection): realloc
 * with a fault hook. sp__emit_fault_after(n) makes the n-th allocation from now fail (and every
 * one after it until reset); 0 turns the hook off. For tests of the out-of-host-memory paths. */
void *sp__emit_realloc(void *p, size_t n);
void sp__emit_fault_after(long n);

#ifdef __cplusplus
}
#endif

#endif /* SP_CORE_EMIT_H */
