/*
 * 01_train_step: a data-parallel training step loop, the job sympool is for.
 *
 *   mpirun -np 4 build/examples/01_train_step [--steps N] [--scale S] [--fp32] [--out DIR]
 *
 * Every rank holds a replica of a GPT-style transformer shaped like the 2.7B model of the trace
 * tests/data/cs336-2.7b-ctx128-forward-bf16.pickle (d_model 2560, 32 layers, vocabulary 50257,
 * context 128), with d_model divided by --scale (default 16) so that four ranks fit a small
 * machine and finish in seconds.
 *  - Gradients live in buckets (as PyTorch DDP groups them, in reverse layer order) allocated
 *    once from a symmetric pool: every rank gets its buckets at the same offsets.
 *  - Each step "runs" forward (activations from the default caching allocator, a MemPool with
 *    use_on_oom standing by to lend its cached blocks if the device runs out), then backward:
 *    activations are freed in reverse order and each rank writes gradient value
 *    (rank + 1) * step into every element, and each bucket is averaged across ranks with
 *    sp_allreduce(SP_AVG). Every element must then equal (n + 1) / 2 * step exactly; the ranks
 *    count wrong elements and the step fails if any rank saw one.
 *  - After the last step: the per-rank statistics table (sp_stats_report) and one memory
 *    snapshot per rank (DIR/rank<r>.pickle, PyTorch's memory viewer opens them).
 * Exit status 0 when every step verified, 1 otherwise.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <mpi.h>

#include <sympool/collectives.h>
#include <sympool/symmetric.h>
#include <sympool/sympool.h>
#include <sympool/world.h>

#include "../common/example_util.h"

#define D_MODEL 2560
#define N_LAYERS 32
#define VOCAB 50257
#define CTX 128
#define N_HEADS 32
#define BATCH 4
#define BUCKET_CAP ((size_t)4 << 20) /* bytes per gradient bucket */
#define MAX_BUCKETS 256

typedef struct bucket {
    void *ptr;    /* symmetric allocation */
    size_t count; /* elements */
} bucket_t;

static const char *mib(double bytes, char *buf, size_t len) {
    snprintf(buf, len, "%.1f MiB", bytes / (1024.0 * 1024.0));
    return buf;
}

/* Store v in element i of a bf16 or fp32 buffer; the values used are small integers and
 * halves, exact in bfloat16 (whose bits are the float's top 16). */
static void put(void *buf, size_t i, float v, int fp32) {
    if (fp32) {
        ((float *)buf)[i] = v;
    } else {
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
    }
}

static float get(const void *buf, size_t i, int fp32) {
    if (fp32)
        return ((const float *)buf)[i];
    uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

int main(int argc, char **argv) {
    int steps = 3, scale = 16, fp32 = 0;
    const char *out_dir = "out";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--scale") && i + 1 < argc)
            scale = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--fp32"))
            fp32 = 1;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out_dir = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--steps N] [--scale S] [--fp32] [--out DIR]\n", argv[0]);
            return 2;
        }
    }
    if (steps < 1 || scale < 1 || D_MODEL % scale != 0) {
        fprintf(stderr, "--steps must be >= 1 and --scale must divide %d\n", D_MODEL);
        return 2;
    }

    sp_world_t *w = example_world_init(&argc, &argv);
    if (!w)
        return 1;
    int n = sp_world_size(w), dev = sp_world_device(w);
    if (copy_init() != 0) {
        fprintf(stderr, "rank %d: cuda backend but no libcudart to copy with\n", g_rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    sp_history_params_t hist;
    sp_history_params_init(&hist);
    hist.enabled = SP_HISTORY_ALL;
    CHECK(sp_record_memory_history(&hist));

    /* ---- the model's shapes, scaled -------------------------------------------------- */
    const size_t d = D_MODEL / (size_t)scale, ff = 4 * d, T = CTX, B = BATCH;
    const size_t esize = fp32 ? 4 : 2;
    /* Parameters in backward order: LM head, then layers N-1..0 (MLP, attention, norms), then
     * the embedding. Gradients are bucketed in that order, as DDP does. */
    size_t nparams = 0, nb = 0;
    bucket_t buckets[MAX_BUCKETS];
    size_t cur = 0;
    size_t tensors[2 + N_LAYERS * 6];
    size_t nt = 0;
    tensors[nt++] = VOCAB * d; /* lm head */
    for (int l = N_LAYERS - 1; l >= 0; l--) {
        tensors[nt++] = ff * d;    /* mlp down */
        tensors[nt++] = d * ff;    /* mlp up */
        tensors[nt++] = d * d;     /* attention out */
        tensors[nt++] = 3 * d * d; /* q, k, v */
        tensors[nt++] = 2 * d;     /* norm 1 */
        tensors[nt++] = 2 * d;     /* norm 2 */
    }
    tensors[nt++] = VOCAB * d; /* token embedding */
    size_t bucket_counts[MAX_BUCKETS];
    for (size_t t = 0; t < nt; t++) {
        nparams += tensors[t];
        if (cur > 0 && (cur + tensors[t]) * esize > BUCKET_CAP) {
            bucket_counts[nb++] = cur;
            cur = 0;
        }
        cur += tensors[t];
    }
    bucket_counts[nb++] = cur;

    char b1[32], b2[32], b3[32];
    if (g_rank == 0) {
        printf("01_train_step: %d ranks, backend %s, 2.7B transformer shapes scaled by 1/%d in "
               "d_model\n",
               n, sp_backend_name(), scale);
        printf("  d_model %zu (of %d), %d layers, vocab %d, ctx %zu, batch %zu: %.1fM parameters, "
               "%s gradients (%s) in %zu buckets (cap %s; a larger tensor gets its own)\n",
               d, D_MODEL, N_LAYERS, VOCAB, T, B, nparams / 1e6, fp32 ? "fp32" : "bf16",
               mib((double)(nparams * esize), b1, sizeof b1), nb,
               mib((double)BUCKET_CAP, b2, sizeof b2));
    }

    /* ---- pools: symmetric gradients, a use_on_oom fallback for activations ------------- */
    sp_mempool_params_t pp;
    sp_mempool_params_init(&pp);
    pp.name = "grads";
    sp_mempool_t *grads = NULL;
    CHECK(sp_symmetric_mempool_create(w, &pp, &grads));
    for (size_t b = 0; b < nb; b++) {
        buckets[b].count = bucket_counts[b];
        CHECK(sp_symmetric_malloc(grads, bucket_counts[b] * esize, NULL, &buckets[b].ptr));
    }
    sp_mempool_params_init(&pp);
    pp.name = "activation_fallback";
    pp.use_on_oom = true;
    pp.device = dev;
    sp_mempool_t *fallback = NULL;
    CHECK(sp_mempool_create(&pp, &fallback));
    {
        /* Warm the fallback: its cached (free) blocks are what it lends on OOM. */
        void *p = NULL;
        CHECK(sp_mempool_malloc(fallback, (size_t)64 << 20, NULL, &p));
        CHECK(sp_free(p));
    }
    int64_t *bad_dev = NULL, bad = 0; /* wrong elements, summed across ranks with sp_allreduce */
    CHECK(sp_malloc(sizeof bad, dev, NULL, (void **)&bad_dev));
    size_t max_bucket = 0;
    for (size_t b = 0; b < nb; b++)
        max_bucket = bucket_counts[b] > max_bucket ? bucket_counts[b] : max_bucket;
    void *staging = NULL; /* host copy of one bucket (cuda backend only) */
    if (g_cuda_memcpy && (staging = malloc(max_bucket * esize)) == NULL) {
        fprintf(stderr, "rank %d: out of host memory\n", g_rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    static const char zeros[64];

    /* Activations saved for backward, per layer: input, qkv, attention scores, attention
     * output, MLP hidden; then the logits. */
    const size_t per_layer[5] = {B * T * d, 3 * B * T * d, B * N_HEADS * T * T, B * T * d,
                                 B * T * ff};
    void *acts[N_LAYERS * 5 + 1];
    int failed = 0;
    for (int step = 1; step <= steps; step++) {
        double t0 = MPI_Wtime();
        size_t na = 0;
        for (int l = 0; l < N_LAYERS; l++)
            for (int k = 0; k < 5; k++) {
                CHECK(sp_malloc(per_layer[k] * 2, dev, NULL, &acts[na]));
                copy(acts[na], zeros, sizeof zeros); /* a kernel would write it */
                na++;
            }
        CHECK(sp_malloc(B * T * VOCAB * 2, dev, NULL, &acts[na++]));
        double act_peak = (double)sp_memory_allocated(dev);

        /* Backward: free activations in reverse, fill and average each bucket. */
        double t_ar = 0;
        int64_t wrong = 0;
        double checksum = 0;
        float expect = (float)(n + 1) / 2.0f * (float)step;
        for (size_t b = 0; b < nb; b++) {
            for (size_t k = 0; k < na / nb + 1 && na > 0; k++)
                CHECK(sp_free(acts[--na]));
            void *host = staging ? staging : buckets[b].ptr;
            size_t bytes = buckets[b].count * esize;
            for (size_t i = 0; i < buckets[b].count; i++)
                put(host, i, (float)(g_rank + 1) * (float)step, fp32);
            if (staging)
                copy(buckets[b].ptr, staging, bytes);
            double a0 = MPI_Wtime();
            CHECK(sp_allreduce(w, buckets[b].ptr, buckets[b].ptr, buckets[b].count,
                               fp32 ? SP_FLOAT32 : SP_BFLOAT16, SP_AVG, NULL));
            if (staging)
                copy(staging, buckets[b].ptr, bytes); /* waits for the allreduce */
            t_ar += MPI_Wtime() - a0;
            for (size_t i = 0; i < buckets[b].count; i++) {
                float v = get(host, i, fp32);
                checksum += v;
                wrong += v != expect;
            }
        }
        while (na > 0)
            CHECK(sp_free(acts[--na]));
        copy(bad_dev, &wrong, sizeof wrong);
        CHECK(sp_allreduce(w, bad_dev, bad_dev, 1, SP_INT64, SP_SUM, NULL));
        copy(&bad, bad_dev, sizeof bad);
        double t_step = MPI_Wtime() - t0;
        if (bad != 0)
            failed = 1;
        if (g_rank == 0)
            printf("step %d/%d: allreduce %zu buckets %6.1f ms, step %6.1f ms | mean grad %.4f "
                   "(expect %.4f) %s | activations %s, reserved %s\n",
                   step, steps, nb, t_ar * 1e3, t_step * 1e3, checksum / (double)nparams,
                   (double)expect, bad == 0 ? "ok" : "WRONG", mib(act_peak, b1, sizeof b1),
                   mib((double)sp_memory_reserved(dev), b3, sizeof b3));
        if (g_rank == 0 && bad != 0)
            printf("  %lld gradient elements differ from the expected average across ranks\n",
                   (long long)bad);
        fflush(stdout);
    }

    /* ---- statistics across ranks, snapshots per rank --------------------------------- */
    /* With SYMPOOL_REPORT set, sp_world_finalize prints the report: one table, not two alike. */
    const char *at_exit = getenv("SYMPOOL_REPORT");
    bool report_at_exit = at_exit != NULL && *at_exit != '\0' && strcmp(at_exit, "none") != 0;
    if (g_rank == 0 && report_at_exit)
        printf("\n(statistics across ranks: SYMPOOL_REPORT=%s prints them at sp_world_finalize)\n",
               at_exit);
    else if (g_rank == 0)
        printf("\n");
    if (!report_at_exit)
        CHECK(sp_stats_report(w, dev, stdout, SP_REPORT_TABLE));
    if (mkdir(out_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "rank %d: cannot create %s: %s\n", g_rank, out_dir, strerror(errno));
        failed = 1;
    } else {
        char path[4096];
        snprintf(path, sizeof path, "%s/rank%d.pickle", out_dir, g_rank);
        CHECK(sp_dump_snapshot(path));
        MPI_Barrier(MPI_COMM_WORLD);
        if (g_rank == 0)
            printf("\nsnapshots: %s/rank0.pickle .. rank%d.pickle (drag one onto "
                   "https://pytorch.org/memory_viz)\n",
                   out_dir, n - 1);
    }

    CHECK(sp_free(bad_dev));
    free(staging);
    for (size_t b = 0; b < nb; b++)
        CHECK(sp_free(buckets[b].ptr));
    CHECK(sp_symmetric_mempool_destroy(grads));
    CHECK(sp_mempool_destroy(fallback));
    CHECK(sp_world_finalize(w));
    if (g_rank == 0)
        printf("%s\n", failed ? "FAILED" : "done: every step verified on every rank");
    return failed;
}
