/*
 * dbl.h: what the three CUDA/NCCL test doubles share. Never installed; a test tool only.
 *
 * libcuda.so.1 (driver.c) owns the machine model: the devices (CUDA_DOUBLE_GPUS, each of
 * CUDA_DOUBLE_MEMORY bytes), their primary contexts, device memory (cudaMalloc's and VMM's),
 * sticky errors and injected failures. libcudart.so.13 (runtime.c) owns what is per thread
 * (current device, last error, capture mode) and streams, events and capture. libnccl.so.2
 * (nccl.c) uses both. The dbl_* functions below are their private interface (exported under
 * the version node CUDA_DOUBLE_PRIVATE, or unversioned from libcuda.so.1); the cuda_double_*
 * functions are the test hooks a test reaches with dlsym(RTLD_DEFAULT, ...).
 */
#ifndef CUDA_DOUBLE_DBL_H
#define CUDA_DOUBLE_DBL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DBL_EXPORT __attribute__((visibility("default")))

/* Devices. */
int dbl_device_count(void);
/* The machine's device behind this process's device `dev` (CUDA_VISIBLE_DEVICES), -1 if none. */
int dbl_physical(int dev);
/* Whether two distinct physical devices reach each other by CUDA P2P (CUDA_DOUBLE_NO_P2P). */
bool dbl_p2p(int phys_a, int phys_b);
size_t dbl_device_memory(void);
size_t dbl_granularity(void);

/* "cuda-double: <fn>: <code name> (<code>): <message>" on stderr: every failure says itself. */
void dbl_say(const char *fn, const char *code_name, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Primary contexts: made only by the calls that make one, counted. */
bool dbl_ctx_active(int dev);
void dbl_ctx_make(int dev);
/* The sticky error of `dev`'s context (a cudaError_t), 0 when none. */
int dbl_sticky(int dev);
void dbl_set_sticky(int dev, int err);

/* A failure injected by cuda_double_inject for the call `fn`, or 0. */
int dbl_inject_take(const char *fn);

/* Device memory. dbl_mem_alloc: 0, or 2 (out of memory). dbl_mem_free: 0, or -1 when `p` is
 * not the start of a live cudaMalloc allocation; *dev_p gets its device. */
int dbl_mem_alloc(int dev, size_t size, void **p);
int dbl_mem_free(void *p, int *dev_p);
size_t dbl_mem_used(int dev);
/* Which device `p` belongs to, -1 when it is not device memory. */
int dbl_mem_device(const void *p);
/* The double's own access to device memory: 0 on success; else a cudaError_t: 1
 * (cudaErrorInvalidValue) when a range is not all device memory known here, 700
 * (cudaErrorIllegalAddress) when a VMM mapping was never given access. Host pointers pass
 * through as host memory. */
int dbl_copy(void *dst, const void *src, size_t n);
int dbl_set(void *dst, int value, size_t n);
/* A writable host view of [p, p+n) of device memory (one mapping, access granted), or NULL. */
void *dbl_view(const void *p, size_t n);
/* The VMM allocation under `p`: its base and size (as cuMemGetAddressRange), 0 on success. */
int dbl_vmm_range(const void *p, uintptr_t *base_p, size_t *size_p, int *dev_p);

/* Streams (runtime.c): validate a stream handle (NULL, cudaStreamLegacy, cudaStreamPerThread
 * or a live stream); 0 or a cudaError_t. The pseudo-streams name device `dev`'s stream, or the
 * current device's when dev < 0. *dev_p: its device; *capturing_p: it is capturing. */
int dbl_rt_stream(void *stream, int dev, int *dev_p, bool *capturing_p);

/* Test hooks (exported, unversioned, from libcuda.so.1). */
int cuda_double_primary_contexts(int dev); /* contexts made on dev so far */
int cuda_double_contexts_total(void);      /* over all devices */
void cuda_double_make_sticky(int dev, int err);
void cuda_double_inject(const char *fn, int code, int skip);
size_t cuda_double_memory_used(int dev);
int cuda_double_live_vmm_handles(void);
int cuda_double_device_of(const void *p); /* -1: not device memory */
/* From libcudart.so.13 (runtime.c): live streams of dev made by cudaStreamCreate*. */
int cuda_double_live_streams(int dev);
/* From libnccl.so.2 (nccl.c): collectives of this process that NCCL 2.28.9 would have run as
 * symmetric kernels. */
long cuda_double_nccl_symmetric_kernels(void);

#endif
