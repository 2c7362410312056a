/*
 * fork.h: private to pool/: fork() safety (fork.c).
 */
#ifndef SP_POOL_FORK_H
#define SP_POOL_FORK_H

#include <stdbool.h>

#include "sympool/status.h"

/* Register sympool's pthread_atfork handlers (once per process). Call it with no sympool lock
 * held: fork() runs the prepare handler under the C library's atfork lock, which registering
 * also takes. */
void sp__fork_register(void);

/* True in a child forked from a process whose allocator ran on the cuda backend: the inherited
 * CUDA state cannot be used there, so every call fails with SP_ERR_DEVICE (sp__fork_error). */
bool sp__fork_cuda_child(void);
/* The SP_ERR_DEVICE failure of such a child, naming `what`. */
sp_status_t sp__fork_error(const char *what);

#endif /* SP_POOL_FORK_H */
