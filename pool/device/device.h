/*
 * device.h: the device backend contract. The caching allocator talks to a device only through
 * this ops table; `host` (host.c, an emulated device on host memory) and `cuda` (cuda.c)
 * implement it.
 *
 * Preconditions, stated once for every op: the backend was initialized by sp__device_select();
 * `device` is in [0, caps.device_count); output pointers are non-NULL; sizes are > 0.
 * Every op returns an sp_status_t and writes its outputs (last, *_p) only on success. An op that
 * fails has already called sp__error() with the backend's own error text (CUDA's string, errno),
 * except mem_alloc's out-of-memory, which it reports with sp__error_quiet (the allocator retries
 * and reports the final OOM itself).
 *
 * Thread safety: every op may be called from any thread concurrently.
 *
 * Laziness: init and mem_total must not set a device up (no CUDA context); a device is set up by
 * the first op that works on it. stream_sync(device, NULL) on a device the process never used
 * returns at once without setting it up.
 */
#ifndef SP_DEVICE_H
#define SP_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sp_device_caps {
    int device_count;       /* devices this backend exposes */
    size_t granularity;     /* allocation granularity in bytes (host: page size; cuda: 512) */
    bool has_vmm;           /* vmm_* ops available (host: always; cuda: VMM-capable devices) */
    size_t vmm_granularity; /* vmm_map page size must be a multiple of this (host: page size;
                             * cuda: cuMemGetAllocationGranularity, minimum) */
    bool is_emulated;       /* true for host */
} sp_device_caps_t;

/* Opaque stream and event handles of the backend. NULL stream = the device's default stream. */
typedef void *sp_dev_stream_t;
typedef void *sp_dev_event_t;

typedef struct sp_device_ops {
    const char *name; /* "host" or "cuda" */

    /* Start the backend; fills caps. Called once. */
    sp_status_t (*init)(sp_device_caps_t *caps_p);
    /* Release everything the backend holds (streams, events, pools of events). */
    void (*fini)(void);

    /* Allocate `size` bytes of device memory. Out of memory: SP_ERR_OUT_OF_MEMORY (quiet).
     * host: exactly at capacity; SYMPOOL_HOST_FAIL_AFTER=N makes the Nth call fail with OOM. */
    sp_status_t (*mem_alloc)(int device, size_t size, void **ptr_p);
    /* Free memory from mem_alloc, with the size it was allocated with. */
    sp_status_t (*mem_free)(int device, void *ptr, size_t size);
    /* Free and total bytes of the device (host: capacity minus what mem_alloc handed out). */
    sp_status_t (*mem_get_info)(int device, size_t *free_p, size_t *total_p);
    /* Total bytes of the device without setting it up (cuda: cuDeviceTotalMem, no context;
     * host: the capacity). What the allocator reads at init for every device. */
    sp_status_t (*mem_total)(int device, size_t *total_p);

    sp_status_t (*stream_create)(int device, sp_dev_stream_t *stream_p);
    sp_status_t (*stream_destroy)(int device, sp_dev_stream_t stream);
    /* Wait for everything queued on the stream. host: completes the stream's recorded events. */
    sp_status_t (*stream_sync)(int device, sp_dev_stream_t stream);
    /* Whether the stream is capturing a CUDA graph (host: never). NULL stream: the legacy default
     * stream, which counts as capturing while another blocking stream captures. */
    sp_status_t (*stream_capturing)(int device, sp_dev_stream_t stream, bool *capturing_p);
    /* Which device a stream belongs to (host: recorded at creation); SP_ERR_INVALID_ARGUMENT for
     * a handle the backend did not make (or one destroyed; cuda: a destroyed handle must not be
     * asked at all, see stream_destroyed), SP_ERR_DEVICE when the device
     * cannot answer (cuda: out of memory, a sticky error): callers keep that status rather than
     * call the stream bad. NULL (default stream) is not asked. */
    sp_status_t (*stream_device)(sp_dev_stream_t stream, int *device_p);
    /* Whether `stream` is a handle stream_destroy destroyed and no stream_create has returned
     * since: cuda: asking CUDA about it is undefined behaviour ("Use of the handle after this
     * call is undefined behavior", cudaStreamDestroy), so a caller that may hold such a handle
     * asks this first. A handle the application destroyed itself is not known. Optional (host:
     * NULL, its stream_device refuses a destroyed handle itself). */
    bool (*stream_destroyed)(sp_dev_stream_t stream);
    /* Whether a CUDA graph capture is under way on the device as far as the backend can tell
     * (cuda: the legacy stream counts as capturing, or a stream stream_create made captures).
     * Optional (host: NULL, nothing captures); NULL means ask stream_capturing about NULL. */
    sp_status_t (*device_capturing)(int device, bool *capturing_p);
    /* Wait for everything queued on every stream of the device (cudaDeviceSynchronize; host:
     * completes every stream's recorded events). */
    sp_status_t (*device_sync)(int device);

    /* Events: created without timing (cuda: cudaEventDisableTiming), pooled by the backend. */
    sp_status_t (*event_create)(int device, sp_dev_event_t *event_p);
    sp_status_t (*event_destroy)(int device, sp_dev_event_t event);
    /* SP_ERR_NOT_SUPPORTED (quiet) when the stream is capturing a CUDA graph: the allocator then
     * defers the record until the capture ended. */
    sp_status_t (*event_record)(int device, sp_dev_event_t event, sp_dev_stream_t stream);
    /* *done_p = true once the work before the record point has completed.
     * host: an event completes when its stream is synchronized after the record. */
    sp_status_t (*event_query)(int device, sp_dev_event_t event, bool *done_p);
    sp_status_t (*event_sync)(int device, sp_dev_event_t event);

    /* Copy bytes between device (or host) pointers, ordered on the stream (host: immediate).
     * Used by collectives and tests; NULL on backends that cannot. */
    sp_status_t (*memcpy_async)(int device, void *dst, const void *src, size_t bytes,
                                sp_dev_stream_t stream);

    /* fork(): take every lock the backend has (fork_lock) and release them again (fork_unlock,
     * in the parent and in the child), so that a child inherits the backend's state whole and its
     * locks free. Optional: NULL when the backend is never used in a child (cuda: a child of a
     * process that initialized CUDA cannot use it, so pool/fork.c turns the allocator off there).
     */
    void (*fork_lock)(void);
    void (*fork_unlock)(void);

    /* Virtual memory (expandable segments), when caps.has_vmm; NULL otherwise.
     * A reservation is a range of address space with no memory behind it, managed in pages of
     * `page` bytes (a multiple of caps.vmm_granularity; `size` a multiple of `page`). Pages are
     * mapped (physical memory created and made read-write for `device`) and unmapped in
     * page-aligned ranges inside it. Only mapped bytes count as device memory: host: against
     * SYMPOOL_HOST_CAPACITY and mem_get_info, and each vmm_map is one device allocation for
     * SYMPOOL_HOST_FAIL_AFTER.
     * vmm_reserve: out of address space -> SP_ERR_OUT_OF_MEMORY (quiet).
     * vmm_map: all or nothing: every page of [addr, addr+size) must be unmapped before; out of
     *   memory -> SP_ERR_OUT_OF_MEMORY (quiet) and nothing is mapped.
     * vmm_unmap: every page of the range must be mapped; the caller has synchronized the work
     *   that used it (unmapping does not wait, as cuMemUnmap does not). All or nothing: on
     *   SP_SUCCESS every page is unmapped, on an error every page is still mapped (the caller
     *   keeps the range cached), except an SP_ERR_DEVICE whose text says part of the range is
     *   lost (cuda: an unmap refused midway that could neither be undone nor finished).
     * vmm_release: frees the reservation; pages still mapped are unmapped first. A page the
     *   driver refuses to unmap (cuda) stays mapped with its handle, the reservation is kept
     *   (no longer usable), the error is returned, and a later vmm call or fini finishes the
     *   release. */
    sp_status_t (*vmm_reserve)(int device, size_t size, size_t page, void **base_p);
    sp_status_t (*vmm_map)(int device, void *addr, size_t size);
    sp_status_t (*vmm_unmap)(int device, void *addr, size_t size);
    sp_status_t (*vmm_release)(int device, void *base, size_t size);
} sp_device_ops_t;

/* The backend in use, selected on first call from SYMPOOL_DEVICE (auto|cuda|host): auto picks
 * cuda when a GPU answers (cudaGetDeviceCount succeeds with > 0), else host. On failure returns
 * the status and leaves *ops_p untouched. Thread-safe (once). */
sp_status_t sp__device_select(const sp_device_ops_t **ops_p, sp_device_caps_t *caps_p);

/* Forget the selection and call fini (sp_shutdown, tests). */
void sp__device_reset(void);

/* fork() (pool/fork.c): hold the selection lock and the selected backend's locks across fork(),
 * and release them in the parent and the child. */
void sp__device_fork_lock(void);
void sp__device_fork_unlock(void);

/* The two implementations. sp__device_cuda_ops is NULL-equivalent when built without CUDA:
 * sp__device_cuda_available() tells whether this build has it and a GPU answers. */
extern const sp_device_ops_t sp__device_host_ops;
const sp_device_ops_t *sp__device_cuda_ops(void); /* NULL when built without CUDA */
bool sp__device_cuda_available(void);
/* Why the probe behind sp__device_cuda_available failed ("" when it did not or never ran). */
const char *sp__device_cuda_probe_error(void);
/* Tests: the file whose existence means "an NVIDIA driver is loaded" for auto's fallback WARN
 * (NULL: the real one); also re-arms the once-per-process WARN. */
void sp__device_set_driver_marker(const char *path);

/* host backend inspection for tests and replay: live mem_alloc count and bytes per device. */
size_t sp__host_live_allocations(int device);
size_t sp__host_live_bytes(int device);
/* sp_x_host_place's work on the host backend (api.c checks the backend). */
sp_status_t sp__host_place(int device, size_t size, uint64_t offset);

#ifdef __cplusplus
}
#endif

#endif /* SP_DEVICE_H */
