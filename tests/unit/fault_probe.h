/* fault_probe.h: see fault_probe.c. */
#ifndef SP_FAULT_PROBE_H
#define SP_FAULT_PROBE_H
#ifdef __cplusplus
extern "C" {
#endif
/* The functions the probe can make fail, one bit each. */
enum {
    FP_MALLOC = 1u << 0,
    FP_CALLOC = 1u << 1,
    FP_REALLOC = 1u << 2,
    FP_STRDUP = 1u << 3,
    FP_ALIGNED_ALLOC = 1u << 4,
    FP_MMAP = 1u << 5,
    FP_MPROTECT = 1u << 6,
    FP_OPEN = 1u << 7,
    FP_WRITE = 1u << 8,
    FP_RENAME = 1u << 9,
    FP_FSYNC = 1u << 10,
    FP_PTHREAD_KEY = 1u << 11, /* pthread_key_create: EAGAIN (PTHREAD_KEYS_MAX reached) */
    FP_HEAP = FP_MALLOC | FP_CALLOC | FP_REALLOC | FP_STRDUP | FP_ALIGNED_ALLOC,
    FP_ALL = (1u << 12) - 1
};
/* From now on, count the calls to the functions in `mask` (all threads) and make the nth of them
 * (n >= 1) fail with errno `err` (0: the function's usual one, ENOMEM or EIO); only that one. */
void fp_arm(unsigned mask, long nth, int err);
/* Stops counting; returns how many calls were counted since fp_arm. */
long fp_disarm(void);
/* 1 if the armed failure was delivered. */
int fp_fired(void);
/* The name of the function whose call failed ("" if none yet). */
const char *fp_fired_name(void);
/* Heap blocks handed out through the probe's wrappers and not yet given back to free. */
long fp_live_blocks(void);
/* Bytes mapped through the probe's mmap (not MAP_FIXED) and not yet given back to munmap. */
long long fp_mapped_bytes(void);
#ifdef __cplusplus
}
#endif
#endif
