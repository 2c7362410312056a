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

/* True in a fork child whose allocator is off: forked from a process whose allocator ran on the
 * cuda backend (the inherited CUDA state cannot be used there), or while another thread was
 * inside a pool's segment allocator (its device was caught mid-update). Every call fails with
 * SP_ERR_DEVICE saying which (sp__fork_error). */
bool sp__fork_child_off(void);
/* The SP_ERR_DEVICE failure of such a child, naming `what`. */
sp_status_t sp__fork_error(const char *what);

#endif /* SP_POOL_FORK_H */
