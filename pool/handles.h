/*
 * handles.h: private to pool/: the registry of MemPool handles (handles.c), so that a handle is
 * checked before it is read: one sympool never gave out is recognized without touching it, and
 * one from an earlier session (before sp_shutdown) is recognized by its generation.
 */
#ifndef SP_POOL_HANDLES_H
#define SP_POOL_HANDLES_H

#include <stdbool.h>
#include <stdint.h>

/* Record a new pool struct. The struct must then never be freed (it may be retired), so that its
 * address can never name another pool. False when out of host memory (nothing recorded). */
bool sp__handles_add(const void *pool);
/* Was this address ever given out as a pool handle? Lock-free; never reads *pool. */
bool sp__handles_known(const void *pool);
/* The current generation: pools carry the one they were made in; sp_shutdown starts the next. */
uint64_t sp__handles_generation(void);
void sp__handles_next_generation(void);
/* fork() (pool/fork.c): hold the registry's lock across fork(). */
void sp__handles_fork_lock(void);
void sp__handles_fork_unlock(void);

#endif /* SP_POOL_HANDLES_H */
