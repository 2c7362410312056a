/*
 * stats.c: PyTorch's memory_stats, key for key (reference/pytorch-allocator.md section 3).
 *
 * The 122 flat keys are generated once from the nine StatArrays x {all, large_pool, small_pool}
 * x {allocated, current, freed, peak}, the two oversize Stats x 4 and the six scalars, then
 * sorted byte-wise as Python sorts the flattened dict; each sorted key remembers where its value
 * lives in sp_dev_stats_t. The table is immutable after its one-time build (pthread_once).
 * Copies and resets take the device allocator lock.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "pool/allocator.h"
#include "pool/stats.h"
#include "sympool/experimental.h"
#include "sympool/stats.h"

#define NKEYS 122

typedef struct key {
    char name[48]; /* flat key */
    size_t offset; /* byte offset of the int64 value in sp_dev_stats_t */
} key_t_;

static key_t_ g_keys[NKEYS];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static const char *const k_arrays[SP_ST_NARRAYS] = {
    "allocation",      "segment",        "active",       "inactive_split",
    "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
    "requested_bytes"};
static const char *const k_types[SP_STAT_NTYPES] = {"all", "small_pool", "large_pool"};
static const char *const k_fields[4] = {"allocated", "current", "freed", "peak"};

static size_t field_offset(int f) {
    switch (f) {
    case 0:
        return offsetof(sp_stat_t, allocated);
    case 1:
        return offsetof(sp_stat_t, slack); /* holds current once materialize() ran */
    case 2:
        return offsetof(sp_stat_t, base); /* holds freed once materialize() ran */
    default:
        return offsetof(sp_stat_t, peak);
    }
}

static int key_cmp(const void *a, const void *b) {
    return strcmp(((const key_t_ *)a)->name, ((const key_t_ *)b)->name);
}

static void build(void) {
    size_t n = 0;
    for (int a = 0; a < SP_ST_NARRAYS; a++)
        for (int t = 0; t < SP_STAT_NTYPES; t++)
            for (int f = 0; f < 4; f++) {
                key_t_ *k = &g_keys[n++];
                strcpy(k->name, k_arrays[a]);
                strcat(k->name, ".");
                strcat(k->name, k_types[t]);
                strcat(k->name, ".");
                strcat(k->name, k_fields[f]);
                k->offset = offsetof(sp_dev_stats_t, arr) +
                            ((size_t)a * SP_STAT_NTYPES + (size_t)t) * sizeof(sp_stat_t) +
                            field_offset(f);
            }
    for (int f = 0; f < 4; f++) {
        key_t_ *k = &g_keys[n++];
        strcpy(k->name, "oversize_allocations.");
        strcat(k->name, k_fields[f]);
        k->offset = offsetof(sp_dev_stats_t, oversize_allocations) + field_offset(f);
        k = &g_keys[n++];
        strcpy(k->name, "oversize_segments.");
        strcat(k->name, k_fields[f]);
        k->offset = offsetof(sp_dev_stats_t, oversize_segments) + field_offset(f);
    }
    static const struct {
        const char *name;
        size_t off;
    } scalars[6] = {
        {"num_alloc_retries", offsetof(sp_dev_stats_t, num_alloc_retries)},
        {"num_ooms", offsetof(sp_dev_stats_t, num_ooms)},
        {"max_split_size", offsetof(sp_dev_stats_t, max_split_size)},
        {"num_sync_all_streams", offsetof(sp_dev_stats_t, num_sync_all_streams)},
        {"num_device_alloc", offsetof(sp_dev_stats_t, num_device_alloc)},
        {"num_device_free", offsetof(sp_dev_stats_t, num_device_free)},
    };
    for (int i = 0; i < 6; i++) {
        strcpy(g_keys[n].name, scalars[i].name);
        g_keys[n++].offset = scalars[i].off;
    }
    qsort(g_keys, n, sizeof(g_keys[0]), key_cmp);
}

static void ensure_keys(void) {
    pthread_once(&g_once, build);
}

SP_EXPORT size_t sp_stats_count(void) {
    return NKEYS;
}

SP_EXPORT const char *sp_stats_key(size_t i) {
    ensure_keys();
    return i < NKEYS ? g_keys[i].name : NULL;
}

SP_EXPORT int64_t sp_stats_value(const sp_stats_t *stats, size_t i) {
    return stats && i < NKEYS ? stats->value[i] : 0;
}

static void each_stat(sp_dev_stats_t *st, void (*fn)(sp_stat_t *));

/* In a copy only: replace slack and base by the derived current and freed counts, where the
 * "current" and "freed" keys point. */
static void materialize(sp_stat_t *s) {
    int64_t current = sp__stat_current(s), freed = sp__stat_freed(s);
    s->slack = current;
    s->base = freed;
}

SP_EXPORT sp_status_t sp_memory_stats(int device, sp_stats_t *stats_p) {
    SP_GATE("sp_memory_stats");
    if (!stats_p)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL, "sp_memory_stats: stats_p is NULL");
    sp_devalloc_t *d = NULL;
    SP_CHECK(sp__alloc_device("sp_memory_stats", device, &d));
    ensure_keys();
    sp_dev_stats_t copy;
    sp__lock(&d->lock);
    copy = d->stats;
    sp__unlock(&d->lock);
    sp__stats_untie(&copy);
    sp__stats_settle(&copy);
    each_stat(&copy, materialize);
    memset(stats_p, 0, sizeof(*stats_p));
    for (size_t i = 0; i < NKEYS; i++)
        memcpy(&stats_p->value[i], (const char *)&copy + g_keys[i].offset, sizeof(int64_t));
    return SP_SUCCESS;
}

SP_EXPORT sp_status_t sp_stats_get(const sp_stats_t *stats, const char *key, int64_t *value_p) {
    if (!stats || !key || !value_p)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL, "sp_stats_get: NULL argument");
    ensure_keys();
    size_t lo = 0, hi = NKEYS;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(g_keys[mid].name, key);
        if (c == 0) {
            *value_p = stats->value[mid];
            return SP_SUCCESS;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                     "sp_stats_get: unknown key \"%s\" (see sp_stats_key for the %d names)", key,
                     NKEYS);
}

static void each_stat(sp_dev_stats_t *st, void (*fn)(sp_stat_t *)) {
    for (int a = 0; a < SP_ST_NARRAYS; a++)
        for (int t = 0; t < SP_STAT_NTYPES; t++)
            fn(&st->arr[a][t]);
    fn(&st->oversize_allocations);
    fn(&st->oversize_segments);
}

static void reset_peak(sp_stat_t *s) {
    s->peak -= s->slack; /* current */
    s->slack = 0;
}
static void reset_accum(sp_stat_t *s) {
    s->allocated = 0;
    s->base = sp__stat_current(s); /* freed (derived) reads 0 */
}

SP_EXPORT sp_status_t sp_reset_peak_memory_stats(int device) {
    SP_GATE("sp_reset_peak_memory_stats");
    sp_devalloc_t *d = NULL;
    SP_CHECK(sp__alloc_device("sp_reset_peak_memory_stats", device, &d));
    sp__lock(&d->lock);
    sp__stats_settle(&d->stats);      /* the aggregates' slacks reset to 0 with the rest */
    each_stat(&d->stats, reset_peak); /* while tied, active's stale copy is reset too: unread */
    sp__stats_try_tie(&d->stats);
    sp__unlock(&d->lock);
    return SP_SUCCESS;
}

SP_EXPORT sp_status_t sp_reset_accumulated_memory_stats(int device) {
    SP_GATE("sp_reset_accumulated_memory_stats");
    sp_devalloc_t *d = NULL;
    SP_CHECK(sp__alloc_device("sp_reset_accumulated_memory_stats", device, &d));
    sp__lock(&d->lock);
    each_stat(&d->stats, reset_accum); /* the aggregates follow from small and large */
    d->stats.num_alloc_retries = 0;
    d->stats.num_ooms = 0;
    d->stats.num_sync_all_streams = 0;
    d->stats.num_device_alloc = 0;
    d->stats.num_device_free = 0;
    d->exp_pages_mapped = d->exp_pages_unmapped = 0;
    d->exp_bytes_mapped = d->exp_bytes_unmapped = 0;
    d->exp_map_calls = d->exp_unmap_calls = d->exp_recycle_syncs = 0;
    sp__stats_try_tie(&d->stats);
    sp__unlock(&d->lock);
    return SP_SUCCESS;
}

static int64_t read_stat(int device, int a, bool peak) {
    SP_GATE_OR(0);
    if (!atomic_load_explicit(&sp__ready, memory_order_acquire) && sp__alloc_ensure() != SP_SUCCESS)
        return 0;
    if (device < 0 || device >= sp__g.ndev)
        return 0;
    sp_devalloc_t *d = &sp__g.devs[device];
    sp__lock(&d->lock);
    int64_t v = peak ? sp__stat_all_peak(&d->stats, a) : sp__stat_all_current(&d->stats, a);
    sp__unlock(&d->lock);
    return v;
}

SP_EXPORT size_t sp_memory_allocated(int device) {
    return (size_t)read_stat(device, SP_ST_ALLOCATED_BYTES, false);
}
SP_EXPORT size_t sp_max_memory_allocated(int device) {
    return (size_t)read_stat(device, SP_ST_ALLOCATED_BYTES, true);
}
SP_EXPORT size_t sp_memory_reserved(int device) {
    return (size_t)read_stat(device, SP_ST_RESERVED_BYTES, false);
}
SP_EXPORT size_t sp_max_memory_reserved(int device) {
    return (size_t)read_stat(device, SP_ST_RESERVED_BYTES, true);
}

SP_EXPORT sp_status_t sp_x_vmm_counters(int device, sp_x_vmm_counters_t *counters_p) {
    SP_GATE("sp_x_vmm_counters");
    if (!counters_p)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_POOL,
                         "sp_x_vmm_counters: counters_p is NULL");
    sp_devalloc_t *d = NULL;
    SP_CHECK(sp__alloc_device("sp_x_vmm_counters", device, &d));
    sp__lock(&d->lock);
    counters_p->pages_mapped = d->exp_pages_mapped;
    counters_p->pages_unmapped = d->exp_pages_unmapped;
    counters_p->bytes_mapped = d->exp_bytes_mapped;
    counters_p->bytes_unmapped = d->exp_bytes_unmapped;
    counters_p->map_calls = d->exp_map_calls;
    counters_p->unmap_calls = d->exp_unmap_calls;
    counters_p->recycle_syncs = d->exp_recycle_syncs;
    sp__unlock(&d->lock);
    return SP_SUCCESS;
}
