/*
 * sym_release.c: the collective release paths of symmetric MemPools: sp_symmetric_empty_cache,
 * sp_symmetric_mempool_destroy and the world finalize hook. The registry and counters they
 * update live in sym_round.c.
 *
 * Release rule: a segment is deregistered and freed only when every rank agrees it is free
 * everywhere (one MPI_BAND allreduce of a bitmap over segment sequence numbers), after a
 * barrier, in ascending sequence order on every rank (registrars' release calls are collective).
 * A segment the pool lets go of outside such a call (sp_mempool_destroy, sp_shutdown) keeps its
 * registration until the next collective release of its pool or sp_world_finalize.
 *
 * Destroy: sp_mempool_destroy is not collective, so it cannot release a registered segment.
 * sp_symmetric_mempool_destroy (collective, added to symmetric.h) is the way to destroy a
 * symmetric pool: SP_ERR_BUSY on every rank if any rank still has a live block in it or is
 * capturing a CUDA graph on its device; otherwise every segment is released collectively and the
 * pool destroyed. A symmetric pool left alive at sp_world_finalize has its segments released
 * there (the memory under it is gone; a warning says so), unless a timeout broke it: then a rank
 * may be gone and the collective release could wait forever, so its registrations are left to
 * process exit (a warning says so). The same happens, on every rank, while a rank captures.
 *
 * Graph capture: nothing is released while a rank's device captures (the nccl registrar
 * synchronizes the device before a deregistration, which a global-mode capture forbids, and the
 * graph may use the memory): empty_cache releases nothing, destroy is refused, finalize leaves
 * the registrations. The ranks learn it in the round each call makes anyway.
 *
 * Locking: each state's lock is held for its calls (sym_round.c's registry has its own). A
 * release detaches each segment under the device lock (one short pool call) and deregisters and
 * frees it with no pool or device lock held; one agreement round per release batch stands for
 * the barrier. The pool must not be used by another thread of the rank while a collective
 * release runs (an OOM loan that takes an agreed segment there would keep this rank out of
 * MPI_Win_free).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "pool/pool.h"
#include "symmetric/symmetric.h"
#include "symmetric/sym_state.h"

/* ---- collective release ------------------------------------------------------------------- */

/* Release pool segment `seq` (free on every rank, agreed): the mirror of growth. One locked
 * pool call detaches it, then the registrar deregisters and frees it with no lock held. */
static sp_status_t release_seq(sp_sym_state_t *st, uint64_t seq) {
    void *base = NULL;
    size_t size = 0;
    sp_stream_t stream = NULL;
    sp_status_t s = sp__pool_sym_detach(st->pool, seq, &base, &size, &stream);
    if (s != SP_SUCCESS)
        return s; /* cannot happen for an agreed segment; the registration stays recorded */
    /* Unlinked first, under recs_lock (queries walk the list); released with no lock but the
     * pool's own (the registrar's release may synchronize the node). */
    pthread_mutex_lock(&st->recs_lock);
    sp_sym_rec_t **pp = &st->recs;
    while (*pp && (*pp)->seg.base != base)
        pp = &(*pp)->next;
    sp_sym_rec_t *rec = *pp;
    if (rec)
        *pp = rec->next;
    pthread_mutex_unlock(&st->recs_lock);
    if (!rec)
        return sp__error(SP_ERR_INTERNAL, SP_SUB_SYM, "segment %llu at %p has no registration",
                         (unsigned long long)seq, base);
    s = st->reg->release(st, &rec->seg, stream);
    free(rec);
    sp__symc_add(st->device, SP_SYMC_DEREGISTRATIONS, 1);
    return s;
}

/* The head of the list, unlinked under recs_lock (a query may be walking it); NULL when empty. */
static sp_sym_rec_t *pop_rec(sp_sym_state_t *st) {
    pthread_mutex_lock(&st->recs_lock);
    sp_sym_rec_t *r = st->recs;
    if (r)
        st->recs = r->next;
    pthread_mutex_unlock(&st->recs_lock);
    return r;
}

sp_status_t sp__sym_release_recs(sp_sym_state_t *st) {
    sp_status_t first = SP_SUCCESS;
    sp_sym_rec_t *r;
    while ((r = pop_rec(st)) != NULL) {
        sp_status_t s = st->reg->release(st, &r->seg, NULL);
        if (s != SP_SUCCESS && first == SP_SUCCESS)
            first = s;
        free(r);
        sp__symc_add(st->device, SP_SYMC_DEREGISTRATIONS, 1);
    }
    return first;
}

/* The fields of the free-segment round: the bitmap's length; the rank itself when it is under
 * a graph capture, else INT64_MAX (so lo is the lowest capturing rank); 1 when it has live
 * blocks (destroy); the status of a rank that could not prepare its part (0 when it could). */
enum { F_NSEQ, F_CAPTURE, F_LIVE, F_FAILED };

_Thread_local bool sp__sym_test_no_host;

void sp__sym_test_fail_host(bool on) {
    sp__sym_test_no_host = on;
}

/* This rank's part of the bitmap round, made before the first round: buf (2 * words words, the
 * input half filled) for the segments free here, words covering this rank's `nseq` segments.
 * Under a graph capture or a refusal it says "nothing free here". A failed allocation leaves
 * *buf_p NULL: the rank then says so in the first round, so every rank stops there. */
static void prepare_bits(sp_sym_state_t *st, bool nothing, uint64_t nseq, uint64_t **buf_p) {
    size_t words = (size_t)(nseq + 63) / 64 + 1, n = 0;
    uint64_t *buf = sp__sym_test_no_host ? NULL : calloc(2 * words, sizeof *buf);
    uint64_t *seqs = NULL;
    *buf_p = buf;
    if (!buf || nothing || sp__pool_free_segments(st->pool, NULL, 0, &n) != SP_SUCCESS || !n)
        return;
    seqs = malloc(n * sizeof *seqs);
    if (!seqs || sp__pool_free_segments(st->pool, seqs, n, &n) != SP_SUCCESS)
        n = 0; /* contributes "nothing free here": safe, releases nothing */
    for (size_t i = 0; i < n; i++)
        if (seqs[i] < nseq)
            buf[seqs[i] / 64] |= 1ull << (seqs[i] % 64);
    free(seqs);
}

/* The peers of a rank that could not prepare its part get its status too, naming it. */
static sp_status_t failed_round(const sp_agree_t *a, bool mine, const char *what) {
    char ranks[96];
    if (mine)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_SYM,
                         "%s: out of host memory for the free-segment bitmap; no rank released "
                         "a segment",
                         what);
    return sp__error((sp_status_t)a->hi[F_FAILED], SP_SUB_SYM,
                     "%s: %s could not prepare the call (out of host memory; its log says why); "
                     "no rank released a segment",
                     what, sp__agree_bad_ranks(a, ranks, sizeof ranks));
}

/* Agree on the pool segments free on every rank: returns a bitmap of nbits (caller frees).
 * The first round has the common shape (operation `op`, this pool's call number) and agrees on
 * the bitmap's length; the second ANDs the bitmaps. `live`: this rank has live blocks in the
 * pool (destroy's refusal; false for empty_cache). A round with a rank not ok (a->nbad) stops
 * there on every rank; a->lo[F_CAPTURE] and a->hi[F_LIVE] then say why, unless a rank could not
 * prepare its bitmap (a->hi[F_FAILED]): then every rank fails the call with its status.
 *
 * The length is the smallest segment count of any rank: a segment only some ranks have is free
 * on no rank there, so the AND would clear its bit anyway. So each rank's buffer, made for its
 * own count before the first round, is long enough, and no allocation follows the first round:
 * a rank that cannot get its buffer says so there, and no peer waits for it in the second. */
static sp_status_t agree_free(sp_sym_state_t *st, int op, bool live, const char *what,
                              uint64_t **bits_p, uint64_t *nbits_p, sp_agree_t *a) {
    /* Under a graph capture nothing may be released: the release's synchronize would break the
     * capture (PyTorch's empty_cache releases nothing then either), and the captured graph may
     * use the memory (PyTorch frees no memory a capture may use). For empty_cache the rank says
     * "nothing free here", so the AND releases nothing on any rank; a destroy cannot leave
     * segments behind, so the rank refuses it, and every rank with it. */
    bool capturing = sp__pool_capture_underway(st->pool);
    bool refuse = live || (capturing && op == SP_AGREE_SYM_DESTROY);
    const char *so = op == SP_AGREE_SYM_DESTROY
                         ? "this rank refuses, so no rank destroys the pool"
                         : "this rank keeps its segments, so no rank releases any";
    if (capturing)
        SP_INFO(SP_SUB_SYM, "%s: a CUDA graph capture is under way on device %d; %s", what,
                st->device, so);
    else if (sp__pool_sync_pending(st->pool) != SP_SUCCESS)
        SP_INFO(SP_SUB_SYM, "%s: completing pending frees failed: %s", what, sp_last_error());
    uint64_t nseq = sp__pool_next_segment_seq(st->pool), *buf = NULL;
    prepare_bits(st, capturing || refuse, nseq, &buf);
    if (!buf)
        SP_WARN(SP_SUB_SYM, "%s: out of host memory for the free-segment bitmap (%llu segments)",
                what, (unsigned long long)nseq);
    *bits_p = NULL;
    *nbits_p = 0;
    *a = (sp_agree_t){.op = op,
                      .ok = !refuse && buf,
                      .f = {[F_NSEQ] = (int64_t)nseq,
                            [F_CAPTURE] = capturing ? st->rank : INT64_MAX,
                            [F_LIVE] = live,
                            [F_FAILED] = buf ? SP_SUCCESS : SP_ERR_SYSTEM}};
    sp_status_t s = sp__sym_round(st, a, what);
    if (s == SP_SUCCESS && a->hi[F_FAILED] != SP_SUCCESS)
        s = failed_round(a, !buf, what);
    if (s != SP_SUCCESS || a->nbad) {
        free(buf); /* the caller reports live blocks or a capture */
        return s;
    }
    uint64_t nbits = (uint64_t)a->lo[F_NSEQ];
    size_t words = (size_t)(nbits + 63) / 64 + 1; /* <= this rank's: nbits <= nseq */
    SP_CHECK(sp__sym_band(st, buf, words, what)); /* on failure buf is gone */
    memmove(buf, buf + words, words * sizeof *buf);
    *bits_p = buf;
    *nbits_p = nbits;
    return SP_SUCCESS;
}

/* The release round: every rank has stopped using the agreed segments (peer pointers included)
 * and its device has finished the work that could use them (the registrar's quiesce), or no rank
 * releases any: a rank whose wait failed cannot know its kernels are done with the memory, and a
 * segment kept on one rank only would leave the pool asymmetric. */
static sp_status_t release_round(sp_sym_state_t *st, const char *what) {
    sp_status_t mine = st->reg->quiesce ? st->reg->quiesce(st) : SP_SUCCESS;
    char why[256];
    snprintf(why, sizeof why, "%s", mine == SP_SUCCESS ? "" : sp_last_error());
    sp_agree_t a = {.op = SP_AGREE_SYM_RELEASE, .ok = mine == SP_SUCCESS};
    SP_CHECK(sp__sym_round(st, &a, what));
    if (mine != SP_SUCCESS)
        return sp__error(mine, SP_SUB_SYM, "%s: %s; no rank released a segment", what, why);
    char ranks[96];
    if (a.nbad)
        return sp__error(SP_ERR_DEVICE, SP_SUB_SYM,
                         "%s: %s could not wait for its device's work (its log says why); no "
                         "rank released a segment",
                         what, sp__agree_bad_ranks(&a, ranks, sizeof ranks));
    return SP_SUCCESS;
}

/* Release the agreed segments: the release round first, then each, in ascending sequence order.
 * The round's failure is returned (no rank released any). A failure releasing one segment on
 * this rank (*seg_err_p, the first) does not stop the others: every rank takes the same
 * segments off the pool's books, so the pool stays symmetric (a registrar keeps what it could
 * not let go of for another try, reg_nccl.c). */
static sp_status_t release_agreed(sp_sym_state_t *st, const char *what, const uint64_t *bits,
                                  uint64_t nbits, size_t *released_p, sp_status_t *seg_err_p) {
    size_t released = 0;
    bool any = false;
    for (uint64_t q = 0; q < nbits; q++)
        any = any || (bits[q / 64] >> (q % 64) & 1);
    *released_p = 0;
    *seg_err_p = SP_SUCCESS;
    if (any)
        SP_CHECK(release_round(st, what));
    else if (st->reg->retry_kept) /* a release would have tried them (reg_nccl.c) */
        st->reg->retry_kept(st);
    sp_status_t s = SP_SUCCESS;
    char msg[512] = "";
    for (uint64_t q = 0; q < nbits; q++) {
        if (!(bits[q / 64] >> (q % 64) & 1))
            continue;
        sp_status_t r = release_seq(st, q);
        if (r != SP_SUCCESS && s == SP_SUCCESS) {
            s = r;
            snprintf(msg, sizeof msg, "%s", sp_last_error());
        }
        released += r == SP_SUCCESS;
    }
    *released_p = released;
    *seg_err_p = s;
    if (s != SP_SUCCESS) /* the first failure's text, which later releases may have overwritten */
        (void)sp__error_quiet(s, SP_SUB_SYM, "%s: %s", what, msg);
    return SP_SUCCESS;
}

SP_EXPORT sp_status_t sp_symmetric_empty_cache(sp_mempool_t *pool) {
    sp_sym_state_t *st = NULL;
    SP_CHECK(sp__sym_acquire(pool, "sp_symmetric_empty_cache", &st));
    ++st->callno;
    char what[128];
    snprintf(what, sizeof what, "sp_symmetric_empty_cache call #%llu on pool \"%s\"",
             (unsigned long long)st->callno, st->name);
    uint64_t *bits = NULL, nbits = 0;
    size_t n = 0;
    sp_agree_t a;
    sp_status_t s = agree_free(st, SP_AGREE_SYM_EMPTY_CACHE, false, what, &bits, &nbits, &a);
    sp_status_t seg_err = SP_SUCCESS;
    if (s == SP_SUCCESS)
        s = release_agreed(st, what, bits, nbits, &n, &seg_err);
    if (s == SP_SUCCESS)
        s = seg_err;
    free(bits);
    if (s == SP_SUCCESS)
        SP_INFO(SP_SUB_SYM, "%s: released %zu segment(s)", what, n);
    sp__sym_release_state(st);
    return s;
}

static void free_state(sp_sym_state_t *st) {
    sp__sym_unregister(st);
    sp__symc_add(st->device, SP_SYMC_POOLS, -1);
    /* The node's GPU table (sp__sym_node_gather) may have been abandoned on node_comm. */
    if (st->node_comm != MPI_COMM_NULL && !(st->abandoned && sp__agree_pending(st->node_comm)))
        MPI_Comm_free(&st->node_comm);
    if (st->abandoned && sp__agree_pending(st->comm))
        return; /* kept on s_broken: a round abandoned at a timeout is pending on its comm */
    if (st->comm != MPI_COMM_NULL)
        MPI_Comm_free(&st->comm);
    if (st->broken)
        return;         /* on s_broken; the late rank completed its round, but keep it simple */
    sp__sym_retire(st); /* freed when no call holds it (sp__sym_retire) */
}

/* SP_ERR_BUSY on every rank, naming the ranks that refused the destroy (a->nbad > 0) and why:
 * live blocks, a graph capture under way, or some of each. */
static sp_status_t destroy_refused(const sp_agree_t *a, const char *what, char *ranks, size_t len) {
    const char *who = sp__agree_bad_ranks(a, ranks, len);
    bool capture = a->lo[F_CAPTURE] != INT64_MAX, live = a->hi[F_LIVE] != 0;
    if (capture && !live)
        return sp__error(SP_ERR_BUSY, SP_SUB_SYM,
                         "%s: %s %s capturing a CUDA graph on its device; end the capture first "
                         "(releasing the pool's memory would break it, and the graph may use "
                         "that memory; nothing was destroyed)",
                         what, who, a->nbad == 1 ? "is" : "are");
    /* Both: one rank refused, so it has both; of several, the round tells only which refused
     * and the lowest that captures. */
    if (capture)
        return sp__error(SP_ERR_BUSY, SP_SUB_SYM,
                         "%s: %s %s (the lowest capturing rank is %lld); free the blocks on every "
                         "rank and end the capture first (nothing was destroyed)",
                         what, who,
                         a->nbad == 1 ? "still has live blocks in the pool and is capturing a "
                                        "CUDA graph"
                                      : "still have live blocks in the pool or are capturing a "
                                        "CUDA graph",
                         (long long)a->lo[F_CAPTURE]);
    return sp__error(SP_ERR_BUSY, SP_SUB_SYM,
                     "%s: %s still %s live blocks in it; free them on every rank "
                     "first (nothing was destroyed)",
                     what, who, a->nbad == 1 ? "has" : "have");
}

SP_EXPORT sp_status_t sp_symmetric_mempool_destroy(sp_mempool_t *pool) {
    sp_sym_state_t *st = NULL;
    SP_CHECK(sp__sym_acquire(pool, "sp_symmetric_mempool_destroy", &st));
    ++st->callno;
    char what[128], ranks[96];
    snprintf(what, sizeof what, "sp_symmetric_mempool_destroy (call #%llu) of pool \"%s\"",
             (unsigned long long)st->callno, st->name);
    uint64_t *bits = NULL, nbits = 0;
    size_t n = 0;
    sp_agree_t a;
    /* One round agrees on the call, on "no live block and no graph capture anywhere" and on
     * the free segments. */
    sp_status_t s = agree_free(st, SP_AGREE_SYM_DESTROY, sp_mempool_used_bytes(pool) != 0, what,
                               &bits, &nbits, &a);
    if (s == SP_SUCCESS && a.nbad)
        s = destroy_refused(&a, what, ranks, sizeof ranks);
    /* A segment whose release failed on this rank (seg_err) does not stop the destroy: every
     * rank took the agreed segments off the books and goes on to destroy the pool, so this one
     * does too (kept, its pool would be one the other ranks no longer have), and says so. */
    sp_status_t seg_err = SP_SUCCESS;
    if (s == SP_SUCCESS)
        s = release_agreed(st, what, bits, nbits, &n, &seg_err);
    free(bits);
    if (s != SP_SUCCESS) {
        sp__sym_release_state(st);
        return s;
    }
    char seg_msg[512] = "";
    if (seg_err != SP_SUCCESS)
        snprintf(seg_msg, sizeof seg_msg, "%s", sp_last_error());
    /* Segments the pool kept (none expected) go with the pool's destruction; their
     * registrations, and any orphaned earlier, go here, in creation order on every rank. */
    size_t left = sp__pool_segment_count(pool);
    sp_status_t d = sp__mempool_destroy_internal(pool);
    sp_status_t r = sp__sym_release_recs(st);
    if (left)
        SP_INFO(SP_SUB_SYM, "%s: %zu segment(s) were not free everywhere", what, left);
    sp__sym_forget_pool(st);
    sp__sym_release_state(st);
    free_state(st);
    if (d == SP_SUCCESS && seg_err != SP_SUCCESS)
        return sp__error_quiet(seg_err, SP_SUB_SYM, "%s (the pool is destroyed)", seg_msg);
    return d != SP_SUCCESS ? d : r;
}

/* ---- world finalize --------------------------------------------------------------------- */

/* Before the world's finalize releases a pool's registrations (and the memory under them), its
 * free segments leave pool/'s books, as a destroy's release_seq takes them: else the segment
 * index kept ranges the device had given back, and a segment mapped there later (the next
 * world's window) met a stale one. Segments that hold live blocks stay: their blocks are
 * sympool's until sp_free (the collectives refuse them). Without host memory for the list, none
 * is detached (as before: the books keep them). */
static void detach_free_segments(sp_sym_state_t *st) {
    size_t n = 0;
    if (sp__pool_free_segments(st->pool, NULL, 0, &n) != SP_SUCCESS || n == 0)
        return;
    uint64_t *seqs = malloc(n * sizeof *seqs);
    if (seqs == NULL || sp__pool_free_segments(st->pool, seqs, n, &n) != SP_SUCCESS)
        n = 0;
    for (size_t i = 0; i < n; i++) {
        void *base = NULL;
        size_t size = 0;
        sp_stream_t stream = NULL;
        (void)sp__pool_sym_detach(st->pool, seqs[i], &base, &size, &stream);
    }
    free(seqs);
}

static bool bit_(const uint64_t *bits, uint64_t i) {
    return bits[i / 64] >> (i % 64) & 1;
}

/* The fields of finalize's round: the largest creation serial of this rank's live pools; the
 * status of a rank that could not prepare its part (0 when it could); 1 when a graph capture is
 * under way on this rank's device. */
enum { FF_TOP, FF_FAILED, FF_CAPTURE };

/* This rank's part of finalize's bitmap round, made before the first round: buf (4 * words words,
 * words covering serials [0, top]) with the two input halves of `words` words each filled as
 * agree_releasable says; NULL when host memory is short. */
static uint64_t *prepare_releasable(sp_sym_state_t **v, size_t n, uint64_t top, size_t *words_p) {
    size_t words = (size_t)(top + 1 + 63) / 64;
    uint64_t *bits = sp__sym_test_no_host ? NULL : calloc(4 * words, sizeof *bits);
    *words_p = words;
    if (!bits)
        return NULL;
    for (uint64_t q = 0; q <= top; q++)
        bits[words + q / 64] |= 1ull << (q % 64); /* absent here: cannot */
    for (size_t i = 0; i < n; i++) {
        uint64_t q = v[i]->serial;
        pthread_mutex_lock(&v[i]->lock);
        bool can = !v[i]->broken;
        pthread_mutex_unlock(&v[i]->lock);
        if (can) {
            bits[q / 64] |= 1ull << (q % 64);
            bits[words + q / 64] &= ~(1ull << (q % 64));
        }
    }
    return bits;
}

/* Which of this world's pools can be released collectively: one round agrees on the creation
 * serials, on "no graph capture under way on any rank's device" and on "every rank could
 * prepare its part" (a rank under a capture, or short of host memory, says not ok); then, unless
 * a rank said not ok, one MPI_BAND round on two bitmaps over the serials up to the smallest
 * rank's largest: [0, words) "this rank can release it" (live and not broken), [words, 2 words)
 * "this rank cannot". A pool is released only where the first is set everywhere; where neither
 * is, the ranks disagree. A pool past the bitmap is absent from some rank, so released nowhere;
 * the caller judges it from this rank's side. Each rank's buffer, made for its own largest
 * serial before the first round, is long enough: no allocation follows that round, so no rank
 * leaves its peers waiting in the second. While a rank captures, *bits_p is NULL on every rank
 * (nothing is released) and `capturing` names the ranks. `listed`: this rank could list its
 * pools (v). */
static sp_status_t agree_releasable(sp_world_t *w, sp_sym_state_t **v, size_t n, bool listed,
                                    uint64_t **bits_p, uint64_t *nbits_p, char *capturing,
                                    size_t len) {
    const char *what = "sp_world_finalize (symmetric pools)";
    uint64_t top = 0;
    for (size_t i = 0; i < n; i++)
        top = v[i]->serial > top ? v[i]->serial : top;
    size_t own = 0;
    uint64_t *bits = listed ? prepare_releasable(v, n, top, &own) : NULL;
    /* The world's device, whatever this rank's pools: the release's synchronize would break a
     * capture there, and every rank must skip the release together (it is collective). */
    bool capture = sp__pool_device_capturing(sp__world_device(w));
    sp_agree_t a = {.op = SP_AGREE_WORLD_FINALIZE,
                    .ok = !capture && bits,
                    .f = {[FF_TOP] = (int64_t)top,
                          [FF_FAILED] = bits ? SP_SUCCESS : SP_ERR_SYSTEM,
                          [FF_CAPTURE] = capture}};
    if (!bits)
        SP_WARN(SP_SUB_SYM, "%s: out of host memory for the release round", what);
    sp_status_t s = sp__world_agree(w, &a, what);
    char ranks[96];
    if (s == SP_SUCCESS && a.hi[FF_FAILED] != SP_SUCCESS)
        s = sp__error((sp_status_t)a.hi[FF_FAILED], SP_SUB_SYM,
                      "%s: %s had no host memory for the release round; no rank released a "
                      "pool's registrations (they go with the process)",
                      what, sp__agree_bad_ranks(&a, ranks, sizeof ranks));
    if (s != SP_SUCCESS || a.nbad) {
        if (s == SP_SUCCESS)
            sp__agree_bad_ranks(&a, capturing, len);
        free(bits);
        return s;
    }
    uint64_t nbits = (uint64_t)a.lo[FF_TOP] + 1;
    size_t words = (size_t)(nbits + 63) / 64; /* <= own: nbits <= top + 1 */
    if (words < own) /* the second input half starts right after the first */
        memmove(bits + words, bits + own, words * sizeof *bits);
    SP_CHECK(sp__world_band(w, bits, 2 * words, what)); /* on failure bits is gone */
    memmove(bits, bits + 2 * words, 2 * words * sizeof *bits);
    *bits_p = bits;
    *nbits_p = nbits;
    return SP_SUCCESS;
}

/* Runs in sp_world_finalize on every rank: releases, in creation order, the registrations of
 * this world's pools that are still alive (a pool never destroyed collectively), so no window
 * outlives the communicator it was made on; but only the pools every rank can release (a rank
 * whose pool a timeout broke never enters MPI_Win_free, and a peer that did would wait for it
 * forever). While a rank captures a CUDA graph, no rank releases any (finalize cannot be refused
 * as a destroy is, and the release would break the capture): they are left to process exit with
 * a warning, and finalize succeeds. The rest are left to process exit too; if the ranks disagree
 * about a pool, finalize fails on every rank with SP_ERR_TIMEOUT naming it. */
static sp_status_t on_world_finalize(sp_world_t *w, bool in_step) {
    size_t n = 0;
    sp_sym_state_t **v = NULL;
    /* Counted until every listed state is checked under its lock: a pool another thread
     * destroys meanwhile keeps its state's memory until then (sp__sym_retire). */
    sp__sym_enter();
    /* A rank that cannot list them still takes part in the round, as a failed rank. */
    bool listed = sp__sym_of_world(w, &v, &n);
    uint64_t *bits = NULL, nbits = 0;
    sp_status_t s = SP_SUCCESS;
    char capturing[96] = ""; /* the ranks under a graph capture, if any */
    if (in_step)
        s = agree_releasable(w, v, n, listed, &bits, &nbits, capturing, sizeof capturing);
    size_t words = (size_t)(nbits + 63) / 64;
    sp_status_t err = s;
    for (size_t i = 0; i < n; i++) {
        sp_sym_state_t *st = v[i];
        pthread_mutex_lock(&st->lock);
        if (st->pool == NULL) {
            /* Another thread's sp_symmetric_mempool_destroy held the lock meanwhile: the pool
             * and its state went with it, on every rank as its rounds said. */
            pthread_mutex_unlock(&st->lock);
            continue;
        }
        bool known = bits && st->serial < nbits;
        bool release = known && bit_(bits, st->serial);
        /* Past the bitmap the pool is absent from some rank: if it is whole here, the ranks
         * disagree about it (as the bitmap would have said). */
        bool split = known ? !release && !bit_(bits + words, st->serial) : bits && !st->broken;
        if (release && st->recs)
            SP_WARN(SP_SUB_SYM,
                    "symmetric pool \"%s\" still holds registered segments at "
                    "sp_world_finalize: they are released now; destroy it with "
                    "sp_symmetric_mempool_destroy before finalizing",
                    st->name);
        else if (st->recs && capturing[0])
            SP_WARN(SP_SUB_SYM,
                    "symmetric pool \"%s\": its registered segments are not released at "
                    "sp_world_finalize, on any rank: a CUDA graph capture is under way on %s "
                    "(the release would break it, and the graph may use the memory); they go "
                    "with the process. Destroy the pool with sp_symmetric_mempool_destroy after "
                    "the capture, before finalizing",
                    st->name, capturing);
        else if (st->recs)
            SP_WARN(SP_SUB_SYM,
                    "symmetric pool \"%s\"%s: its registered segments are not released at "
                    "sp_world_finalize (that is collective, and a rank may be late or gone); "
                    "they go with the process",
                    st->name,
                    st->broken ? " was broken by a timeout"
                    : split    ? " was broken by a timeout on another rank"
                    : !in_step ? " is in a world whose ranks did not all reach finalize"
                               : " could not be agreed on");
        if (split && err == SP_SUCCESS)
            err = sp__error(SP_ERR_TIMEOUT, SP_SUB_SYM,
                            "sp_world_finalize: symmetric pool \"%s\" was broken by a timeout on "
                            "some ranks only; its registered segments were released on no rank "
                            "(they go with the process)",
                            st->name);
        /* No agreement round per pool: the registrars' release needs none (MPI_Win_free
         * synchronizes the node; NCCL deregistration is local and the nccl registrar
         * synchronizes what it must). */
        if (release) {
            detach_free_segments(st);
            sp__sym_release_recs(st);
        } else if (!st->broken)
            for (sp_sym_rec_t *r; (r = pop_rec(st)) != NULL;) {
                free(r->seg.keep); /* the records only; the registrations stay */
                free(r);
            }
        /* A call on the pool that another thread makes meanwhile, waiting for the lock, then
         * finds the pool gone (sp__sym_acquire) instead of running on a freed communicator. */
        sp__sym_forget_pool(st);
        pthread_mutex_unlock(&st->lock);
        free_state(st);
    }
    sp__sym_leave();
    sp__sym_free_retired(w);
    free(bits);
    free(v);
    return err;
}

__attribute__((constructor)) static void register_hook(void) {
    sp__world_on_finalize(on_world_finalize);
}
