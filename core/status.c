/*
 * status.c: names and one-line meanings of every sp_status_t, from one list, and the thread's
 * last-error text. The function that first sees a failure fills the text through sp__error()
 * (config.c: it sets the text here and logs it); callers only propagate the code. Calls nothing
 * above it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

/* The one list: code, meaning. The meanings say what to do next where there is something to do. */
#define SP_STATUS_MAP(X)                                                                           \
    X(SP_SUCCESS, "success")                                                                       \
    X(SP_ERR_INVALID_ARGUMENT, "invalid argument: a size, pointer, flag or name is not valid")     \
    X(SP_ERR_INVALID_USAGE,                                                                        \
      "invalid usage: pointer not from sympool, double free, or call in the wrong state")          \
    X(SP_ERR_OUT_OF_MEMORY,                                                                        \
      "out of device memory after freeing the cache and retrying; see sp_last_error() for "        \
      "the figures")                                                                               \
    X(SP_ERR_BUSY, "busy: blocks are still allocated; free them first")                            \
    X(SP_ERR_DEVICE, "device (CUDA) failure; set SYMPOOL_DEBUG=INFO for details")                  \
    X(SP_ERR_NCCL, "NCCL failure; set NCCL_DEBUG=WARN and SYMPOOL_DEBUG=INFO for details")         \
    X(SP_ERR_MPI, "MPI failure")                                                                   \
    X(SP_ERR_MISMATCH, "ranks disagree in a collective call (size or call order)")                 \
    X(SP_ERR_TIMEOUT,                                                                              \
      "a collective call did not complete within its deadline (SYMPOOL_SYM_TIMEOUT)")              \
    X(SP_ERR_NOT_SUPPORTED, "not supported in this build or on this backend")                      \
    X(SP_ERR_SYSTEM, "a host allocation or system call failed")                                    \
    X(SP_ERR_INTERNAL, "internal error in sympool: please report it with SYMPOOL_DEBUG=TRACE")

#define SP_STATUS_NAME(code, text) [code] = #code,
#define SP_STATUS_TEXT(code, text) [code] = text,
static const char *const status_names[SP_NUM_STATUS] = {SP_STATUS_MAP(SP_STATUS_NAME)};
static const char *const status_texts[SP_NUM_STATUS] = {SP_STATUS_MAP(SP_STATUS_TEXT)};

SP_EXPORT const char *sp_status_name(sp_status_t s) {
    if ((unsigned)s >= SP_NUM_STATUS || status_names[s] == NULL)
        return "SP_ERR_UNKNOWN";
    return status_names[s];
}

SP_EXPORT const char *sp_status_string(sp_status_t s) {
    if ((unsigned)s >= SP_NUM_STATUS || status_texts[s] == NULL)
        return "unknown status code";
    return status_texts[s];
}

/* ---- last error ------------------------------------------------------------------------- */

static _Thread_local char last_error[SP_ERROR_TEXT_MAX];

SP_EXPORT const char *sp_last_error(void) {
    return last_error;
}

void sp__error_clear(void) {
    last_error[0] = '\0';
}

void sp__error_vset(const char *fmt, va_list ap) {
    /* Formatted aside first: a message often quotes the previous one (sp_last_error() as an
     * argument), and vsnprintf into the buffer it reads from is undefined (it garbled them). */
    char text[SP_ERROR_TEXT_MAX];
    vsnprintf(text, sizeof text, fmt, ap);
    memcpy(last_error, text, sizeof text);
}

int sp__callback_threads;
__thread int sp__callback_depth;
int sp__fast_off = SP_FAST_NOT_READY;

void sp__callback_enter(void) {
    if (sp__callback_depth++ == 0) {
        __atomic_fetch_add(&sp__callback_threads, 1, __ATOMIC_RELAXED);
        sp__fast_off_add(SP_FAST_REASON);
    }
}

void sp__callback_leave(void) {
    if (--sp__callback_depth == 0) {
        __atomic_fetch_sub(&sp__callback_threads, 1, __ATOMIC_RELAXED);
        sp__fast_off_add(-SP_FAST_REASON);
    }
}

sp_status_t sp__callback_refused(const char *fn) {
    return sp__error(SP_ERR_INVALID_USAGE, SP_SUB_POOL,
                     "%s: called from inside a callback sympool is running (a MemPool's segment "
                     "allocator, the history frames hook or a log function), which may hold an "
                     "allocator lock; nothing was done",
                     fn);
}

/* The log function runs after sp__error_at set this thread's message: a sympool call it makes
 * (refused) would replace the message its caller is about to read. */
void sp__error_swap_out(char *saved) {
    memcpy(saved, last_error, sizeof last_error);
}

void sp__error_swap_in(const char *saved) {
    memcpy(last_error, saved, sizeof last_error);
}
