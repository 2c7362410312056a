/*
 * fork.c: what a child process inherits when its parent calls fork() while other threads are
 * inside sympool.
 *
 * fork() copies only the calling thread; a lock another thread held at that moment stays held in
 * the child forever, and the structure it guarded may be half updated. So the prepare handler
 * takes every lock sympool has, in the global lock order, and waits for the threads inside to
 * leave: sp_shutdown's lock (so no shutdown is under way; the child keeps only its own thread's
 * calls counted in at the shutdown gate), sp__g.init_lock, the device allocator locks (device
 * order), the thread caches' registry and locks, the backend selection and the backend's own locks,
 * the history lock, the pool-handle registry lock, the PyTorch segment registry's lock, then core's
 * option and log locks (leaves). The parent handler and the child handler release them in reverse
 * order, so the child starts with a consistent allocator and every lock free.
 *
 * Host backend: its memory is private anonymous mappings, copied into the child, so the child's
 * allocator is fully usable (its blocks are the parent's, copy-on-write). cuda backend: a CUDA
 * context does not survive fork(), so the child's allocator is turned off: every call that would
 * initialize or use it fails with SP_ERR_DEVICE and a message saying why (a clear error, never a
 * hang); blocks inherited from the parent are not freed (their memory belongs to the parent).
 *
 * MemPool routings (sp_mempool_begin) belong to threads: the child keeps its own thread's and
 * drops the others' from the pools' use counts (sp__mempool_fork_child), since no exit of those
 * threads will ever end them there.
 *
 * A thread inside a pool's segment allocator (user code, run under its device's lock) may wait
 * for something the forking thread holds across fork(): a Python allocator waits for the GIL,
 * which os.fork() keeps. Waiting for that device's lock hung the parent for good, so prepare
 * takes the device locks with sp__lock_unless and leaves a lock whose holder is inside such a
 * callback (sp_devalloc_t.in_user_cb) to it: the parent goes on, and the child, whose device was
 * caught mid-update, has its allocator turned off as for a cuda parent, with its own reason.
 * A callback run while its thread holds a lock taken before the device locks (sp_shutdown's
 * release, under init_lock) still makes prepare wait.
 *
 * Thread that forks from inside a sympool callback (a frames hook, a pluggable allocator) while
 * it holds a sympool lock would wait on itself in prepare: that is not supported.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "core/core.h"
#include "pool/allocator.h"
#include "pool/fork.h"
#include "pool/handles.h"
#include "pool/history.h"
#include "pool/mempool.h"
#include "pool/thread_cache.h"
#include "pool/torch.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_locked_devs;      /* device locks prepare took or left (init_lock held while set) */
static bool g_left;            /* prepare left a device lock to its holder (init_lock) */
static atomic_int g_child_off; /* why this fork child's allocator is off: 0 it is not */
enum { OFF_CUDA = 1, OFF_CALLBACK = 2 };

static void prepare(void) {
    sp__gate_fork_lock(); /* before init_lock, as sp_shutdown takes them */
    pthread_mutex_lock(&sp__g.init_lock);
    /* Under init_lock sp__ready and sp__g.devs cannot change. */
    g_locked_devs = atomic_load_explicit(&sp__ready, memory_order_acquire) ? sp__g.ndev : 0;
    g_left = false;
    for (int i = 0; i < g_locked_devs; i++) {
        sp_devalloc_t *d = &sp__g.devs[i];
        d->fork_left = !sp__lock_unless(&d->lock, &d->in_user_cb);
        g_left = g_left || d->fork_left;
    }
    sp__tc_fork_lock();
    sp__device_fork_lock();
    sp__history_fork_lock();
    sp__handles_fork_lock();
    sp__torch_fork_lock();
    sp__options_fork_lock();
    sp__log_fork_lock();
}

static void release(bool in_child) {
    sp__log_fork_unlock();
    sp__options_fork_unlock();
    sp__torch_fork_unlock();
    sp__handles_fork_unlock();
    sp__history_fork_unlock();
    sp__device_fork_unlock();
    sp__tc_fork_unlock(in_child);
    for (int i = g_locked_devs - 1; i >= 0; i--) {
        if (sp__g.devs[i].fork_left)
            continue; /* its holder's (in the child: held for good, the allocator off) */
        if (in_child)
            sp__lock_fork_child(&sp__g.devs[i].lock);
        sp__unlock(&sp__g.devs[i].lock);
    }
}

static void parent(void) {
    release(false);
    pthread_mutex_unlock(&sp__g.init_lock);
    sp__gate_fork_unlock(false);
}

static void child(void) {
    bool cuda = g_locked_devs > 0 && sp__g.ops != NULL && !sp__g.caps.is_emulated;
    if (g_locked_devs > 0 && !cuda && !g_left)
        sp__mempool_fork_child(); /* under the device locks prepare took */
    release(true);
    if (cuda || g_left) {
        /* Every entry point now goes to sp__alloc_init_slow (or checks sp__ready) and fails
         * there with the reason; nothing inherited is touched. */
        atomic_store(&g_child_off, cuda ? OFF_CUDA : OFF_CALLBACK);
        atomic_store_explicit(&sp__ready, 0, memory_order_release);
        sp__fast_off_add(SP_FAST_NOT_READY);
    }
    pthread_mutex_unlock(&sp__g.init_lock);
    sp__gate_fork_unlock(true);
}

static void do_register(void) {
    int rc = pthread_atfork(prepare, parent, child);
    if (rc != 0)
        SP_WARN(SP_SUB_INIT,
                "pthread_atfork failed (%d): a process forked while other threads use sympool "
                "may hang in the child",
                rc);
}

void sp__fork_register(void) {
    pthread_once(&g_once, do_register);
}

/* At load, before any sympool lock can be taken: a process may fork while another thread holds
 * the log lock on an error path long before (or without ever) initializing the allocator, and
 * registering only at allocator or history init left those children hanging on it. (A static
 * link keeps this object: api.c, which every entry point reaches, references it.) */
__attribute__((constructor)) static void register_at_load(void) {
    sp__fork_register();
}

bool sp__fork_child_off(void) {
    return atomic_load_explicit(&g_child_off, memory_order_relaxed) != 0;
}

sp_status_t sp__fork_error(const char *what) {
    if (atomic_load_explicit(&g_child_off, memory_order_relaxed) == OFF_CALLBACK)
        return sp__error(SP_ERR_DEVICE, SP_SUB_INIT,
                         "%s: this process was forked while another thread was inside a pool's "
                         "segment allocator, which holds its device's allocator mid-update (and "
                         "may wait for what the forking thread held, as a Python allocator waits "
                         "for the GIL), so sympool is unusable here (fork while no thread is in "
                         "a segment allocator, or start the process with spawn/exec)",
                         what);
    return sp__error(SP_ERR_DEVICE, SP_SUB_INIT,
                     "%s: this process was forked from one whose sympool used CUDA; a CUDA "
                     "context does not survive fork(), so sympool is unusable here (start the "
                     "process with spawn/exec instead of fork, or fork before using the GPU)",
                     what);
}
