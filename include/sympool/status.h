/**
 * @file status.h
 * @brief Status codes returned by every fallible sympool call, and the per-thread detail text.
 *
 * Every function that can fail returns an sp_status_t. On failure it also leaves a one-line
 * explanation in a thread-local buffer that sp_last_error() returns; success does not clear it.
 */
#ifndef SYMPOOL_STATUS_H
#define SYMPOOL_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/** Result of a sympool call. Codes are stable: new ones are appended before SP_NUM_STATUS. */
typedef enum sp_status {
    SP_SUCCESS = 0,
    SP_ERR_INVALID_ARGUMENT, /**< bad size, pointer, flag, or name */
    SP_ERR_INVALID_USAGE,    /**< pointer not from sympool, double free, wrong state */
    SP_ERR_OUT_OF_MEMORY,    /**< device exhausted after freeing the cache and retrying */
    SP_ERR_BUSY,             /**< destroy/shutdown while blocks are still live */
    SP_ERR_DEVICE,           /**< CUDA runtime or driver failure */
    SP_ERR_NCCL,             /**< NCCL call failure */
    SP_ERR_MPI,              /**< MPI call failure */
    SP_ERR_MISMATCH,         /**< ranks disagree in a collective call (size, order) */
    SP_ERR_TIMEOUT,          /**< a collective did not complete within its deadline */
    SP_ERR_NOT_SUPPORTED,    /**< not available in this build or on this backend */
    SP_ERR_SYSTEM,           /**< host allocation or system call failed */
    SP_ERR_INTERNAL,         /**< a sympool bug: please report it */
    SP_NUM_STATUS            /* append new codes above this line, never renumber */
} sp_status_t;

/** The code's name, e.g. "SP_ERR_OUT_OF_MEMORY". Constant, never NULL ("SP_ERR_UNKNOWN" if out of
 * range). */
const char *sp_status_name(sp_status_t s);

/** A one-line meaning of the code. Constant, never NULL. */
const char *sp_status_string(sp_status_t s);

/** This thread's detail text for its last failure, "" if there was none. Valid until the next
 * sympool call. */
const char *sp_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_STATUS_H */
