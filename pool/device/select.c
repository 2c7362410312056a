/*
 * select.c: chooses the device backend once per process (until sp__device_reset) from
 * SYMPOOL_DEVICE = auto | cuda | host, initializes it and hands out its ops table and caps.
 *
 * auto picks cuda when this build has CUDA and a GPU answers (sp__device_cuda_available), else
 * host; on a machine whose driver is too old that probe fails, which is the normal case and is
 * logged at INFO only. An explicit `cuda` that cannot be had is an error with a clear message:
 * SP_ERR_NOT_SUPPORTED when the build has no CUDA, SP_ERR_DEVICE with CUDA's own text otherwise.
 *
 * Lock: g_sel.mu guards the selection. A failed selection is not remembered, so a later call
 * (for instance after the environment was fixed) tries again. sp__device_reset calls the
 * backend's fini and forgets; the next select re-reads the options.
 */
#include <pthread.h>
#include <string.h>

#include "core/core.h"
#include "pool/device/device.h"

static struct {
    pthread_mutex_t mu;         /* guards the fields below */
    const sp_device_ops_t *ops; /* selected and initialized backend, NULL if none; mu */
    sp_device_caps_t caps;      /* its capabilities; mu */
} g_sel = {PTHREAD_MUTEX_INITIALIZER, NULL, {0}};

/* Initialize `ops`; on success record it as the selection. Caller holds g_sel.mu. */
static sp_status_t start(const sp_device_ops_t *ops, const char *why) {
    sp_device_caps_t caps;
    memset(&caps, 0, sizeof(caps));
    SP_CHECK(ops->init(&caps));
    g_sel.ops = ops;
    g_sel.caps = caps;
    SP_INFO(SP_SUB_INIT, "device backend %s (%s): %d device(s), granularity %zu, vmm %s", ops->name,
            why, caps.device_count, caps.granularity, caps.has_vmm ? "yes" : "no");
    return SP_SUCCESS;
}

static sp_status_t choose(void) {
    sp__options_ensure();
    const char *want = sp__option_string(SP_OPT_DEVICE);
    if (strcmp(want, "host") == 0)
        return start(&sp__device_host_ops, "SYMPOOL_DEVICE=host");
    if (strcmp(want, "cuda") == 0) {
        const sp_device_ops_t *cuda = sp__device_cuda_ops();
        if (!cuda) {
            /* Warned once per process; later calls fail the same way at INFO. */
            static bool warned; /* (g_sel.mu) */
            sp_status_t (*report)(sp_status_t, unsigned, const char *, int, const char *, ...) =
                warned ? sp__error_quiet_at : sp__error_at;
            warned = true;
            return report(SP_ERR_NOT_SUPPORTED, SP_SUB_INIT, __FILE__, __LINE__,
                          "SYMPOOL_DEVICE=cuda, but this sympool was built without CUDA; "
                          "rebuild with the CUDA toolkit or use SYMPOOL_DEVICE=host");
        }
        /* cuda's init reports the CUDA error (e.g. an insufficient driver) itself. */
        return start(cuda, "SYMPOOL_DEVICE=cuda");
    }
    if (sp__device_cuda_available())
        return start(sp__device_cuda_ops(), "SYMPOOL_DEVICE=auto, a GPU answered");
    return start(&sp__device_host_ops, "SYMPOOL_DEVICE=auto, no usable GPU");
}

sp_status_t sp__device_select(const sp_device_ops_t **ops_p, sp_device_caps_t *caps_p) {
    sp_status_t res = SP_SUCCESS;
    pthread_mutex_lock(&g_sel.mu);
    if (!g_sel.ops)
        res = choose();
    const sp_device_ops_t *ops = g_sel.ops;
    sp_device_caps_t caps = g_sel.caps;
    pthread_mutex_unlock(&g_sel.mu);
    if (res != SP_SUCCESS)
        return res;
    *ops_p = ops;
    if (caps_p)
        *caps_p = caps;
    return SP_SUCCESS;
}

void sp__device_reset(void) {
    pthread_mutex_lock(&g_sel.mu);
    if (g_sel.ops) {
        SP_INFO(SP_SUB_INIT, "device backend %s released", g_sel.ops->name);
        g_sel.ops->fini();
        g_sel.ops = NULL;
        memset(&g_sel.caps, 0, sizeof(g_sel.caps));
    }
    pthread_mutex_unlock(&g_sel.mu);
}

void sp__device_fork_lock(void) {
    pthread_mutex_lock(&g_sel.mu);
    if (g_sel.ops && g_sel.ops->fork_lock)
        g_sel.ops->fork_lock();
}

void sp__device_fork_unlock(void) {
    if (g_sel.ops && g_sel.ops->fork_unlock)
        g_sel.ops->fork_unlock();
    pthread_mutex_unlock(&g_sel.mu);
}
