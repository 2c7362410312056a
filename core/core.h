/*
 * core.h: the private services every module uses: setting the thread's last error, logging,
 * the SYMPOOL_* option table, and error-propagation macros. Nothing here is exported.
 *
 * Rule: the function that first sees a failure calls sp__error() (which logs at WARN unless
 * told to stay quiet and fills sp_last_error()); callers only propagate with SP_CHECK*.
 */
#ifndef SP_CORE_H
#define SP_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SP_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define SP_LIKELY(x) __builtin_expect(!!(x), 1)
#define SP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define SP_PRINTF(f, a)
#define SP_LIKELY(x) (x)
#define SP_UNLIKELY(x) (x)
#endif

/* ---- last error ------------------------------------------------------------------------- */

/* Sets this thread's last-error text to the formatted message, logs it at WARN with the
 * caller's file:line (subsystem subsys) and returns status, so callers write
 * `return sp__error(SP_ERR_..., SP_SUB_POOL, "...")`. */
sp_status_t sp__error_at(sp_status_t status, unsigned subsys, const char *file, int line,
                         const char *fmt, ...) SP_PRINTF(5, 6);
#define sp__error(status, subsys, ...)                                                             \
    sp__error_at((status), (subsys), __FILE__, __LINE__, __VA_ARGS__)

/* Same, but logs at INFO instead of WARN: for failures that are expected and handled, such as
 * an OOM that the caller will retry, or a probe for CUDA under SYMPOOL_DEVICE=auto. */
sp_status_t sp__error_quiet_at(sp_status_t status, unsigned subsys, const char *file, int line,
                               const char *fmt, ...) SP_PRINTF(5, 6);
#define sp__error_quiet(status, subsys, ...)                                                       \
    sp__error_quiet_at((status), (subsys), __FILE__, __LINE__, __VA_ARGS__)

/* While on, the errors this thread sets log at INFO instead of WARN: for a query whose "no" is
 * an answer, not a failure (sp_x_stream_live asks the backend about a handle that may be gone),
 * made through calls that report it as an error. Off again before returning to the caller. */
void sp__errors_quiet(bool on);

/* Clears this thread's last-error text (tests and retry paths use it). */
void sp__error_clear(void);
/* Sets this thread's last-error text, nothing else (status.c; sp__error_at builds on it). */
void sp__error_vset(const char *fmt, va_list ap);

/* ---- user callbacks ---------------------------------------------------------------------- */

/* A user callback (a MemPool's segment allocator, the history frames hook, a log function) may
 * run while this thread holds an allocator lock or is inside sp_malloc: a sympool call from it
 * would deadlock on that lock or recurse without end. The callers of user code bracket it with
 * enter/leave; the public entries refuse with sp__callback_refused while the thread is inside.
 * The process-wide count lets the allocation fast path skip the thread-local read. */
extern int sp__callback_threads;        /* threads now inside a user callback (atomic builtins) */
extern __thread int sp__callback_depth; /* GNU spelling: C++ tests include this header */
void sp__callback_enter(void);
void sp__callback_leave(void);
static inline bool sp__in_callback(void) {
    return SP_UNLIKELY(__atomic_load_n(&sp__callback_threads, __ATOMIC_RELAXED) != 0) &&
           sp__callback_depth > 0;
}

/* The allocator's call-free fast paths (sp_malloc, sp_free) test one word instead of one per
 * reason to step aside: sp__fast_off counts those reasons, each also kept in its own variable
 * for the whole path. SP_FAST_NOT_READY while sympool is not initialized (so 0 implies it is: the
 * init's release of that count orders everything it built before the fast path's acquire load),
 * SP_FAST_REASON per thread inside a user callback, per thread routing to a MemPool, while
 * memory history is recorded and while caching is off (SYMPOOL_NO_CACHING: a free gives its
 * segment back), and SP_FAST_NO_HIT (malloc only: sizes are rounded by divisions, caching is
 * off or segments are expandable). */
enum { SP_FAST_NO_HIT = 1, SP_FAST_REASON = 2, SP_FAST_NOT_READY = 2 };
/* Hidden, so that the fast paths read it straight (no indirection through the GOT of the shared
 * library); it is defined with the library's default hidden visibility anyway. */
extern __attribute__((visibility("hidden"))) int sp__fast_off; /* atomic builtins */
static inline void sp__fast_off_add(int n) {
    __atomic_fetch_add(&sp__fast_off, n, __ATOMIC_RELEASE);
}
/* May sp_malloc's fast path run? (0: no reason against it) */
static inline bool sp__fast_malloc_on(void) {
    return __atomic_load_n(&sp__fast_off, __ATOMIC_ACQUIRE) == 0;
}
/* May sp_free's fast path run? (SP_FAST_NO_HIT does not concern it) */
static inline bool sp__fast_free_on(void) {
    return __atomic_load_n(&sp__fast_off, __ATOMIC_ACQUIRE) < SP_FAST_REASON;
}

/* SP_ERR_INVALID_USAGE naming fn: called from inside a callback sympool is running. */
sp_status_t sp__callback_refused(const char *fn);
/* The room of a thread's last-error text: long enough for the OOM message with its figures and a
 * pool name. */
#define SP_ERROR_TEXT_MAX 1024
/* Keep this thread's last-error text across a callback: copied into saved (SP_ERROR_TEXT_MAX
 * bytes, the caller's; not the heap, which may be what the failure was short of) and put back
 * from it by the second call. */
void sp__error_swap_out(char *saved);
void sp__error_swap_in(const char *saved);

/* ---- logging ---------------------------------------------------------------------------- */

typedef enum {
    SP_LOG_NONE = 0,
    SP_LOG_VERSION,
    SP_LOG_WARN,
    SP_LOG_INFO,
    SP_LOG_TRACE
} sp_log_level_t;

/* Subsystems (SYMPOOL_DEBUG_SUBSYS=INIT,POOL,... ; ^ negates; ALL). */
enum {
    SP_SUB_INIT = 1u << 0,
    SP_SUB_POOL = 1u << 1,
    SP_SUB_DEVICE = 1u << 2,
    SP_SUB_SYM = 1u << 3,
    SP_SUB_BOOT = 1u << 4,
    SP_SUB_COLL = 1u << 5,
    SP_SUB_ENV = 1u << 6,
    SP_SUB_API = 1u << 7,
    SP_SUB_HISTORY = 1u << 8,
    SP_SUB_ALL = 0xffffu
};

/* The level and mask in force; read with relaxed loads on every log macro before formatting.
 * Until the options are read (the first use, and again after sp_shutdown) the level is
 * SP_LOG_UNREAD, above every real level, so the first log line goes through sp__log_wanted,
 * which reads the options (SYMPOOL_DEBUG included) before deciding. */
#define SP_LOG_UNREAD 100
extern int sp__log_level;
extern unsigned sp__log_mask;
/* The level the options last set (never SP_LOG_UNREAD once they were read): what sp__log_wanted
 * judges by when sp__log_level holds the mark of an sp_shutdown that raced the line. */
extern int sp__log_level_configured;

/* Writes one line unconditionally (callers test SP_LOG_ENABLED first). */
void sp__log_at(sp_log_level_t level, unsigned subsys, const char *file, int line, const char *fmt,
                ...) SP_PRINTF(5, 6);
/* Reads the options if they are not read yet, then says whether (level, subsys) is logged. */
bool sp__log_wanted(sp_log_level_t level, unsigned subsys);

#define SP_LOG_ENABLED(level, subsys)                                                              \
    (SP_UNLIKELY(__atomic_load_n(&sp__log_level, __ATOMIC_RELAXED) >= (int)(level)) &&             \
     sp__log_wanted((level), (subsys)))
#define SP_WARN(subsys, ...)                                                                       \
    do {                                                                                           \
        if (SP_LOG_ENABLED(SP_LOG_WARN, (subsys)))                                                 \
            sp__log_at(SP_LOG_WARN, (subsys), __FILE__, __LINE__, __VA_ARGS__);                    \
    } while (0)
#define SP_INFO(subsys, ...)                                                                       \
    do {                                                                                           \
        if (SP_LOG_ENABLED(SP_LOG_INFO, (subsys)))                                                 \
            sp__log_at(SP_LOG_INFO, (subsys), __FILE__, __LINE__, __VA_ARGS__);                    \
    } while (0)
#define SP_TRACE(subsys, ...)                                                                      \
    do {                                                                                           \
        if (SP_LOG_ENABLED(SP_LOG_TRACE, (subsys)))                                                \
            sp__log_at(SP_LOG_TRACE, (subsys), __FILE__, __LINE__, __VA_ARGS__);                   \
    } while (0)

/* The rank and device shown in the log prefix "[r3 d1]" ("[r- d-]" while unknown). The rank is
 * also the one %r expands to (process.c); setting it reopens a SYMPOOL_DEBUG_FILE with %r. */
void sp__log_set_rank(int rank);
void sp__log_set_device(int device);

/* ---- the process (process.c) ------------------------------------------------------------ */

/* The one rank source: the world's rank, else the MPI launcher's (OMPI_COMM_WORLD_RANK,
 * PMIX_RANK, PMI_RANK, SLURM_PROCID), else -1. */
int sp__process_rank(void);
void sp__process_set_rank(int rank); /* the world's rank, -1 = none (sp__log_set_rank calls it) */
const char *sp__process_host(void);  /* short host name ("node7", not "node7.cluster") */
/* The short host name read now into out (cap bytes, cut to fit); what sp__process_host keeps. */
void sp__process_host_read(char *out, size_t cap);

typedef enum { SP_EXPAND_OK, SP_EXPAND_NO_RANK, SP_EXPAND_TOO_LONG } sp_expand_t;

/* Length of the valid UTF-8 sequence at s (1-4), or 0 when s starts an invalid one (a stray
 * byte, an overlong form, a surrogate, a sequence a NUL cuts short: reads no byte past one). */
size_t sp__utf8_len(const unsigned char *s);

/* ---- numbers in the C locale (size_format.c) --------------------------------------------- */

/* A program's setlocale (a decimal comma: de_DE, fr_FR) never reaches sympool's numbers: they
 * are read and written in the C locale, so settings read the same everywhere and reports, JSON
 * and messages keep a decimal point. sp__c_numeric_begin switches this thread's formatting to
 * the C locale and returns what sp__c_numeric_end(old) restores (NULL: nothing was switched). */
void *sp__c_numeric_begin(void);
void sp__c_numeric_end(void *old);
/* strtod in the C locale. */
double sp__strtod_c(const char *s, char **end);

/* ---- sizes for people (size_format.c) ---------------------------------------------------- */

typedef enum {
    SP_SIZE_HUMAN,   /* "512 B", "1.50 GiB": reports and the CLI */
    SP_SIZE_PYTORCH, /* PyTorch's format_size: "1024 bytes", "1.50 GiB" (OOM messages) */
    SP_SIZE_CELL,    /* memory_summary's 10-character cell: "   1.5 GiB" */
} sp_size_style_t;
/* Format `bytes` in `style` into buf (always terminated); returns buf. */
const char *sp__size_format(double bytes, sp_size_style_t style, char *buf, size_t cap);
/* A double as people read it: the fewest significant digits ("%.*g") that read back as exactly
 * v, so a value just past a bound never prints as the bound ("1.0000001", not %g's "1"). */
const char *sp__double_format(double v, char *buf, size_t cap);

/* The one expansion of a path pattern: %h short host name, %p pid, %r rank, %% a percent sign;
 * any other %x stays as written. A %r with the rank unknown becomes unknown_rank, or, when that
 * is negative, the call returns SP_EXPAND_NO_RANK. SP_EXPAND_TOO_LONG when out (cap bytes,
 * terminator included) is too small. out is complete only on SP_EXPAND_OK. */
sp_expand_t sp__path_expand(const char *pattern, int unknown_rank, char *out, size_t cap);

/* Test hook: every formatted log line (without trailing newline) goes to fn instead of the
 * log file while it is set; NULL restores the file. Not thread-safe against concurrent logging. */
typedef void (*sp_log_fn_t)(sp_log_level_t level, const char *line, void *arg);
void sp__log_set_fn(sp_log_fn_t fn, void *arg);

/* Whether `path` is the library's log file (SYMPOOL_DEBUG_FILE): the one open now, or the one
 * the next line would open (by name too, when neither exists yet); the pattern
 * in force into pattern (cap bytes). A file written there (a snapshot) would take the log's
 * later lines, or leave the log writing to the replaced file. Reads the options first. */
bool sp__log_is_file(const char *path, char *pattern, size_t cap);

/* Whether pattern (SYMPOOL_DEBUG_FILE's syntax) names path's file as the log would open it: the
 * same file, or the same name in the same folder when neither exists; with %r while the rank is
 * not known, the file of any rank (the log opens that one once the rank is known). No state. */
bool sp__log_pattern_names(const char *pattern, const char *path);

/* Say on stderr, as the log says it of its own file, that path cannot be opened for the log
 * (why), unless that file was the last said so: false then (nothing written). */
bool sp__log_cannot_open(const char *path, const char *why);

/* Internal to core/ (config.c drives log.c): apply SYMPOOL_DEBUG / _SUBSYS / _FILE. */
void sp__log_configure(int level, unsigned mask, const char *file_pattern);
/* "INIT,POOL", "^COLL", "ALL" (any case) -> SP_SUB_* mask; false on an unknown name. */
bool sp__log_parse_mask(const char *text, unsigned *mask_p);
const char *sp__log_level_name(int level); /* "WARN" */

/* ---- options ---------------------------------------------------------------------------- */

/* The one list of SYMPOOL_* variables: it generates the sp_option_t enum (here), the table that
 * parses and validates them (options.c) and the printer (config.c). Columns: the name after
 * SYMPOOL_ (the enum is SP_OPT_<name>), kind, default as text, enum choices, extra check, the
 * SYMPOOL_ALLOC_CONF key it also comes from (SP_CONF_KEY_*, 0 = none), description.
 * Read on first use (not before main), again after sp_shutdown. A bad value warns once and keeps
 * the default. */
#define SP_OPTION_LIST(X)                                                                          \
    X(DEVICE, ENUM, "auto", device_choices, NULL, 0,                                               \
      "backend: auto (cuda when a GPU answers, else host), cuda, host")                            \
    X(DEBUG, ENUM, "WARN", level_choices, NULL, 0, "log level: NONE, VERSION, WARN, INFO, TRACE")  \
    X(DEBUG_SUBSYS, STRING, "ALL", NULL, check_subsys, 0,                                          \
      "subsystems logged: INIT,POOL,DEVICE,SYM,BOOT,COLL,ENV,API,HISTORY,ALL; ^ = all except")     \
    X(DEBUG_FILE, STRING, "", NULL, NULL, 0,                                                       \
      "log file pattern (%h host, %p pid, %r rank); empty = stderr")                               \
    X(INFO, BOOL, "0", NULL, NULL, 0, "print this table at first load")                            \
    X(ALLOC_CONF, STRING, "", NULL, check_alloc_conf, 0,                                           \
      "allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax")                                      \
    X(NO_CACHING, BOOL, "0", NULL, NULL, 0,                                                        \
      "free to the device at once (like PYTORCH_NO_CUDA_MEMORY_CACHING)")                          \
    X(MAX_SPLIT_SIZE, SIZE, "0", NULL, check_split, SP_CONF_KEY_MAX_SPLIT_SIZE,                    \
      "largest cached block that may be split; 0 = unlimited (max_split_size_mb)")                 \
    X(MAX_NON_SPLIT_ROUNDING, SIZE, "20MiB", NULL, check_min20m,                                   \
      SP_CONF_KEY_MAX_NON_SPLIT_ROUNDING,                                                          \
      "slack allowed when reusing an unsplittable block (max_non_split_rounding_mb)")              \
    X(LARGE_SEGMENT_SIZE, SIZE, "20MiB", NULL, check_large_seg, SP_CONF_KEY_LARGE_SEGMENT_SIZE,    \
      "segment size for 1-10 MiB requests (large_segment_size_mb)")                                \
    X(GC_THRESHOLD, DOUBLE, "0", NULL, check_gc, SP_CONF_KEY_GC_THRESHOLD,                         \
      "garbage collection threshold in [0,1); 0 = off (garbage_collection_threshold)")             \
    X(ROUNDUP_POWER2_DIVISIONS, STRING, "", NULL, check_roundup, SP_CONF_KEY_ROUNDUP,              \
      "N or [64:8,256:4,>:1] (roundup_power2_divisions); empty = off")                             \
    X(EXPANDABLE_SEGMENTS, BOOL, "0", NULL, NULL, SP_CONF_KEY_EXPANDABLE,                          \
      "expandable segments (expandable_segments): one growing segment per stream and pool kind")   \
    X(EXPANDABLE_PAGE, SIZE, "2MiB", NULL, check_exp_page, 0,                                      \
      "ours: large-pool page of expandable segments, at most 1GiB (rounded up to the device's "    \
      "granularity); 0 = PyTorch's 20 MiB")                                                        \
    X(EXPANDABLE_RECYCLE, BOOL, "1", NULL, NULL, 0,                                                \
      "ours: before the default pool's expandable segments grow, unmap their whole free pages "    \
      "(the memory moves instead of adding up; costs map/unmap calls); 0 = PyTorch's rules")       \
    X(EXPANDABLE_BORROW, BOOL, "1", NULL, NULL, 0,                                                 \
      "ours: a small request that would map a new small-pool page takes a free piece of the "      \
      "large pool's expandable segments instead; 0 = PyTorch's rules")                             \
    X(EXPANDABLE_SHARED, SIZE, "256MiB", NULL, NULL, 0,                                            \
      "ours, with EXPANDABLE_BORROW on: while a pool reserves less than this, its small requests " \
      "use the large pool's expandable segments (no small-pool pages); 0 = never")                 \
    X(EXPANDABLE_ALIGN, BOOL, "1", NULL, NULL, 0,                                                  \
      "ours, with EXPANDABLE_RECYCLE on: once a pool past EXPANDABLE_SHARED has unmapped pages, "  \
      "a growth for a page or more starts on a page boundary when that maps no more and skips "    \
      "at most EXPANDABLE_ALIGN_SKIP; 0 = off")                                                    \
    X(EXPANDABLE_ALIGN_SKIP, DOUBLE, "0.25", NULL, check_align_skip, 0,                            \
      "ours, with EXPANDABLE_ALIGN on: the most a growth skips to start on a page boundary, as a " \
      "fraction of a page in [0, 0.5] (0.5: the rule before this option)")                         \
    X(EXPANDABLE_ALIGN_SMALL, BOOL, "1", NULL, NULL, 0,                                            \
      "ours, with EXPANDABLE_ALIGN on: under EXPANDABLE_SHARED too, once the pool has unmapped, "  \
      "a growth for whole pages starts on a page boundary when that maps no more (any skip); "     \
      "0 = off (packed there)")                                                                    \
    X(EXPANDABLE_FIT_END, BOOL, "1", NULL, NULL, 0,                                                \
      "ours, with EXPANDABLE_ALIGN on and under its conditions: a request of whole pages cut "     \
      "from a larger cached block that starts inside a page and ends on one takes its end; "       \
      "0 = off (the block's start, PyTorch's)")                                                    \
    X(EXPANDABLE_WHOLE, BOOL, "1", NULL, NULL, 0,                                                  \
      "ours, with EXPANDABLE_ALIGN on: until the default pool, past EXPANDABLE_SHARED, first "     \
      "unmaps, its requests of whole pages grow an expandable segment of their own; 0 = off")      \
    X(EXPANDABLE_SIDE, BOOL, "1", NULL, NULL, 0,                                                   \
      "ours, with EXPANDABLE_RECYCLE on: a request over 1 MiB cut from a larger cached block of "  \
      "the default pool takes the block's end when that maps fewer pages than its start; 0 = off") \
    X(EXPANDABLE_PIN, BOOL, "1", NULL, NULL, 0,                                                    \
      "ours, with EXPANDABLE_RECYCLE on: a request of 1 MiB or less that best fit would cut from " \
      "a cached block of the default pool holding a page more than it needs, where it would "      \
      "touch a page no live block holds, takes the next larger cached block whose start lies in "  \
      "a page its live neighbour keeps mapped, if one of the next 8 is; 0 = off")                  \
    X(THREAD_CACHE, SIZE, "0", NULL, NULL, 0,                                                      \
      "ours: bytes of freed blocks (<= 1 MiB each) each thread keeps for its own next mallocs, "   \
      "without the device lock; changes best fit (docs/threads.md); 0 = off")                      \
    X(LOCK_BIAS, BOOL, "1", NULL, NULL, 0,                                                         \
      "ours: each device lock is biased to the first thread that takes it (no locked "             \
      "instruction for it; another thread revokes it with membarrier, and one that then takes "    \
      "it alone for a streak gets it re-biased); 0 = every call's CAS")                            \
    X(HOST_CAPACITY, SIZE, "80GiB", NULL, check_positive, 0,                                       \
      "memory of each emulated host device")                                                       \
    X(HOST_DEVICES, LONG, "1", NULL, check_devices, 0, "number of emulated host devices (1-64)")   \
    X(HOST_FAIL_AFTER, LONG, "0", NULL, check_nonneg, 0,                                           \
      "make the Nth host device allocation fail; 0 = never")                                       \
    X(HOST_ARENA, BOOL, "0", NULL, NULL, 0,                                                        \
      "host: hand out address space carved from one reservation per device, never accessible "     \
      "(no system call per segment; for replay, which never touches the memory)")                  \
    X(SYM_TIMEOUT, DOUBLE, "60", NULL, check_timeout, 0,                                           \
      "deadline (s) of each collective call's agreement round; 0 or inf: none")                    \
    X(SYM_REGISTRAR, ENUM, "auto", registrar_choices, NULL, 0,                                     \
      "who registers symmetric windows: auto, nccl, mpi")                                          \
    X(REPORT, ENUM, "none", report_choices, NULL, 0,                                               \
      "report at exit: none, table, json, prometheus, table_all (every key)")                      \
    X(REPORT_FILE, STRING, "", NULL, NULL, 0,                                                      \
      "file for SYMPOOL_REPORT (%h host, %p pid, %r rank); empty = stdout")

#define SP_OPT_ENUM_(name, kind, def, choices, check, conf_key, desc) SP_OPT_##name,
typedef enum { SP_OPTION_LIST(SP_OPT_ENUM_) SP_OPT_COUNT } sp_option_t;
#undef SP_OPT_ENUM_

typedef enum {
    SP_OPT_SRC_DEFAULT,
    SP_OPT_SRC_ENV,
    SP_OPT_SRC_CONF,
    SP_OPT_SRC_API,
    SP_OPT_SRC_PYTORCH,      /* SYMPOOL_ALLOC_CONF and PYTORCH_ALLOC_CONF unset: taken from
                                PYTORCH_CUDA_ALLOC_CONF */
    SP_OPT_SRC_PYTORCH_ALLOC /* SYMPOOL_ALLOC_CONF unset: taken from PYTORCH_ALLOC_CONF */
} sp_option_source_t;

int64_t sp__option_int(sp_option_t opt);        /* bool, long, size and enum (index) options */
double sp__option_double(sp_option_t opt);      /* double options */
const char *sp__option_string(sp_option_t opt); /* string and enum (name) options; never NULL */
sp_option_source_t sp__option_source(sp_option_t opt);
const char *sp__option_name(sp_option_t opt); /* "SYMPOOL_HOST_CAPACITY" */

/* Set an option from code (tests, the CLI's --conf/--capacity); value parsed like the variable.
 * Returns SP_ERR_INVALID_ARGUMENT (with a message) for a malformed value, changing nothing. */
sp_status_t sp__option_set(sp_option_t opt, const char *value);

/* Re-read the environment, forgetting values set through sp__option_set (tests). */
void sp__options_reload(void);

/* Read the table at first use (idempotent, cheap after the first call; safe to call while
 * loading). */
void sp__options_ensure(void);

/* sp_shutdown: the next first use reads the environment again (values set through
 * sp__option_set stay). */
void sp__options_forget(void);

/* fork() (pool/fork.c): hold the option table's and the log's locks across fork() (taken last:
 * both are leaves of the lock order, options before log) and release them in parent and child. */
void sp__options_fork_lock(void);
void sp__options_fork_unlock(void);
void sp__log_fork_lock(void);
void sp__log_fork_unlock(void);

/* Print every option with its value and source (SYMPOOL_INFO=1, `sympool info`). */
void sp__options_print(void *file /* FILE * */);

/* Parsers shared with the CLI and the ALLOC_CONF reader. Sizes: "512", "64KiB", "80GiB", "1.5G",
 * "2MB" (K/M/G/T, optional "iB"/"B", binary multiples). Booleans: 1/0, on/off, yes/no,
 * true/false (any case). Return false on malformed input, writing nothing; a well-formed size
 * too large for a size_t also sets errno to ERANGE. */
bool sp__parse_size(const char *text, size_t *bytes_p);
bool sp__parse_bool(const char *text, bool *value_p);

/* The allocator settings that come from SYMPOOL_ALLOC_CONF and the separate variables, resolved
 * (separate variables win over ALLOC_CONF keys). */
/* The segment that serves every request of 1 to 10 MiB must hold the largest of them (10 MiB,
 * the allocator's SP_MIN_LARGE_ALLOC), be a whole number of 2 MiB pages (expandable segments map
 * it in pages of that granularity), and stay far from size arithmetic's overflow. */
#define SP_LARGE_SEGMENT_MIN ((size_t)10 << 20)
#define SP_LARGE_SEGMENT_MAX ((size_t)1 << 40)
#define SP_LARGE_SEGMENT_STEP ((size_t)2 << 20)
/* SYMPOOL_EXPANDABLE_PAGE's ceiling: the page is the unit every growth maps, so a page past this
 * would make every expandable allocation map more than the option exists to save (and one past
 * the device's memory, fail). */
#define SP_EXPANDABLE_PAGE_MAX ((size_t)1 << 30)

typedef struct sp_alloc_conf {
    size_t max_split_size;          /* bytes; SIZE_MAX = unlimited */
    size_t max_non_split_rounding;  /* bytes */
    size_t large_segment_size;      /* bytes, in [SP_LARGE_SEGMENT_MIN, SP_LARGE_SEGMENT_MAX] */
    double gc_threshold;            /* 0 = off */
    double memory_fraction;         /* per_process_memory_fraction at start-up; 1.0 = none */
    bool expandable_segments;       /* one growing segment per stream and pool kind */
    bool no_caching;                /* SYMPOOL_NO_CACHING */
    uint32_t roundup_divisions[16]; /* per power-of-2 interval from 1 MiB; 0 = none */
    char conf_text[512];            /* the ALLOC_CONF string as given, for snapshots */
    /* CUDA-only keys: no effect here, kept only to report them as PyTorch's snapshot does. */
    uint32_t pinned_num_register_threads;   /* a power of 2 up to 128; default 1 */
    bool release_lock_on_cudamalloc;        /* or release_lock_on_hipmalloc */
    bool pinned_use_cuda_host_register;     /* or pinned_use_hip_host_register */
    bool graph_capture_record_stream_reuse; /* default false */
} sp_alloc_conf_t;

/* Parse a PyTorch-syntax string ("max_split_size_mb:128,garbage_collection_threshold:0.6,...")
 * onto conf (which holds defaults or earlier values). Unknown keys and bad values return
 * SP_ERR_INVALID_ARGUMENT naming the key (logged at WARN); conf is left unchanged then. Each
 * ignored CUDA-only key is logged at INFO. */
sp_status_t sp__alloc_conf_parse(const char *text, sp_alloc_conf_t *conf);

/* Keys seen by sp__alloc_conf_parse_ex (bit set in *keys_p). */
enum {
    SP_CONF_KEY_MAX_SPLIT_SIZE = 1u << 0,
    SP_CONF_KEY_MAX_NON_SPLIT_ROUNDING = 1u << 1,
    SP_CONF_KEY_LARGE_SEGMENT_SIZE = 1u << 2,
    SP_CONF_KEY_GC_THRESHOLD = 1u << 3,
    SP_CONF_KEY_ROUNDUP = 1u << 4,
    SP_CONF_KEY_EXPANDABLE = 1u << 5,
    SP_CONF_KEY_MEMORY_FRACTION = 1u << 6
};

/* What the parser says about one entry: bad == true for an entry it rejects (status and why),
 * false for a CUDA-only key it accepts and ignores (why says so). */
typedef void (*sp_alloc_conf_note_fn)(void *arg, bool bad, sp_status_t status, const char *why);

/* The quiet form (core/ internal): no log, no last error. strict (lenient == false): the first
 * bad entry fails the whole text, its reason in why, conf unchanged. lenient: a bad entry is
 * skipped and reported to note (the others apply, as PyTorch rejects only what it cannot parse).
 * On success *keys_p (if non-NULL) gets the keys applied and roundup_text (if non-NULL) the
 * roundup_power2_divisions value text. note (may be NULL) also hears of each ignored key. */
sp_status_t sp__alloc_conf_parse_ex(const char *text, sp_alloc_conf_t *conf, unsigned *keys_p,
                                    char *roundup_text, size_t roundup_len, bool lenient,
                                    sp_alloc_conf_note_fn note, void *note_arg, char *why,
                                    size_t why_len);

/* The built-in defaults (max_split_size SIZE_MAX, 20 MiB roundings, no roundup table). */
void sp__alloc_conf_defaults(sp_alloc_conf_t *conf_p);

/* The resolved configuration (defaults <- SYMPOOL_ALLOC_CONF <- SYMPOOL_* variables), a typed
 * copy kept by config.c since the last load or set: no text is parsed again. */
void sp__alloc_conf_get(sp_alloc_conf_t *conf_p);

/* ---- propagation ------------------------------------------------------------------------ */

#define SP_CHECK(call)                                                                             \
    do {                                                                                           \
        sp_status_t sp_check_res_ = (call);                                                        \
        if (SP_UNLIKELY(sp_check_res_ != SP_SUCCESS)) {                                            \
            SP_TRACE(SP_SUB_API, "%s -> %s", #call, sp_status_name(sp_check_res_));                \
            return sp_check_res_;                                                                  \
        }                                                                                          \
    } while (0)

#define SP_CHECK_GOTO(call, res, label)                                                            \
    do {                                                                                           \
        (res) = (call);                                                                            \
        if (SP_UNLIKELY((res) != SP_SUCCESS)) {                                                    \
            SP_TRACE(SP_SUB_API, "%s -> %s", #call, sp_status_name(res));                          \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#define SP_ARG_CHECK(cond, subsys, ...)                                                            \
    do {                                                                                           \
        if (SP_UNLIKELY(!(cond)))                                                                  \
            return sp__error(SP_ERR_INVALID_ARGUMENT, (subsys), __VA_ARGS__);                      \
    } while (0)

/* Mark every exported function. The library is built with -fvisibility=hidden. */
#define SP_EXPORT __attribute__((visibility("default")))

/* Monotonic time in nanoseconds, and wall-clock microseconds since the epoch. */
uint64_t sp__now_ns(void);
int64_t sp__epoch_us(void);

/* Cheap stamps for events recorded often (core/time.c): ticks of the invariant TSC, or
 * CLOCK_MONOTONIC's nanoseconds where there is none. An anchor reads the three clocks at once; a
 * map built from two anchors turns a tick count into wall-clock microseconds. */
uint64_t sp__ticks(void);
typedef struct sp_tick_anchor {
    uint64_t ticks;
    uint64_t mono_ns;
    int64_t epoch_us;
} sp_tick_anchor_t;
typedef struct sp_tick_map {
    uint64_t ticks0;
    int64_t epoch_us0;
    double us_per_tick;
} sp_tick_map_t;
void sp__tick_anchor(sp_tick_anchor_t *a);
void sp__tick_map(const sp_tick_anchor_t *from, const sp_tick_anchor_t *to, sp_tick_map_t *m);
int64_t sp__tick_us(const sp_tick_map_t *m, uint64_t ticks);

#ifdef __cplusplus
}
#endif

#endif /* SP_CORE_H */
