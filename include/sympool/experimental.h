/*
 * sympool/experimental.h: UNSTABLE. The few internal services the sympool CLI (tools/) and the
 * benchmarks (bench/) need beyond the public API, so that they include no private header. Names,
 * shapes and behaviour may change in any release without notice; programs outside this
 * repository should not use them. Not included by sympool.h. Not part of API.md's contract.
 */
#ifndef SYMPOOL_EXPERIMENTAL_H
#define SYMPOOL_EXPERIMENTAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "sympool/mempool.h"
#include "sympool/pool.h"
#include "sympool/stats.h"
#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Set the option named `name` (a SYMPOOL_* variable name, e.g. "SYMPOOL_ALLOC_CONF") from code,
 * parsed like the variable and winning over it; value NULL restores the default. Returns
 * SP_ERR_INVALID_ARGUMENT (with sp_last_error()) for an unknown name or a malformed value, and
 * then changes nothing. Thread-safe; takes effect at the next initialization, except
 * SYMPOOL_SYM_TIMEOUT, which every collective call reads afresh: at the next call. */
sp_status_t sp_x_option_set(const char *name, const char *value);

/** Bytes and blocks idle in every thread's cache (SYMPOOL_THREAD_CACHE) on `device`: part of
 * the allocated figures of sp_memory_stats, which count such blocks as allocated. */
sp_status_t sp_x_thread_cache_idle(int device, size_t *bytes_p, size_t *blocks_p);

/** Replay on the host backend: the next device allocation of exactly `size` bytes on `device`
 * (a segment) is placed at `offset` bytes into the arena's placement region (the upper half of
 * SYMPOOL_HOST_ARENA's reservation, 2 MiB aligned) if that range lies inside it and overlaps no
 * live placed range; otherwise it is carved as without placement. Placements wait oldest first,
 * at most 16 (a 17th pushes out the oldest); size 0 drops every waiting one. A replay places the
 * segments where the recorded GPU had them, relative to the lowest recorded address, so that
 * best fit's ties (the lowest address among free blocks of one size) fall as they did there.
 * From the first call on, ranges carved without placement stay in the arena's lower half.
 * @return SP_SUCCESS; SP_ERR_NOT_SUPPORTED on another backend, without the arena, or with the
 * arena's lower half used up; SP_ERR_INVALID_ARGUMENT for a device that does not exist or an
 * offset that is not a multiple of 512 (then nothing changes). */
sp_status_t sp_x_host_place(int device, size_t size, uint64_t offset);

/** Replay: the free (cached) block that starts at `ptr` shows `requested` as its requested_size
 * in snapshots, the value PyTorch keeps on an inactive block (docs/API.md; it may exceed the
 * block's size: a split's remainder keeps the found block's). A replay's starting state gives
 * its free space the value the recorded run's snapshot shows. Nothing else reads it: no
 * statistic, no later allocation (which sets its own). @return SP_SUCCESS;
 * SP_ERR_INVALID_USAGE (nothing changed) when no free cached block starts at ptr. */
sp_status_t sp_x_free_block_set_requested(void *ptr, size_t requested);

/** Bytes of host memory made usable so far in this process for block and segment structs: they
 * live in one reserved address range outside malloc (so malloc's statistics do not see them),
 * made usable a step at a time and never given back while the process runs. The benchmarks add
 * them to malloc's figures for sympool's metadata per block. Takes no lock. */
size_t sp_x_struct_bytes(void);

/** Whether `text` is a SYMPOOL_ALLOC_CONF (PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax) that would be
 * accepted, checked by the same parser and with PyTorch's rules (max_split_size_mb at least 20,
 * garbage_collection_threshold in (0, 1), ...), without setting anything: when it is not, false
 * with the first reason in why (why_len bytes, always terminated when why_len > 0; why may be
 * NULL). No log line, no last error, no lock; thread-safe. */
bool sp_x_alloc_conf_check(const char *text, char *why, size_t why_len);

/** Whether sp_x_option_set(name, value) would accept `value` (not NULL), checked by the same
 * parser without setting anything and without reading the environment's options: when not,
 * false with the reason in why (sp_x_option_set's words; why_len bytes, always terminated when
 * why_len > 0; why may be NULL). No log line, no last error; thread-safe. */
bool sp_x_option_check(const char *name, const char *value, char *why, size_t why_len);

/** Print every SYMPOOL_* option with its value, default and source to `f` (`sympool info`). */
void sp_x_options_print(FILE *f);

/** One SYMPOOL_* option as `sympool info` shows it: filled by sp_x_option_info. */
typedef struct sp_x_option_info {
    const char *name;        /**< the variable, e.g. "SYMPOOL_HOST_CAPACITY" */
    const char *kind;        /**< "bool", "long", "double", "size", "enum" or "string" */
    const char *source;      /**< "default", "env", "ALLOC_CONF", "api", "PYTORCH_ALLOC_CONF",
                                "PYTORCH_CUDA_ALLOC_CONF" */
    const char *description; /**< the table's one line */
    char value[520];         /**< the value in force as the table writes it (strings unquoted) */
    char default_value[520]; /**< the default, the same way */
    int64_t value_int;       /**< bool (0/1), long, size (bytes), enum (index of the choice) */
    int64_t default_int;     /**< the default, the same way */
    double value_double;     /**< double options (may be infinite) */
    double default_double;   /**< the default, the same way */
} sp_x_option_info_t;

/** Fill *info with option number `index` (0, 1, ... in the table's order); false (info
 * untouched) when index is past the last option or info is NULL. */
bool sp_x_option_info(int index, sp_x_option_info_t *info);

/** Log levels as passed to an sp_x_log_fn. */
enum { SP_X_LOG_VERSION = 1, SP_X_LOG_WARN = 2, SP_X_LOG_INFO = 3, SP_X_LOG_TRACE = 4 };

/** Receives every log line sympool would write (without the newline) while set. */
typedef void (*sp_x_log_fn)(int level, const char *line, void *arg);

/** Route log lines to fn (NULL: back to stderr or SYMPOOL_DEBUG_FILE). Not thread-safe against
 * concurrent logging. A sympool call from inside fn returns SP_ERR_INVALID_USAGE (its line goes
 * to stderr); the caller's sp_last_error() is kept. */
void sp_x_log_set_fn(sp_x_log_fn fn, void *arg);

/** For a program that writes the lines fn receives to SYMPOOL_DEBUG_FILE's file itself: say on
 * stderr, as the library says it of its own log file ("cannot open SYMPOOL_DEBUG_FILE 'path':
 * why; logging to stderr"), that it cannot open path. Once per file, whichever opened it first:
 * false (nothing written) when the library or an earlier call said it of path last. */
bool sp_x_log_cannot_open(const char *path, const char *why);

/** PyTorch's emptyCache for one device only (sp_empty_cache does every device): wait for the
 * pending frees' events, release the default pool's free cached segments and those of pools
 * whose use count is 0. `sympool replay` replays one device's trace at a time. Statuses as
 * sp_empty_cache's (SP_ERR_DEVICE: the device refused to free cached memory, which stays cached),
 * and SP_ERR_INVALID_ARGUMENT for an unknown device. */
sp_status_t sp_x_empty_cache_device(int device);

/** Pool structs sympool holds in this process: every device's default pool and every pool
 * sp_mempool_create made that is not yet released (a destroyed pool is released once it holds no
 * segment and no call is inside sympool; pools of a session sp_shutdown ended stay). Tests and
 * benchmarks check with it that destroyed pools go. Takes no lock. */
size_t sp_x_mempool_structs(void);

/** Whether pool, a handle sp_mempool_create gave out in this session, names a pool that was
 * destroyed and released (its last segment went, after its allocator's last call returned): 1;
 * 0 while it is not released; -1 for anything else (NULL, not a handle, a handle of an earlier
 * session). Sets no error and logs nothing (the Python package asks it of destroyed pools, to drop
 * their segment allocators, where the queries would warn about a released handle). No lock. */
int sp_x_mempool_released(const sp_mempool_t *pool);

/** Drop every device's trace entries and annotations recorded so far; recording, its settings
 * and the stacks of live blocks stay (PyTorch's clear_history=True). The Python package's
 * record_memory_history(clear_history=True) calls it. */
sp_status_t sp_x_history_clear(void);

/** Streams sp_stream_create made in this process that sp_stream_destroy has not destroyed (on
 * either backend; sp_shutdown does not change it). Tests check with it that the Python Stream
 * objects release their streams when collected. Takes no lock. */
size_t sp_x_stream_count(void);

/** The session number: 1 in a fresh process, one more after each sp_shutdown. An object that
 * holds a sympool handle (a stream, a pool) records it at creation, and a finalizer releases the
 * handle only while it is unchanged: after an sp_shutdown the handle may name something else.
 * Takes no lock. */
uint64_t sp_x_session(void);

/** 1 when `stream` is a stream of the backend now (host: one sp_stream_create made in this
 *  session and sp_stream_destroy has not destroyed; cuda: one CUDA answers for, except a handle
 *  sp_stream_destroy or sp_shutdown destroyed and sp_stream_create has not made again, which is
 *  not asked (the last 1024 such handles are remembered): CUDA calls a destroyed handle's use
 *  undefined; one the application destroyed
 *  itself must not be asked about), else 0 (NULL and CUDA's pseudo handles too; the thread's
 *  last error then says why), without a warning; -1 when it cannot tell now (inside a callback
 *  sympool runs, during sp_shutdown: sp_stream_destroy would be refused too; or the device could
 *  not answer: cuda out of memory, a sticky error; the last error says which). An object holding
 *  a stream asks before destroying it, in case the stream was destroyed by other means (the
 *  Python Stream's collection). */
int sp_x_stream_live(sp_stream_t stream);

/** The value snapshots (sp_dump_snapshot, sp_mempool_dump_snapshot) show for `stream` in its
 *  segments' and trace entries' "stream", instead of the handle: `sympool replay` shows the
 *  stream the recording had. label 0 shows the handle again; sp_stream_destroy and sp_shutdown
 *  forget the label. SP_ERR_INVALID_ARGUMENT for the default stream (NULL, shown as 0; or
 *  cudaStreamLegacy, whose blocks are the default stream's), cudaStreamPerThread, or a stream that
 *  is not the backend's. */
sp_status_t sp_x_stream_label(sp_stream_t stream, uint64_t label);

/** The time (microseconds since the Unix epoch) that history stamps on every trace entry and
 *  annotation recorded from now on, on every thread, instead of its clock's; time_us < 0 gives
 *  the clock back (the default; sp_shutdown resets it). Entries so stamped keep the time given,
 *  even when it is earlier than the entry before them. `sympool replay --snapshot` stamps each
 *  replayed event's entries with the recorded event's time, so that its snapshot lines up in time
 *  with the one it replayed. One relaxed atomic store; costs recording nothing while unset. */
void sp_x_history_stamp(int64_t time_us);

/** Queues time_us (microseconds since the Unix epoch) for the next trace entry of `action`
 *  (PyTorch's TraceEntry order: 0 alloc, 1 free_requested, 2 free_completed, 3 segment_alloc,
 *  4 segment_free, 5 segment_map, 6 segment_unmap, 7 snapshot, 8 oom), on any thread: each entry
 *  of that action takes the oldest time queued for it, before sp_x_history_stamp's time or the
 *  clock. time_us < 0 drops every queued time, given any action or -1 (sp_shutdown does too).
 *  `sympool replay --snapshot` queues, per replayed event, the recorded times of what the
 *  allocator did around it (the segment_alloc before an alloc, an immediate free's
 *  free_completed after its free_requested, an empty_cache's segment frees), so that those
 *  entries carry their own recorded times. SP_ERR_INVALID_ARGUMENT for another action,
 *  whatever the time (nothing queued or dropped), SP_ERR_SYSTEM when out of host memory. */
sp_status_t sp_x_history_stamp_next(int action, int64_t time_us);

/** Records on `device` the `snapshot` trace entry that a snapshot appends to each device's history
 *  (size: active_bytes, what a snapshot puts there: the device's active bytes), without taking a
 *  snapshot. `sympool replay --snapshot` re-enacts the recorded run's own snapshots where its
 *  trace has their entries, so that its snapshot lists them where the original does. Nothing
 *  while actions are not recorded. SP_ERR_INVALID_ARGUMENT for a device that does not exist; where
 *  the library cannot start, the start's status (as sp_malloc's). */
sp_status_t sp_x_history_record_snapshot(int device, size_t active_bytes);

/** Totals over this process's symmetric pools on `device` (device < 0: all devices). */
typedef struct sp_x_symmetric_counters {
    int64_t registrations;    /**< segments registered since process start */
    int64_t deregistrations;  /**< segments deregistered */
    int64_t agreement_rounds; /**< allreduce rounds of sp_symmetric_malloc */
    int64_t mallocs;          /**< sp_symmetric_malloc calls that succeeded */
    int64_t growths;          /**< collective segment growths */
    int64_t pools;            /**< live symmetric pools */
} sp_x_symmetric_counters_t;

/** Fill *counters_p (every field 0 when the build has no symmetric pools). */
void sp_x_symmetric_counters(int device, sp_x_symmetric_counters_t *counters_p);

/** Expandable segments' device work on `device` since the allocator started or
 *  sp_reset_accumulated_memory_stats: the cuda backend creates and maps each page with its own
 *  driver calls (cuMemCreate, cuMemMap) and unmaps and releases each on its own, so a GPU's time
 *  in them follows the pages. */
typedef struct sp_x_vmm_counters {
    int64_t pages_mapped;   /**< pages mapped (num_device_alloc counts calls, not pages) */
    int64_t pages_unmapped; /**< pages unmapped */
    int64_t bytes_mapped;   /**< bytes mapped */
    int64_t bytes_unmapped; /**< bytes unmapped */
    int64_t map_calls;      /**< vmm_map calls (each also one cuMemSetAccess on a GPU) */
    int64_t unmap_calls;    /**< vmm_unmap calls */
    int64_t recycle_syncs;  /**< stream or device synchronizations before RECYCLE's unmaps */
} sp_x_vmm_counters_t;

/** Fill *counters_p. SP_ERR_INVALID_ARGUMENT when counters_p is NULL; the device's own errors
 *  (not initialized, out of range) as sp_memory_stats gives them. */
sp_status_t sp_x_vmm_counters(int device, sp_x_vmm_counters_t *counters_p);

/** A figure sp_x_memory_summary_format shows as "-": one its source cannot give (a snapshot
 * records no peak of rounded allocated bytes, for example). */
#define SP_X_SUMMARY_UNKNOWN INT64_MIN

/** sp_memory_summary's table for any statistics (`sympool summary` rebuilds them from a
 * snapshot) under the heading `title`, written like snprintf: truncated to len-1 bytes, always
 * terminated (len > 0). Returns the length of the whole text (>= len: truncated). */
size_t sp_x_memory_summary_format(const sp_stats_t *stats, const char *title, char *buf,
                                  size_t len);

/** A byte count for people, as sympool's reports write it: "512 B", else two decimals in the
 * largest binary unit that keeps the number below 1024 ("1.50 GiB", up to EiB). Writes at most
 * cap bytes into buf, always terminated (cap > 0); returns buf. */
const char *sp_x_size_format(double bytes, char *buf, size_t cap);

/** Translate a JSON memory snapshot (text, len bytes; not NUL-terminated) into the equivalent
 * pickle, which the caller frees with free(). A strict RFC 8259 reader (what Python's json.load
 * reads, nesting bounded at 100,000): on malformed input returns false with a message naming the
 * byte offset in err (errlen bytes, always terminated when errlen > 0) and writes nothing to
 * *pickle_p / *len_p. */
bool sp_x_json_to_pickle(const char *text, size_t len, char **pickle_p, size_t *len_p, char *err,
                         size_t errlen);

/** The same, but every value under an object key equal to skip_key (any depth; NULL: none) is
 * read and checked as strictly as any other, and written as an empty list: a reader that skips
 * those values anyway (replay without stacks skips "frames") gets a document a fraction of the
 * size, and malformed input is refused alike. */
bool sp_x_json_to_pickle_skip(const char *text, size_t len, const char *skip_key, char **pickle_p,
                              size_t *len_p, char *err, size_t errlen);

/** A path pattern (SYMPOOL_DEBUG_FILE's syntax: %h host, %p pid, %r rank, %% percent) expanded as
 * the log expands it in this process: true with the path in out (cap bytes, terminated); false
 * when it names the rank and the rank is not known (the log then goes to stderr), or does not
 * fit, or an argument is NULL. No state, no log. */
bool sp_x_path_expand(const char *pattern, char *out, size_t cap);

/** Whether a SYMPOOL_DEBUG_FILE pattern names path's file in this process, as sp_dump_snapshot
 * tells its target from the log's: the file the pattern expands to (the same file, or the same
 * name in the same folder where neither exists yet); with %r while the rank is not known, the
 * file of any rank (the log opens that rank's once the rank is known, so sp_dump_snapshot refuses
 * them all). False for an empty pattern or a NULL argument. No state, no log. */
bool sp_x_path_names(const char *pattern, const char *path);

/** Write len bytes of buf to path as sp_dump_snapshot writes a snapshot: to a temporary file next
 * to it, synced, then renamed over it, so the old file stays whole when writing fails (a full
 * disk) and readers never see half a file; an existing target that is not a regular file (a FIFO,
 * a directory, a device node) or a regular file this process may not write is refused. `sympool
 * plot` writes its SVG with it. Returns SP_SUCCESS, SP_ERR_INVALID_ARGUMENT or SP_ERR_SYSTEM (the
 * path and the reason in sp_last_error()). */
sp_status_t sp_x_file_write_atomic(const char *path, const void *buf, size_t len);

/** What happens to a temporary file of the atomic writer (sp_x_file_write_atomic,
 * sp_dump_snapshot and every other file sympool writes whole), as told to an sp_x_temp_fn. */
enum {
    SP_X_TEMP_CREATE_BEGIN = 1, /* a temporary is about to be created (path: NULL) */
    SP_X_TEMP_CREATE_END = 2,   /* path: the temporary now exists; NULL: none was created */
    SP_X_TEMP_REMOVE_BEGIN = 3, /* path is about to be renamed over its target or unlinked */
    SP_X_TEMP_REMOVE_END = 4    /* path no longer exists under that name */
};

/** Receives the events above, in pairs: CREATE_BEGIN then CREATE_END, REMOVE_BEGIN then
 * REMOVE_END, on the writing thread. */
typedef void (*sp_x_temp_fn)(int event, const char *path, void *arg);

/** Tell fn (NULL: nobody) where the atomic writer's temporary files are while they exist, so
 * that a program can remove them when it is killed: sympool installs no signal handler of its
 * own, as a library inside someone else's process must not. The `sympool` command's handler of
 * SIGINT, SIGTERM and the like unlinks the one in flight and dies by the same signal; it blocks
 * those signals from each BEGIN to its END, so a temporary is never created or renamed unseen.
 * Set it before any file is written; not thread-safe against a write in flight. */
void sp_x_temp_set_fn(sp_x_temp_fn fn, void *arg);

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_EXPERIMENTAL_H */
