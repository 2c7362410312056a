/*
 * release.c: everything that gives memory back or completes delayed frees: the per-stream event
 * FIFOs of cross-stream frees (insert_events, process_events, synchronize_and_free_events), the
 * cache releases of the malloc path (release_available_cached_blocks, release_cached_blocks),
 * per-pool releases, and the garbage_collection_threshold collector
 * (reference/pytorch-allocator.md sections 1.10, 1.13, 1.14, 2.3).
 *
 * Invariants: an event entry holds its block pending (block->event_count counts its entries);
 * only whole free segments (one block, no events) are ever released; symmetric pools are never
 * released here (their release is collective, see symmetric/). Every function runs with the
 * device lock held.
 *
 * CUDA graph capture: the backend refuses (SP_ERR_NOT_SUPPORTED, quietly) to record an event on
 * a stream that is capturing, and synchronizing such a stream would break the capture. So a free
 * of a block used on a capturing stream queues an entry without an event ("deferred"): the
 * block stays pending, and the event is recorded by the first process_events after the capture
 * ended, as PyTorch defers such events until no capture is underway. A free whose event cannot be
 * made or recorded for another reason, and whose stream cannot be waited for either, is deferred
 * the same way (never handed out with the stream's work maybe still queued on it).
 */
#include <stdlib.h>
#include <string.h>

#include "pool/allocator.h"
#include "pool/block_set.h"
#include "pool/expandable.h"
#include "pool/release.h"

/* ---- events ------------------------------------------------------------------------------ */

/* The device's queues: a list (the order process_events and sync_events go in: the newest
 * queue first) and an index by stream, so that a free recorded on many streams finds each
 * stream's queue in O(1) (a walk of the list was O(streams with frees pending) an event, as
 * PyTorch's own map of queues is not: a program with thousands of streams paid it for each).
 * The index is open addressing with linear probing, at most half full, rebuilt from the list
 * when it grows or a queue is dropped (both already passes over the list); without host memory
 * for it the list alone serves. */
struct sp_evq_set {
    sp_evq_t *head;
    sp_evq_t **slot; /* [cap], NULL: empty */
    uint32_t cap;    /* a power of two, or 0: no index */
    uint32_t n;      /* queues in the list */
};

static sp_evq_t *evq_head(const sp_devalloc_t *d) {
    return d->evqs ? d->evqs->head : NULL;
}

static size_t evq_slot(sp_stream_t s, uint32_t cap) {
    return (size_t)(((uint64_t)(uintptr_t)s * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

static void index_put(struct sp_evq_set *set, sp_evq_t *q) {
    size_t i = evq_slot(q->stream, set->cap);
    while (set->slot[i])
        i = (i + 1) & (set->cap - 1);
    set->slot[i] = q;
}

/* The index again from the list, with room for its queues. */
static void index_rebuild(struct sp_evq_set *set) {
    uint32_t cap = 16;
    while (cap < 2 * (uint64_t)set->n)
        cap *= 2;
    if (cap != set->cap) {
        free(set->slot);
        set->slot = calloc(cap, sizeof(*set->slot));
        set->cap = set->slot ? cap : 0;
        if (!set->slot)
            return;
    } else {
        memset(set->slot, 0, (size_t)cap * sizeof(*set->slot));
    }
    for (sp_evq_t *q = set->head; q; q = q->next)
        index_put(set, q);
}

static sp_evq_t *queue_find(const struct sp_evq_set *set, sp_stream_t stream) {
    if (!set->cap) {
        for (sp_evq_t *q = set->head; q; q = q->next)
            if (q->stream == stream)
                return q;
        return NULL;
    }
    for (size_t i = evq_slot(stream, set->cap);; i = (i + 1) & (set->cap - 1))
        if (!set->slot[i] || set->slot[i]->stream == stream)
            return set->slot[i];
}

static sp_evq_t *queue_for(sp_devalloc_t *d, sp_stream_t stream) {
    struct sp_evq_set *set = d->evqs;
    if (!set && !(set = d->evqs = calloc(1, sizeof(*set))))
        return NULL;
    sp_evq_t *q = queue_find(set, stream);
    if (q)
        return q;
    q = calloc(1, sizeof(*q));
    if (!q)
        return NULL;
    q->stream = stream;
    q->next = set->head;
    set->head = q;
    set->n++;
    if (2 * (uint64_t)set->n > set->cap)
        index_rebuild(set);
    else
        index_put(set, q);
    return q;
}

void sp__alloc_events_fini(sp_devalloc_t *d) {
    struct sp_evq_set *set = d->evqs;
    if (!set)
        return;
    /* Left only by a capture under way at sp_shutdown (sync_events keeps deferred entries):
     * their events were never made, and their blocks go with the device. */
    for (sp_evq_t *q = set->head, *nq; q; q = nq) {
        nq = q->next;
        for (sp_evq_entry_t *e = q->head, *ne; e; e = ne) {
            ne = e->next;
            free(e);
        }
        free(q);
    }
    free(set->slot);
    free(set);
    d->evqs = NULL;
}

sp_status_t sp__alloc_insert_events(sp_devalloc_t *d, sp_block_t *b) {
    const sp_device_ops_t *ops = sp__g.ops;
    for (uint32_t i = 0; i < b->uses->n; i++) {
        sp_stream_t s = b->uses->s[i];
        sp_evq_entry_t *e = calloc(1, sizeof(*e));
        sp_evq_t *q = e ? queue_for(d, s) : NULL;
        sp_dev_event_t ev = NULL;
        if (!q) {
            /* No host memory for an entry: the only safe choice is to wait for the stream now. */
            free(e);
            (void)ops->stream_sync(d->device, s);
            continue;
        }
        sp_status_t rs = ops->event_create(d->device, &ev);
        if (rs == SP_SUCCESS) {
            rs = ops->event_record(d->device, ev, s);
            if (rs != SP_SUCCESS) {
                (void)ops->event_destroy(d->device, ev);
                ev = NULL;
            }
        }
        /* No event: capturing (SP_ERR_NOT_SUPPORTED) makes a deferred entry, recorded later.
         * After another failure, wait for the stream now; if that wait fails too (a capture, a
         * device error), the block must not be handed out with the stream's work maybe still
         * running on it, so it waits as a deferred entry (record_deferred tries again). */
        if (rs != SP_SUCCESS && rs != SP_ERR_NOT_SUPPORTED &&
            ops->stream_sync(d->device, s) == SP_SUCCESS) {
            free(e);
            continue;
        }
        e->event = ev;
        e->block = b;
        if (q->tail)
            q->tail->next = e;
        else
            q->head = e;
        q->tail = e;
        b->event_count++;
        d->pending_events++;
    }
    /* Consumed: a block has a uses list only while allocated, so a free block never does. */
    free(b->uses->s);
    free(b->uses);
    b->uses = NULL;
    d->use_blocks--;
    return SP_SUCCESS;
}

void sp__alloc_forget_stream(sp_devalloc_t *d, sp_stream_t stream) {
    if (!d->use_blocks)
        return; /* the common case: no live block was recorded on any stream */
    /* The stream's work must be complete before its uses go: a free that no longer waits for it
     * may hand the block out at once. Without that (a device error, logged there), the uses
     * stay, as before. */
    if (sp__g.ops->stream_sync(d->device, stream) != SP_SUCCESS)
        return;
    uint32_t seen = 0;
    for (sp_mempool_t *p = d->default_pool; p && seen < d->use_blocks;
         p = p == d->default_pool ? d->pools : p->next) {
        for (sp_segment_t *seg = p->seg_head; seg && seen < d->use_blocks; seg = seg->pnext) {
            for (sp_block_t *b = seg->head; b; b = sp__block_next(b)) {
                if (!sp__block_has_uses(b))
                    continue;
                seen++;
                sp_block_uses_t *us = b->uses;
                uint32_t k = 0;
                for (uint32_t i = 0; i < us->n; i++)
                    if (us->s[i] != stream)
                        us->s[k++] = us->s[i];
                us->n = k; /* an empty list stays: the free then waits for nothing */
            }
        }
    }
}

/* One entry done: drop it, and complete the block's free when it was the last. */
static void entry_done(sp_devalloc_t *d, sp_evq_entry_t *e) {
    (void)sp__g.ops->event_destroy(d->device, e->event);
    d->pending_events--;
    sp_block_t *b = e->block;
    free(e);
    if (--b->event_count == 0)
        sp__alloc_free_block(d, b, 0);
    if (d->pending_events == 0)
        sp__stats_try_tie(&d->stats);
}

static void drop_empty_queues(sp_devalloc_t *d) {
    struct sp_evq_set *set = d->evqs;
    if (!set)
        return;
    uint32_t dropped = 0;
    sp_evq_t **pp = &set->head;
    while (*pp) {
        sp_evq_t *q = *pp;
        if (!q->head) {
            *pp = q->next;
            free(q);
            dropped++;
        } else {
            pp = &q->next;
        }
    }
    if (dropped) {
        set->n -= dropped;
        index_rebuild(set);
    }
}

/* A deferred entry (no event: its stream was capturing at the free) gets its event now; false
 * while the stream still captures (or the backend cannot make an event), and it stays. */
static bool record_deferred(sp_devalloc_t *d, sp_stream_t stream, sp_evq_entry_t *e) {
    if (SP_LIKELY(e->event != NULL))
        return true;
    sp_dev_event_t ev = NULL;
    if (sp__g.ops->event_create(d->device, &ev) != SP_SUCCESS)
        return false;
    if (sp__g.ops->event_record(d->device, ev, stream) != SP_SUCCESS) {
        (void)sp__g.ops->event_destroy(d->device, ev);
        return false;
    }
    e->event = ev;
    return true;
}

void sp__alloc_process_events(sp_devalloc_t *d) {
    for (sp_evq_t *q = evq_head(d); q; q = q->next) {
        /* FIFO per stream: stop at the first event not done, so a slow stream delays only its
         * own queue. */
        while (q->head) {
            bool done = false;
            if (!record_deferred(d, q->stream, q->head))
                break;
            if (sp__g.ops->event_query(d->device, q->head->event, &done) != SP_SUCCESS || !done)
                break;
            sp_evq_entry_t *e = q->head;
            q->head = e->next;
            if (!q->head)
                q->tail = NULL;
            entry_done(d, e);
        }
    }
    drop_empty_queues(d);
}

void sp__alloc_sync_events(sp_devalloc_t *d, const sp_mempool_t *pool) {
    d->stats.num_sync_all_streams++;
    for (sp_evq_t *q = evq_head(d); q; q = q->next) {
        sp_evq_entry_t *prev = NULL, *e = q->head;
        while (e) {
            sp_evq_entry_t *nx = e->next;
            /* A deferred entry whose stream still captures cannot be waited for: it stays. */
            if ((pool && sp__bseg(e->block)->bpool->pool != pool) ||
                !record_deferred(d, q->stream, e)) {
                prev = e;
                e = nx;
                continue;
            }
            (void)sp__g.ops->event_sync(d->device, e->event); /* an error was logged there */
            if (prev)
                prev->next = nx;
            else
                q->head = nx;
            if (q->tail == e)
                q->tail = prev;
            entry_done(d, e);
            e = nx;
        }
    }
    drop_empty_queues(d);
}

/* ---- releases ---------------------------------------------------------------------------- */

/* The watch of sp__release_watch (release.h): off outside the public calls that report. */
static _Thread_local struct {
    bool on;            /* watching */
    sp_status_t status; /* the first refusal's, SP_SUCCESS: none yet */
    char *text;         /* its last-error text (malloc'd; NULL without host memory) */
} t_watch;

void sp__release_watch(void) {
    free(t_watch.text);
    t_watch.text = NULL;
    t_watch.status = SP_SUCCESS;
    t_watch.on = true;
}

void sp__release_refused(sp_status_t status) {
    if (!t_watch.on || t_watch.status != SP_SUCCESS || status == SP_SUCCESS)
        return;
    t_watch.status = status;
    t_watch.text = strdup(sp_last_error());
}

sp_status_t sp__release_report(const char *fn) {
    sp_status_t s = t_watch.status;
    char *text = t_watch.text;
    t_watch.on = false;
    t_watch.status = SP_SUCCESS;
    t_watch.text = NULL;
    if (s == SP_SUCCESS)
        return SP_SUCCESS;
    /* Logged at WARN where the device refused: INFO here, the one text the caller reads. */
    s = sp__error_quiet(s == SP_ERR_OUT_OF_MEMORY ? SP_ERR_DEVICE : s, SP_SUB_POOL,
                        "%s: device memory the cache held could not be given back; it stays "
                        "cached and a later release tries again: %s",
                        fn, text ? text : "(no text: out of host memory)");
    free(text);
    return s;
}

/* What a release of seg's pool gives back of seg: an expandable segment's free pages (the
 * segment too once it is unmapped end to end), a whole free segment, else nothing. */
static size_t release_one(sp_devalloc_t *d, sp_segment_t *seg, uint32_t context) {
    if (seg->expandable)
        return sp__exp_release(d, seg, context);
    if (!sp__block_releasable(seg->head))
        return 0;
    size_t size = seg->size;
    return sp__alloc_release_segment(d, seg, context) ? size : 0;
}

static int by_seq(const void *a, const void *b) {
    uint64_t x = (*(sp_segment_t *const *)a)->seq, y = (*(sp_segment_t *const *)b)->seq;
    return x < y ? -1 : x > y;
}

typedef struct {
    sp_segment_t **v;
    size_t n, cap;
} seg_list_t;

static bool seg_add(seg_list_t *l, sp_segment_t *seg) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        sp_segment_t **v = realloc(l->v, cap * sizeof(*v));
        if (!v)
            return false;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = seg;
    return true;
}

/* The segments of `stream` in bp that a release may give back something of: those of its free
 * blocks (a whole free segment, or an expandable one) and of its unmapped ones (an expandable
 * segment unmapped end to end). Both are ordered by stream first: the free set from its first
 * block of the stream, the unmapped list up to the end of the stream's run. */
static bool stream_candidates(sp_bpool_t *bp, sp_stream_t stream, seg_list_t *l) {
    for (sp_block_t *b = sp__bset_lower_bound(&bp->free, stream, 0);
         b && sp__block_stream(b) == stream; b = sp__bset_succ(&bp->free, b)) {
        sp_segment_t *seg = sp__bseg(b);
        if ((seg->expandable || sp__block_releasable(b)) && !seg_add(l, seg))
            return false;
    }
    for (sp_block_t *u = bp->unmapped; u; u = sp__blk0(u->right)) {
        if ((uintptr_t)sp__block_stream(u) > (uintptr_t)stream)
            break;
        if (sp__block_stream(u) == stream && !seg_add(l, sp__bseg(u)))
            return false;
    }
    return true;
}

/* A release of one stream's segments (sp_stream_destroy: each one would otherwise walk every
 * segment of the device, O(n) a stream for a program that makes and ends streams as it goes):
 * the candidates from the free sets and unmapped lists, then each once in the pool's own order
 * (seq: the segment list's, so the history's segment_free entries come as a walk gives them).
 * false, having released nothing, without host memory for the list. */
static bool release_stream(sp_devalloc_t *d, sp_mempool_t *pool, sp_stream_t stream,
                           uint32_t context, size_t *freed_p) {
    seg_list_t l = {0};
    if (!stream_candidates(&pool->small, stream, &l) ||
        !stream_candidates(&pool->large, stream, &l)) {
        free(l.v);
        return false;
    }
    if (l.n > 1)
        qsort(l.v, l.n, sizeof(*l.v), by_seq);
    size_t freed = 0;
    for (size_t i = 0; i < l.n; i++)
        if (i == 0 || l.v[i] != l.v[i - 1]) /* an expandable segment comes once a block */
            freed += release_one(d, l.v[i], context);
    free(l.v);
    *freed_p = freed;
    return true;
}

bool sp__release_by_walk;

/* PyTorch's release_blocks order: each block pool's in its free set's order (stream, size,
 * address); the default MemPool's large pool first, then its small pool, a private pool's small
 * pool first (release_cached_blocks releases them in those orders). */
static int by_stream_size_address(const sp_segment_t *x, const sp_segment_t *y) {
    if (x->stream != y->stream)
        return (uintptr_t)x->stream < (uintptr_t)y->stream ? -1 : 1;
    if (x->size != y->size)
        return x->size < y->size ? -1 : 1;
    return x->base < y->base ? -1 : x->base > y->base;
}
static int large_first(const void *a, const void *b) {
    const sp_segment_t *x = *(sp_segment_t *const *)a, *y = *(sp_segment_t *const *)b;
    if (x->bpool->is_small != y->bpool->is_small)
        return x->bpool->is_small ? 1 : -1;
    return by_stream_size_address(x, y);
}
static int small_first(const void *a, const void *b) {
    const sp_segment_t *x = *(sp_segment_t *const *)a, *y = *(sp_segment_t *const *)b;
    if (x->bpool->is_small != y->bpool->is_small)
        return x->bpool->is_small ? -1 : 1;
    return by_stream_size_address(x, y);
}

typedef struct {
    sp_block_t **v;
    size_t n, cap;
} blk_list_t;

static bool blk_add(blk_list_t *l, sp_block_t *b) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        sp_block_t **v = realloc(l->v, cap * sizeof(*v));
        if (!v)
            return false;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = b;
    return true;
}

/* release_sorted for a pool with expandable segments, as PyTorch's release_blocks goes through a
 * block pool's free set (the default pool's large one first, a private pool's small one): whole
 * fixed segments given back as met, expandable blocks gathered, then their pages unmapped in
 * that order (sp__exp_release_blocks), not segment by segment in address order. Then what the
 * walk gives back besides: a segment unmapped end to end before (a growth's RECYCLE), not a
 * second try at pages whose device sync failed (the GPU may still use them). false, having
 * released nothing, without host memory for the lists. */
static bool release_in_set_order(sp_devalloc_t *d, sp_mempool_t *pool, uint32_t context,
                                 size_t *freed_p) {
    bool dflt = pool == d->default_pool;
    sp_bpool_t *bps[2] = {dflt ? &pool->large : &pool->small, dflt ? &pool->small : &pool->large};
    seg_list_t whole[2] = {{0}, {0}};
    blk_list_t exp[2] = {{0}, {0}};
    bool ok = true;
    for (int k = 0; ok && k < 2; k++)
        for (sp_block_t *b = bps[k]->free.min; ok && b; b = sp__bset_succ(&bps[k]->free, b)) {
            sp_segment_t *seg = sp__bseg(b);
            if (seg->expandable)
                ok = blk_add(&exp[k], b);
            else if (sp__block_releasable(b))
                ok = seg_add(&whole[k], seg);
        }
    size_t freed = 0;
    for (int k = 0; ok && k < 2; k++) {
        for (size_t i = 0; i < whole[k].n; i++)
            freed += release_one(d, whole[k].v[i], context);
        freed += sp__exp_release_blocks(d, exp[k].v, exp[k].n, context);
    }
    for (int k = 0; k < 2; k++) {
        free(whole[k].v);
        free(exp[k].v);
    }
    if (!ok)
        return false;
    for (sp_segment_t *seg = pool->seg_head, *nx; seg; seg = nx) {
        nx = seg->pnext; /* seg may go */
        if (seg->expandable)
            freed += sp__exp_release_unmapped(d, seg);
    }
    *freed_p = freed;
    return true;
}

/* The `whole` whole free segments of a pool without expandable ones into l in large_first's
 * (default pool) or small_first's order without a sort: that order is the free sets' own
 * (stream, size, address), the large set's blocks then the small one's (or the reverse), and a
 * whole free segment is its one block, in its pool's set (sp__block_releasable). The walk stops
 * at the last one, so it visits the free blocks up to there, where the sort cost ~260
 * instructions a segment (kk256f's empty_cache: 287 segments, 4% of its replay loop). false
 * (l may hold some) for a symmetric pool (its sets order by segment seq), without host memory
 * for the list, for sets of more than 8 free blocks a whole segment, or when the walk did not
 * find `whole` of them. */
static bool whole_in_set_order(sp_devalloc_t *d, sp_mempool_t *pool, size_t whole, seg_list_t *l) {
    bool dflt = pool == d->default_pool;
    sp_bpool_t *bps[2] = {dflt ? &pool->large : &pool->small, dflt ? &pool->small : &pool->large};
    /* A step of the walk (a successor) costs tens of instructions, the sort ~260 a segment
     * (kk256f): many free blocks of split segments beside few whole ones sort sooner. */
    size_t blocks = bps[0]->free.count + bps[1]->free.count;
    if (bps[0]->free.by_seq || bps[1]->free.by_seq || blocks > 8 * whole)
        return false;
    for (int k = 0; k < 2 && l->n < whole; k++)
        for (sp_block_t *b = bps[k]->free.min; b && l->n < whole;
             b = sp__bset_succ(&bps[k]->free, b))
            if (sp__block_releasable(b) && !seg_add(l, sp__bseg(b)))
                return false;
    return l->n == whole;
}

/* A release of a whole pool (empty_cache, the OOM retry's release of the cache, a MemPool's
 * release): its whole free segments in PyTorch's order (large_first, small_first), so that the
 * history's segment_free entries come in the order PyTorch's trace has them (a replay's
 * snapshot, a viewer's state history); a pool with an expandable segment in its free sets' order
 * (release_in_set_order). false, having released nothing, without host memory for the list. */
static bool release_sorted(sp_devalloc_t *d, sp_mempool_t *pool, uint32_t context,
                           size_t *freed_p) {
    size_t whole = 0;
    for (sp_segment_t *seg = pool->seg_head; seg; seg = seg->pnext) {
        if (seg->expandable)
            return release_in_set_order(d, pool, context, freed_p);
        whole += sp__block_releasable(seg->head);
    }
    seg_list_t l = {0};
    if (!whole_in_set_order(d, pool, whole, &l)) {
        l.n = 0;
        for (sp_segment_t *seg = pool->seg_head; seg; seg = seg->pnext)
            if (sp__block_releasable(seg->head) && !seg_add(&l, seg)) {
                free(l.v);
                return false;
            }
        if (l.n > 1)
            qsort(l.v, l.n, sizeof(*l.v), pool == d->default_pool ? large_first : small_first);
    }
    size_t freed = 0;
    for (size_t i = 0; i < l.n; i++)
        freed += release_one(d, l.v[i], context);
    free(l.v);
    *freed_p = freed;
    return true;
}

size_t sp__alloc_release_pool(sp_devalloc_t *d, sp_mempool_t *pool, bool filter_stream,
                              sp_stream_t stream, uint32_t context) {
    size_t freed = 0;
    if (filter_stream && !sp__release_by_walk && release_stream(d, pool, stream, context, &freed))
        return freed;
    if (!filter_stream && release_sorted(d, pool, context, &freed))
        return freed;
    sp_segment_t *seg = pool->seg_head;
    while (seg) {
        sp_segment_t *nx = seg->pnext;
        if (!filter_stream || seg->stream == stream)
            freed += release_one(d, seg, context);
        seg = nx;
    }
    return freed;
}

/* Whether a graph capture is under way on the device (its legacy stream counts as capturing while
 * a blocking stream captures, and so does a capture on a stream sp_stream_create made; host:
 * never). A capture on a non-blocking stream the application made itself is not seen: CUDA has
 * no per-device query. */
bool sp__alloc_capture_underway(sp_devalloc_t *d) {
    bool capturing = false;
    if (sp__g.ops->device_capturing)
        return sp__g.ops->device_capturing(d->device, &capturing) == SP_SUCCESS && capturing;
    return sp__g.ops->stream_capturing(d->device, NULL, &capturing) == SP_SUCCESS && capturing;
}

void sp__alloc_release_cached(sp_devalloc_t *d, uint32_t context) {
    /* PyTorch releases no cached block while a capture is under way (its malloc only calls
     * release_cached_blocks when captures_underway is empty): waiting for events and the device
     * would break the capture, and a captured graph may still use the memory. The OOM retry then
     * fails as an OOM, and empty_cache keeps the cache. */
    if (sp__alloc_capture_underway(d)) {
        SP_INFO(SP_SUB_POOL,
                "device %d: a CUDA graph capture is under way; cached segments are "
                "not released",
                d->device);
        return;
    }
    sp__alloc_sync_events(d, NULL);
    sp__alloc_release_pool(d, d->default_pool, false, NULL, context);
    for (sp_mempool_t *p = d->pools; p; p = p->next)
        if (!p->symmetric && atomic_load_explicit(&p->use_count, memory_order_relaxed) == 0)
            sp__alloc_release_pool(d, p, false, NULL, context);
}

bool sp__alloc_release_available(sp_devalloc_t *d, sp_bpool_t *bp, size_t size, sp_stream_t stream,
                                 uint32_t context) {
    size_t mss = sp__g.conf.max_split_size;
    if (mss == SIZE_MAX || bp->pool->symmetric)
        return false;
    size_t key = size > mss ? size : mss;
    sp_block_t *b = sp__bset_lower_bound(&bp->free, stream, key);
    if (b && sp__block_stream(b) == stream && sp__block_releasable(b))
        return sp__alloc_release_segment(d, sp__bseg(b), context);
    /* Otherwise release oversize whole-segment blocks of this stream, largest first, until
     * `key` bytes are freed. */
    size_t freed = 0;
    while (freed < key) {
        sp_segment_t *best = NULL;
        for (sp_segment_t *s = bp->pool->seg_head; s; s = s->pnext)
            if (s->bpool == bp && s->stream == stream && s->size >= mss &&
                sp__block_releasable(s->head) && (!best || s->size > best->size))
                best = s;
        if (!best)
            return false;
        size_t bytes = best->size;
        if (!sp__alloc_release_segment(d, best, context))
            return false; /* it stays releasable: trying it again would loop */
        freed += bytes;
    }
    return true;
}

/* garbage_collection_threshold (PyTorch's garbage_collect_cached_blocks): once reserved memory
 * passes threshold x allowed_max, release whole free segments of the default large pool whose
 * age (get_free_block calls since they were cached) is at least the average age, all of them in
 * one pass (PyTorch does not stop a pass at the target, so GC does not re-trigger at once), and
 * repeat while the target is not reached and a pass freed something. */
void sp__alloc_gc(sp_devalloc_t *d, uint32_t context) {
    if (d->allowed_max == SIZE_MAX)
        return;
    size_t thresh = (size_t)(sp__g.conf.gc_threshold * (double)d->allowed_max);
    if (d->total_reserved <= thresh)
        return;
    size_t target = d->total_reserved - thresh, freed = 0;
    sp_bpool_t *bp = &d->default_pool->large;
    uint64_t total_age = 0, n = 0;
    for (sp_segment_t *s = d->default_pool->seg_head; s; s = s->pnext) {
        if (s->bpool == bp && sp__block_releasable(s->head)) {
            total_age += bp->gfb_count - s->gc_clock;
            n++;
        }
    }
    bool any = true;
    while (freed < target && any && n > 0) {
        double avg = (double)total_age / (double)n;
        any = false;
        sp_segment_t *s = d->default_pool->seg_head;
        while (s) {
            sp_segment_t *nx = s->pnext;
            uint64_t age = bp->gfb_count - s->gc_clock;
            if (s->bpool == bp && sp__block_releasable(s->head) && (double)age >= avg) {
                size_t size = s->size;
                total_age -= age;
                n--;
                if (sp__alloc_release_segment(d, s, context)) {
                    freed += size;
                    any = true;
                }
            }
            s = nx;
        }
    }
}
