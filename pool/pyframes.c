/*
 * pyframes.c: sp_history_python_frames, a frames hook (sp_history_frames_fn) that reads the
 * calling thread's CPython frames through CPython's C API, for the Python package to install
 * instead of a ctypes callback. The callback cost some 6 us a capture of a 6-frame stack on
 * this project's 2-core host (the trampoline takes the GIL and builds its argument objects, the
 * walk in Python sets two ctypes fields a frame, and f_lineno walks the line table); this reads
 * the same frames for under 300 ns (bench/results/2026-11-29-s21-stacks.jsonl).
 *
 * The library does not link against Python: the functions are looked up once in the process's
 * global symbols (dlsym(RTLD_DEFAULT)), where a python executable, or a libpython loaded
 * RTLD_GLOBAL, puts them. Only functions of CPython's stable ABI are called (no struct layout is
 * assumed); PyFrame_GetBack and PyFrame_GetCode make CPython 3.9 the oldest served, and
 * sp_history_python_frames_supported() says whether this process has them all.
 *
 * The frames and names are those the package's Python hook gives (python/sympool/history.py):
 * innermost first, from the frame that called into sympool; frames whose file name starts with
 * the skip prefix left out; line -1 (written 2^64-1, as PyTorch writes it) where Python's
 * f_lineno is None; a str CPython cannot give as UTF-8 (one with a lone surrogate) in its
 * 'surrogatepass' form, kept in the caller's dict.
 *
 * The strings handed back are CPython's own UTF-8 copies, cached inside the str objects, which
 * the code objects of the frames on this thread's stack keep alive: the library reads them
 * before the allocating call returns, while those frames are still on the stack.
 *
 * Locks: the API table is written once (pthread_once); the walk holds the GIL (taken with
 * PyGILState_Ensure when the caller does not hold it), and cache_lock where it got it with a
 * try (the caches below).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <sys/types.h>

#include "core/core.h"
#include "pool/pyframes.h"
#include "sympool/history.h"

/* CPython's types stay opaque here: every object is a void *. PyGILState_STATE is an enum. */
typedef struct py_api {
    void *(*this_thread_state)(void);               /* PyGILState_GetThisThreadState */
    int (*gil_ensure)(void);                        /* PyGILState_Ensure */
    void (*gil_release)(int);                       /* PyGILState_Release */
    void *(*thread_frame)(void *tstate);            /* PyThreadState_GetFrame (new ref) */
    void *(*frame_back)(void *frame);               /* PyFrame_GetBack (new ref) */
    void *(*frame_code)(void *frame);               /* PyFrame_GetCode (new ref) */
    int (*frame_line)(void *frame);                 /* PyFrame_GetLineNumber */
    void (*incref)(void *obj);                      /* Py_IncRef */
    void (*decref)(void *obj);                      /* Py_DecRef */
    void *(*getattr)(void *obj, void *name);        /* PyObject_GetAttr (new ref) */
    void *(*intern)(const char *text);              /* PyUnicode_InternFromString */
    const char *(*utf8)(void *str, ssize_t *len_p); /* PyUnicode_AsUTF8AndSize */
    void *(*encode)(void *str, const char *encoding, const char *errors); /* ...AsEncodedString */
    char *(*bytes_text)(void *bytes);                                     /* PyBytes_AsString */
    ssize_t (*bytes_size)(void *bytes);                                   /* PyBytes_Size */
    void *(*bytes_from)(const char *text, ssize_t len); /* PyBytes_FromStringAndSize */
    void *(*dict_get)(void *dict, void *key);           /* PyDict_GetItemWithError (borrowed) */
    int (*dict_set)(void *dict, void *key, void *val);  /* PyDict_SetItem */
    void (*err_clear)(void);                            /* PyErr_Clear */
    void (*err_fetch)(void **type, void **value, void **tb); /* PyErr_Fetch */
    void (*err_restore)(void *type, void *value, void *tb);  /* PyErr_Restore */
    int (*finalizing)(void);         /* Py_IsFinalizing (3.13) or _Py_IsFinalizing; may be NULL */
    int (*frame_lasti)(void *frame); /* PyFrame_GetLasti (3.11); NULL: no frame cache */
    int (*gc_disable)(void);         /* PyGC_Disable (3.10); NULL with gc_enable */
    int (*gc_enable)(void);          /* PyGC_Enable (3.10) */
    bool ready; /* every function above but the last four was found (written once: api_once) */
} py_api_t;

static py_api_t api;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

static void *sym(const char *name) {
    return dlsym(RTLD_DEFAULT, name);
}

/* Looks the functions up (the attribute names need the GIL: names_made, from the hook). */
static void api_init(void) {
    py_api_t a;
    memset(&a, 0, sizeof(a));
    /* Assigned through void ** so that a data pointer becomes a function pointer without a
     * cast ISO C leaves undefined (POSIX dlsym's own advice). */
    struct {
        void **slot;
        const char *name;
    } want[] = {
        {(void **)&a.this_thread_state, "PyGILState_GetThisThreadState"},
        {(void **)&a.gil_ensure, "PyGILState_Ensure"},
        {(void **)&a.gil_release, "PyGILState_Release"},
        {(void **)&a.thread_frame, "PyThreadState_GetFrame"},
        {(void **)&a.frame_back, "PyFrame_GetBack"},
        {(void **)&a.frame_code, "PyFrame_GetCode"},
        {(void **)&a.frame_line, "PyFrame_GetLineNumber"},
        {(void **)&a.incref, "Py_IncRef"},
        {(void **)&a.decref, "Py_DecRef"},
        {(void **)&a.getattr, "PyObject_GetAttr"},
        {(void **)&a.intern, "PyUnicode_InternFromString"},
        {(void **)&a.utf8, "PyUnicode_AsUTF8AndSize"},
        {(void **)&a.encode, "PyUnicode_AsEncodedString"},
        {(void **)&a.bytes_text, "PyBytes_AsString"},
        {(void **)&a.bytes_size, "PyBytes_Size"},
        {(void **)&a.bytes_from, "PyBytes_FromStringAndSize"},
        {(void **)&a.dict_get, "PyDict_GetItemWithError"},
        {(void **)&a.dict_set, "PyDict_SetItem"},
        {(void **)&a.err_clear, "PyErr_Clear"},
        {(void **)&a.err_fetch, "PyErr_Fetch"},
        {(void **)&a.err_restore, "PyErr_Restore"},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        *want[i].slot = sym(want[i].name);
        if (*want[i].slot == NULL)
            return; /* not CPython 3.9+, or its symbols are not global: unsupported */
    }
    *(void **)&a.finalizing = sym("Py_IsFinalizing");
    if (a.finalizing == NULL)
        *(void **)&a.finalizing = sym("_Py_IsFinalizing");
    *(void **)&a.frame_lasti = sym("PyFrame_GetLasti");
    *(void **)&a.gc_disable = sym("PyGC_Disable");
    *(void **)&a.gc_enable = sym("PyGC_Enable");
    if (a.gc_disable == NULL || a.gc_enable == NULL)
        a.gc_disable = a.gc_enable = NULL;
    a.ready = true;
    api = a;
}

/* The attribute names, interned on first use (the GIL held). Atomic: a free-threaded Python
 * has no GIL to order them; two threads that both make one store the same interned str (each
 * keeps its reference: never dropped, so the names outlive every walk). */
static void *attr_co_name, *attr_co_filename;

static void *attr_name(void **slot, const char *text) {
    void *name = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (name == NULL && (name = api.intern(text)) != NULL)
        __atomic_store_n(slot, name, __ATOMIC_RELEASE);
    return name;
}

static bool names_made(void) {
    if (attr_name(&attr_co_name, "co_name") != NULL &&
        attr_name(&attr_co_filename, "co_filename") != NULL)
        return true;
    api.err_clear();
    return false;
}

SP_EXPORT bool sp_history_python_frames_supported(void) {
    (void)pthread_once(&api_once, api_init);
    return api.ready;
}

/* s[0..len) as a new bytes object with each U+0000 as 0xC0 0x80, the form history.h gives it in
 * a C string (a name cut at its NUL lost the rest). NULL when there is no memory. */
static void *nul_mapped(const char *s, size_t len) {
    size_t nuls = 0, k = 0;
    for (size_t i = 0; i < len; i++)
        nuls += s[i] == '\0';
    char *buf = malloc(len + nuls + 1);
    if (buf == NULL)
        return NULL;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '\0') {
            buf[k++] = (char)0xC0;
            buf[k++] = (char)0x80;
        } else {
            buf[k++] = s[i];
        }
    }
    void *b = api.bytes_from(buf, (ssize_t)k);
    free(buf);
    return b;
}

/* A str CPython cannot give as UTF-8 (a lone surrogate): its 'surrogatepass' bytes, with any
 * U+0000 mapped too. A new reference, or NULL. */
static void *surrogate_bytes(void *str) {
    void *b = api.encode(str, "utf-8", "surrogatepass");
    if (b == NULL)
        return NULL;
    const char *t = api.bytes_text(b);
    ssize_t n = api.bytes_size(b);
    if (t == NULL || n < 0 || memchr(t, '\0', (size_t)n) == NULL)
        return b;
    void *m = nul_mapped(t, (size_t)n);
    api.decref(b);
    return m;
}

/* str as UTF-8 that lives as long as str does: CPython's cached copy, or for a str it refuses
 * (a lone surrogate) or one holding U+0000 (whose copy a C string would cut) the bytes history.h
 * says (see surrogate_bytes, nul_mapped), kept in `encoded` (str -> bytes, the package's dict,
 * which also holds the str). NULL when neither works: the frame then reads "??". */
static const char *text_of(void *str, void *encoded) {
    ssize_t len;
    const char *s = api.utf8(str, &len);
    if (s != NULL && memchr(s, '\0', (size_t)len) == NULL)
        return s;
    if (s == NULL)
        api.err_clear();
    if (encoded == NULL)
        return s; /* no dict to keep bytes in: a name with U+0000 is cut there, as before */
    void *b = api.dict_get(encoded, str);
    if (b == NULL) {
        b = s != NULL ? nul_mapped(s, (size_t)len) : surrogate_bytes(str);
        if (b == NULL || api.dict_set(encoded, str, b) != 0) {
            if (b != NULL)
                api.decref(b);
            api.err_clear();
            return NULL;
        }
        api.decref(b); /* the dict holds it now */
    }
    return api.bytes_text(b);
}

/* What a code object gives a frame, and whether its frames are kept (not the binding's own). */
typedef struct code_info {
    const char *name, *filename; /* texts the code object (or the arg's dict) keeps */
    bool keep;                   /* its file name does not start with the skip prefix */
} code_info_t;

/* The slow way, through the code object's attributes. */
static void code_read(void *code, const sp_history_python_frames_arg_t *a, code_info_t *out) {
    void *filename = api.getattr(code, __atomic_load_n(&attr_co_filename, __ATOMIC_ACQUIRE));
    void *name = api.getattr(code, __atomic_load_n(&attr_co_name, __ATOMIC_ACQUIRE));
    out->filename = filename != NULL ? text_of(filename, a->encoded) : NULL;
    out->name = name != NULL ? text_of(name, a->encoded) : NULL;
    if (filename == NULL || name == NULL)
        api.err_clear();
    size_t prefix_len = a->skip_prefix != NULL ? strlen(a->skip_prefix) : 0;
    out->keep = prefix_len == 0 || out->filename == NULL ||
                strncmp(out->filename, a->skip_prefix, prefix_len) != 0;
    /* The code object holds both strs (and `encoded` their bytes): the texts outlive these. */
    if (filename != NULL)
        api.decref(filename);
    if (name != NULL)
        api.decref(name);
}

/* The slow way, through the line table: Python's f_lineno, -1 for None. PyTorch writes the line
 * table's answer as it comes, cast to its unsigned 64-bit line: a frame whose instruction has no
 * line is 2^64-1 in its snapshots, and so in ours (a negative line is written so, history.h). */
static int line_read(void *frame) {
    int line = api.frame_line(frame);
    return line >= 0 ? line : -1;
}

/*
 * Two caches, so that a frame seen before costs two table reads instead of two attribute reads
 * and a walk of the line table from its start (4,000 instructions a capture in a loop at the
 * end of a script; the attributes cost as much as the rest of the walk).
 *
 * codes: what code_read gave, by code object and hook argument. An entry holds a reference on
 * its code object, so no other code object can take its address while the entry names it; a
 * slot taken over drops the one it held (after the walk). Each filling gets a number never
 * given to another (its serial).
 *
 * lines: the line at an instruction offset (PyFrame_GetLasti, CPython 3.11+) of the code a serial
 * names; f_lineno is the line table's line at the frame's instruction (a tracer sets the frame's
 * own f_lineno only while its callback runs), so it stands for every frame at that offset. A
 * serial is never reused, so these entries need no reference.
 *
 * A frame's key (pyframes.h) is its serial and line: the same for every frame of that code on
 * that line, whatever the offset (an allocation and a free on one line share their stack).
 *
 * Both direct mapped. The walk takes cache_lock with a try: it never waits while it holds the
 * GIL; a walk that finds it taken (another thread in a free-threaded Python, or a finalizer run
 * inside a walk before CPython 3.10, which cannot hold collections off) reads every frame the
 * slow way.
 */
#define CODE_SLOTS 1024 /* power of two; 40 KiB */
#define LINE_SLOTS 4096 /* power of two; 64 KiB */
#define DEAD_MAX 32     /* references a walk drops after it: past that it stops filling slots */
#define LINE_BITS 24    /* a key is serial << LINE_BITS | line; a line past it has no key */

typedef struct code_entry {
    void *code;       /* a reference on the code object; NULL: empty slot (cache_lock) */
    uint64_t serial;  /* this filling's number (cache_lock) */
    uint64_t arg_gen; /* made_for.gen of the hook argument the info was made with (cache_lock) */
    code_info_t info; /* (cache_lock) */
} code_entry_t;

typedef struct line_entry {
    uint64_t serial; /* the code's filling; 0: empty slot (cache_lock) */
    int lasti;       /* instruction offset (cache_lock) */
    int line;        /* line_read at that offset (cache_lock) */
} line_entry_t;

static code_entry_t codes[CODE_SLOTS];
static line_entry_t lines[LINE_SLOTS];
static uint64_t last_serial; /* the last serial handed out (cache_lock) */

/* The hook argument the entries are made for now, as it read then. Not its address alone: an
 * argument freed and another made at that address (a test's, a binding's made again) read the
 * first one's entries, its skip prefix's choices and texts from its freed dict. An argument that
 * differs in address, prefix pointer or dict gets a new gen, and the entries of older gens are
 * filled again. The dict is held (a reference), so that no other dict takes its address; the
 * prefix is known by its address (the header: its text must not change while in use), which
 * spares every walk a compare of the text. */
static struct {
    const void *arg;    /* its address (cache_lock) */
    const char *prefix; /* its skip_prefix (cache_lock) */
    void *encoded;      /* its dict, a reference held; NULL for none (cache_lock) */
    uint64_t gen;       /* its number, never given to another; 0: none yet (cache_lock) */
} made_for;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct walk {
    const sp_history_python_frames_arg_t *arg;
    bool cached;          /* cache_lock held: the caches may be read and filled */
    void *dead[DEAD_MAX]; /* references slots dropped, released after cache_lock */
    size_t ndead;
    void *old_encoded; /* made_for's dict this walk replaced, released after cache_lock */
} walk_t;

static size_t slot_of(uint64_t h, size_t slots) {
    h *= 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 32)) & (slots - 1);
}

/* Make made_for stand for the walk's argument (cache_lock held). */
static void arg_current(walk_t *w) {
    const sp_history_python_frames_arg_t *a = w->arg;
    if (made_for.gen != 0 && made_for.arg == a && made_for.prefix == a->skip_prefix &&
        made_for.encoded == a->encoded)
        return;
    if (a->encoded != NULL)
        api.incref(a->encoded);
    w->old_encoded = made_for.encoded; /* may free a dict: dropped after cache_lock */
    made_for.arg = a;
    made_for.prefix = a->skip_prefix;
    made_for.encoded = a->encoded;
    made_for.gen = ++last_serial; /* from the serials' count: never one an entry had */
}

/* The code's entry, filled if it was not there; NULL when it cannot be (walk not cached, or
 * too many references to drop already). */
static const code_entry_t *code_entry(walk_t *w, void *code) {
    if (!w->cached)
        return NULL;
    code_entry_t *e = &codes[slot_of((uintptr_t)code >> 4, CODE_SLOTS)];
    if (e->code == code && e->arg_gen == made_for.gen)
        return e;
    if (e->code != NULL) {
        if (w->ndead == DEAD_MAX)
            return NULL;
        w->dead[w->ndead++] = e->code;
        e->code = NULL;
    }
    code_read(code, w->arg, &e->info);
    api.incref(code);
    e->code = code;
    e->serial = ++last_serial;
    e->arg_gen = made_for.gen;
    return e;
}

static int line_of(const code_entry_t *e, void *frame) {
    int lasti = api.frame_lasti != NULL ? api.frame_lasti(frame) : -1;
    if (lasti < 0)
        return line_read(frame);
    line_entry_t *l = &lines[slot_of(e->serial * 0x10001 + (uint64_t)lasti, LINE_SLOTS)];
    if (l->serial != e->serial || l->lasti != lasti) {
        l->serial = e->serial;
        l->lasti = lasti;
        l->line = line_read(frame);
    }
    return l->line;
}

/* The frame as the hook gives it; its key (0: none) through *key_p. False: a frame left out. */
static bool frame_get(walk_t *w, void *frame, void *code, sp_history_frame_t *out,
                      uint64_t *key_p) {
    const code_entry_t *e = code_entry(w, code);
    code_info_t uncached;
    if (e == NULL)
        code_read(code, w->arg, &uncached);
    const code_info_t *info = e != NULL ? &e->info : &uncached;
    if (!info->keep)
        return false;
    out->name = info->name;
    out->filename = info->filename;
    out->line = e != NULL ? line_of(e, frame) : line_read(frame);
    *key_p = e != NULL && out->line >= 0 && out->line < (1 << LINE_BITS)
                 ? e->serial << LINE_BITS | (uint64_t)out->line
                 : 0;
    return true;
}

SP_EXPORT size_t sp_history_python_frames(sp_history_frame_t *frames, size_t max_frames,
                                          void *arg) {
    return sp__python_frames_keyed(frames, NULL, max_frames, arg);
}

size_t sp__python_frames_keyed(sp_history_frame_t *frames, uint64_t *keys, size_t max_frames,
                               void *arg) {
    static const sp_history_python_frames_arg_t none = {NULL, NULL};
    if (!sp_history_python_frames_supported() || frames == NULL)
        return 0;
    /* A thread Python never ran has no frames: give none rather than make it a thread state.
     * While Python finalizes, taking the GIL could stop this thread for good. */
    if (api.this_thread_state() == NULL || (api.finalizing != NULL && api.finalizing()))
        return 0;
    walk_t w = {.arg = arg != NULL ? arg : &none, .ndead = 0, .old_encoded = NULL};
    int gil = api.gil_ensure();
    /* The caller's pending error, if any (C code may free a block on its way to return NULL), is
     * set aside for the walk: the errors the walk clears are then its own only, and the caller's
     * is back as it was after it (one the walk left, out of memory, goes with the restore). */
    void *err_type, *err_value, *err_tb;
    api.err_fetch(&err_type, &err_value, &err_tb);
    /* The walk makes frame objects (PyFrame_GetBack), and one can start a collection, whose
     * finalizers would run inside this hook, where sympool refuses them (a __del__ that frees
     * a block leaked it). Collections wait until the walk is over instead: no Python code runs
     * in it, so no other thread can take the GIL and change gc's switch meanwhile. */
    int gc_was_on = api.gc_disable != NULL ? api.gc_disable() : 0;
    w.cached = pthread_mutex_trylock(&cache_lock) == 0;
    if (w.cached)
        arg_current(&w);
    void *f = names_made() ? api.thread_frame(api.this_thread_state()) : NULL;
    size_t n = 0;
    while (f != NULL && n < max_frames) {
        void *code = api.frame_code(f);
        uint64_t key;
        if (frame_get(&w, f, code, &frames[n], &key)) {
            if (keys != NULL)
                keys[n] = key;
            n++;
        }
        api.decref(code);
        void *back = api.frame_back(f);
        api.decref(f);
        f = back;
    }
    if (f != NULL)
        api.decref(f);
    if (gc_was_on)
        api.gc_enable(); /* before the releases below, which may run Python code */
    if (w.cached)
        pthread_mutex_unlock(&cache_lock);
    for (size_t i = 0; i < w.ndead; i++)
        api.decref(w.dead[i]); /* may free a code object: no lock of ours is held */
    if (w.old_encoded != NULL)
        api.decref(w.old_encoded);
    api.err_restore(err_type, err_value, err_tb);
    api.gil_release(gil);
    return n;
}
