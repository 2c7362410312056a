/**
 * @file history.h
 * @brief Memory history (PyTorch's _record_memory_history) and snapshots PyTorch's viewer reads.
 *
 * Recording keeps, per device, a ring buffer of trace entries with PyTorch's actions and sizes
 * (alloc: the request; free_requested/free_completed: the block's requested size;
 * segment_alloc/segment_free: the segment size; oom: the rounded request with the device's free
 * bytes). Snapshots have PyTorch's structure (segments, device_traces, allocator_settings,
 * external_annotations: sp_history_record_annotation's) and open in pytorch.org/memory_viz and
 * torch/cuda/_memory_viz.py. All functions are thread-safe. Recording off costs the allocator one
 * relaxed load per call.
 */
#ifndef SYMPOOL_HISTORY_H
#define SYMPOOL_HISTORY_H

#include <stdbool.h>
#include <stddef.h>

#include "sympool/mempool.h"
#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { SP_HISTORY_OFF, SP_HISTORY_STATE, SP_HISTORY_ALL } sp_history_enabled_t;
typedef enum {
    SP_CONTEXT_NONE,
    SP_CONTEXT_STATE,
    SP_CONTEXT_ALLOC,
    SP_CONTEXT_ALL
} sp_history_context_t;

typedef struct sp_history_params {
    sp_history_enabled_t enabled; /**< OFF clears the buffer; STATE keeps one trace entry */
    sp_history_context_t context; /**< which records carry stack frames */
    size_t max_entries;           /**< ring buffer size; 0 = unbounded */
    bool c_stacks;                /**< record C stack frames */
    /** (sympool addition) PyTorch's skip_actions: comma-separated action names ("alloc",
     * "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
     * "segment_unmap", "snapshot", "oom") never stored in the trace; NULL or "" = none. An
     * unknown or empty name (",alloc", "alloc,,oom") is SP_ERR_INVALID_ARGUMENT. */
    const char *skip_actions;
} sp_history_params_t;

/** Defaults: enabled ALL, context ALL, max_entries 0 (unbounded), c_stacks false; NULL ignored */
void sp_history_params_init(sp_history_params_t *params);

/**
 * Start, change or stop recording on every device (PyTorch's meanings): OFF stops and clears
 * every buffer; STATE keeps the stacks of live blocks and a ring of exactly one trace entry
 * (whichever event came last, as PyTorch's max_entries of 1 there; max_entries is ignored); ALL
 * keeps up to max_entries entries, the oldest overwritten first. Changing max_entries keeps the
 * newest entries. context: NONE records no stacks, STATE stacks on live blocks only, ALLOC also on
 * trace entries, ALL also captures a stack at each free. Stacks come from the frames hook
 * (sp_history_set_frames_hook) and, with c_stacks, from backtrace(3): "symbol+0xoffset" and the
 * object file, line 0 (no debug-info lookup; use addr2line).
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (NULL params, enabled or context out of range;
 *         nothing changes), SP_ERR_SYSTEM (no host memory to resize the buffers).
 */
sp_status_t sp_record_memory_history(const sp_history_params_t *params);

/**
 * Write the whole process's snapshot: a path ending in ".json" gets JSON, any other pickle
 * protocol 4 using only the opcodes MemoryViz.js reads. "%r", "%p" and "%h" in the path become the
 * rank (from the MPI launcher's environment, 0 without one), the pid and the host name, and "%%"
 * one "%" (so a name with a literal "%p" is written "%%p"); any other "%" stays. The file
 * is written to a temporary next to it, synced and renamed, so readers never see half a file; a
 * new file gets the permissions the umask leaves of 0666, a replaced one keeps its read, write
 * and execute bits (not set-user-ID, set-group-ID or sticky). The name is replaced, as by
 * rename(2): another hard link to the old file keeps the old contents.
 * An existing target must be a regular file, or a symbolic link to one (the file it names is
 * replaced, in that file's directory, and the link stays); a FIFO, directory, socket, device node
 * (/dev/null), a link to one of those or a dangling link is refused and left as it is, and so is
 * a regular file this process may not write (mode 0444, another user's), as open(2) refuses it.
 * Each call appends a `snapshot` entry to every device's trace while recording all actions.
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (NULL or empty path, path too long, a target that
 *         is not a regular file), SP_ERR_SYSTEM (a target this process may not write; cannot
 *         create, write or rename the file; out of host memory, at any stage).
 */
sp_status_t sp_dump_snapshot(const char *path);

/**
 * Write one pool's snapshot: its segments only, and each device's trace filtered to the pool's
 * events (plus the snapshot markers), so the trace still replays back to the segments shown.
 * Same path rules as sp_dump_snapshot.
 * @return as sp_dump_snapshot; SP_ERR_INVALID_ARGUMENT also for a NULL or garbage pool handle,
 *         SP_ERR_INVALID_USAGE for one from before sp_shutdown.
 */
sp_status_t sp_mempool_dump_snapshot(const sp_mempool_t *pool, const char *path);

/**
 * One stack frame a binding supplies (e.g. a Python frame). Strings are copied by sympool. They
 * are UTF-8; so that any Python str fits in a C string, 0xC0 0x80 stands for U+0000 and a
 * surrogate's 3-byte form (what Python's 'surrogatepass' writes) for that lone surrogate: a
 * snapshot holds them as that str (pickle as CPython's pickler writes it, JSON as json.dumps
 * escapes it). Other bytes that are not UTF-8 are written as '?'.
 */
typedef struct sp_history_frame {
    const char *name;     /**< function name */
    const char *filename; /**< source file */
    int line;             /**< line number, 0 if unknown; a negative one is written to snapshots
                           * in PyTorch's unsigned 64-bit form (-1: 2^64-1, as PyTorch writes a
                           * line it could not tell) */
} sp_history_frame_t;

/**
 * A binding's frame source: fill at most @p max_frames frames, innermost first, and return how
 * many were written. Called on the allocating (or freeing) thread, before sympool takes its
 * allocator lock, only while recording asks for frames; it must not call into sympool.
 */
typedef size_t (*sp_history_frames_fn)(sp_history_frame_t *frames, size_t max_frames, void *arg);

/**
 * Install (or with NULL remove) the frames hook. Its frames come first in a context, followed
 * by C frames when sp_history_params_t.c_stacks is set. Thread-safe; takes effect for the next
 * capture. A sympool call from inside the hook returns SP_ERR_INVALID_USAGE; frames it counts but
 * did not fill (a return above max_frames is taken as max_frames) read as "??". A hook that
 * returns 0 (with no C frames) gives a stack of no frames, as PyTorch's context gathered on a
 * thread without Python frames: a free recorded so shows no frames, not its allocation's.
 */
void sp_history_set_frames_hook(sp_history_frames_fn fn, void *arg);

/** (sympool addition) sp_history_python_frames' argument. */
typedef struct sp_history_python_frames_arg {
    /** UTF-8 ('surrogatepass'); frames whose file name starts with it are left out (a binding's
     * own frames); NULL or "" leaves none out */
    const char *skip_prefix;
    /** a Python dict (PyObject *, str -> bytes) that keeps the 'surrogatepass' form of names
     * CPython cannot give as UTF-8 (a lone surrogate); NULL: such names read as "??". The
     * library holds a reference on the dict of the argument it last read frames with. */
    void *encoded;
} sp_history_python_frames_arg_t;

/**
 * (sympool addition) A frames hook for sp_history_set_frames_hook that gives the calling thread's
 * CPython frames, innermost first: each code object's co_name and co_filename (UTF-8, lone
 * surrogates in their 'surrogatepass' form) and the frame's f_lineno (-1 when None, which a
 * snapshot holds as 2^64-1, as PyTorch's does). @p arg is an sp_history_python_frames_arg_t *
 * (NULL: no frame left out) that must outlive every call, its fields and its prefix's text
 * unchanged (the library's caches tell arguments apart by their address, their prefix's address and
 * their dict). It takes the GIL for the walk when the caller does not hold it (PyGILState_Ensure),
 * holds collections off during it, and leaves a Python error the caller has pending as it was; it
 * gives no frames on a thread Python never ran, while Python finalizes, or where
 * sp_history_python_frames_supported() is false. The strings stay valid until the allocating call
 * returns (the frames' code objects hold them), which is as long as the library reads them.
 */
size_t sp_history_python_frames(sp_history_frame_t *frames, size_t max_frames, void *arg);

/**
 * (sympool addition) Whether sp_history_python_frames can read frames in this process: a CPython
 * 3.9 or later whose C API is among the process's global symbols (a python executable, or a
 * libpython loaded RTLD_GLOBAL). The library does not link against Python; it looks the
 * functions up once. Thread-safe.
 */
bool sp_history_python_frames_supported(void);

/**
 * (PyTorch's _set_memory_metadata / setUserMetadata) The text every later trace entry of
 * @p device carries as its "user_metadata" ("" or NULL: none, the default). It outlives
 * recording being turned off and on; sp_shutdown resets it. Thread-safe.
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (no such device; text over 1 MiB),
 *         SP_ERR_SYSTEM (out of host memory).
 */
sp_status_t sp_history_set_user_metadata(int device, const char *metadata);

/**
 * (PyTorch's _get_memory_metadata) Copy @p device's current metadata text into @p buf (at most
 * @p len bytes, always terminated when len > 0) and its length into *len_p (may be NULL), so a
 * caller can ask again with more room. Thread-safe.
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (no such device; buf NULL with len > 0).
 */
sp_status_t sp_history_get_user_metadata(int device, char *buf, size_t len, size_t *len_p);

/**
 * (PyTorch's recordAnnotation, which torch.profiler.record_function's user scopes call at their
 * start and end while history is recorded) Record one external annotation: @p stage ("START",
 * "END" or any text) and @p name (the scope's) for @p device, stamped with history's clock (or
 * the time sp_x_history_stamp set). Snapshots list them, oldest first, in "external_annotations",
 * each a dict {"stage": str, "name": str, "device": int, "time_us": int} in that key order (the
 * order PyTorch's own snapshots show). As PyTorch's, annotations are kept only while recording
 * (STATE or ALL; OFF records nothing and returns SP_SUCCESS), in one buffer for all devices that
 * holds max_entries of them (STATE: 1; 0: unbounded; the oldest overwritten first), and every
 * sp_record_memory_history call (on, off, clear_history or a new max_entries) clears them.
 * skip_actions does not apply to them. Both texts are UTF-8 as in sp_history_frame_t (0xC0 0x80
 * for U+0000). Thread-safe.
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT (no such device; stage or name NULL or over 1 MiB;
 *         nothing recorded), SP_ERR_SYSTEM (out of host memory; nothing recorded).
 */
sp_status_t sp_history_record_annotation(int device, const char *stage, const char *name);

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_HISTORY_H */
