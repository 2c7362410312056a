/*
 * stats_report.c: every memory_stats key (and the symmetric pools' counters) reduced across the
 * world's ranks in ONE collective, and the report rank 0 writes from it: a table for people,
 * JSON for programs, Prometheus text exposition for scrapers. SYMPOOL_REPORT=table|table_all|
 * json|prometheus prints it at sp_world_finalize (a hook registered from a library constructor),
 * to stdout or to SYMPOOL_REPORT_FILE (%h %p %r), where it is the file's only content.
 *
 * The collective is one MPI_Allreduce over an array of records {min, max, sum, min_rank,
 * max_rank} with a user-defined, commutative op (ties go to the lower rank, so the result does
 * not depend on MPI's reduction order). It follows an agreement round: a rank whose own
 * arguments or stats failed, or that could not prepare (the MPI datatype and op; on rank 0 of a
 * report its tables, see prep_t), says so there, so every rank returns an error and none is left
 * waiting in a collective that has no deadline. Prometheus needs every rank's value, which a
 * min/max summary cannot give: only that format adds a second collective (MPI_Gather to rank 0).
 *
 * No locks: the MPI datatype and op are created and freed within each call.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/dtype.h"
#include "core/core.h"
#include "core/core_emit.h"
#include "world/world.h"
#include "symmetric/symmetric.h"

/* One key's reduction across ranks. */
typedef struct agg {
    int64_t min;      /* smallest value over ranks */
    int64_t max;      /* largest value over ranks */
    int64_t sum;      /* sum over ranks (wraps like int64) */
    int32_t min_rank; /* lowest rank holding min */
    int32_t max_rank; /* lowest rank holding max */
} agg_t;

/* The symmetric pools' counters, then this world's counts of collectives that could or could not
 * use symmetric kernels. */
enum { N_SYMC = SP_SYMC_COUNT, N_SYM = SP_SYMC_COUNT + 2 };
#define X(e, field, help) #field,
static const char *const sym_names[N_SYM] = {SP_SYMC_LIST(X) "collectives_eligible",
                                             "collectives_fallback"};
#undef X
#define X(e, field, help) help,
static const char *const sym_help[N_SYM] = {
    SP_SYMC_LIST(X) "collectives on this world whose buffers could use symmetric kernels (both in "
                    "registered symmetric segments; on cuda also a dtype and op NCCL's symmetric "
                    "kernels take)",
    "collectives on this world that could not (SYMPOOL_DEBUG=INFO says why)"};
#undef X

/* Keys after memory_stats' own: the device's view of its memory (sp_device_usage). */
enum { N_DEV = 2 };
static const char *const dev_names[N_DEV] = {"device.used_bytes", "device.untracked_bytes"};

static size_t mem_keys(void) {
    size_t n = sp_stats_count();
    return n > SP_STATS_MAX - N_DEV ? SP_STATS_MAX - N_DEV : n;
}

SP_EXPORT size_t sp_stats_summary_count(void) {
    return mem_keys() + N_DEV;
}

SP_EXPORT const char *sp_stats_summary_key(size_t i) {
    size_t n = mem_keys();
    if (i < n)
        return sp_stats_key(i);
    return i - n < N_DEV ? dev_names[i - n] : NULL;
}
#define skey sp_stats_summary_key

/* Everything one report needs: the summary plus the symmetric counters' records. */
typedef struct gathered {
    size_t nkeys;                       /* sp_stats_summary_count() */
    int nranks;                         /* world size */
    const sp_world_t *w;                /* the world (node of each rank: local queries) */
    int nnodes;                         /* sp_world_node_count(w) */
    agg_t *nodes;                       /* rank 0, when asked: [nnodes][nkeys + N_SYM] */
    unsigned char *twin;                /* rank 0, when asked: [nnodes], 1: name not unique */
    int64_t *rows;                      /* rank 0 of Prometheus: [nranks][nkeys + N_SYM] */
    int worst_w;                        /* width of the table's "worst" column */
    int dev_lo, dev_hi;                 /* the smallest and largest device the ranks reported */
    agg_t stats[SP_STATS_MAX];          /* per summary key (memory_stats, then device.*) */
    agg_t sym[N_SYM];                   /* per symmetric counter */
    int64_t mine[SP_STATS_MAX + N_SYM]; /* this rank's values: stats then counters */
} gathered_t;

static void combine(void *in_v, void *inout_v, int *len, MPI_Datatype *type) {
    (void)type;
    const agg_t *in = in_v;
    agg_t *io = inout_v;
    for (int i = 0; i < *len; i++) {
        if (in[i].min < io[i].min || (in[i].min == io[i].min && in[i].min_rank < io[i].min_rank)) {
            io[i].min = in[i].min;
            io[i].min_rank = in[i].min_rank;
        }
        if (in[i].max > io[i].max || (in[i].max == io[i].max && in[i].max_rank < io[i].max_rank)) {
            io[i].max = in[i].max;
            io[i].max_rank = in[i].max_rank;
        }
        io[i].sum = (int64_t)((uint64_t)io[i].sum + (uint64_t)in[i].sum);
    }
}

/* What gather_all and the report's gathers need before any rank moves data. It is had before
 * their agreement round, whose ok flag carries the outcome, because a rank that found itself
 * short after the round would return while its peers wait in MPI_Allreduce, MPI_Gatherv or
 * MPI_Gather, which have no deadline. Rank 0's tables exist only on rank 0 of a report. */
typedef struct prep {
    MPI_Datatype type;    /* agg_t as bytes (MPI_DATATYPE_NULL until made) */
    MPI_Op op;            /* combine (MPI_OP_NULL until made) */
    int *counts, *displs; /* rank 0 of a report: gather_nodes' MPI_Gatherv, [nranks] each */
    agg_t *nodes;         /* rank 0 of a report: the nodes' records, [nnodes][nrec] */
    unsigned char *twin;  /* rank 0 of a report: [nnodes], 1 for a name another node has too */
    int64_t *rows;        /* rank 0 of a Prometheus report: every rank's values, [nranks][nrec-1] */
} prep_t;

static _Atomic int s_test_fail_prep; /* sp__stats_test_fail_prep */

void sp__stats_test_fail_prep(int which) {
    s_test_fail_prep = which;
}

static void prep_free(prep_t *p) {
    if (p->op != MPI_OP_NULL)
        MPI_Op_free(&p->op);
    if (p->type != MPI_DATATYPE_NULL)
        MPI_Type_free(&p->type);
    free(p->counts);
    free(p->displs);
    free(p->nodes);
    free(p->twin);
    free(p->rows);
}

/* One node's name and index, to find the names that several nodes share. */
typedef struct {
    const char *name;
    int node;
} named_t;

static int by_name(const void *a, const void *b) {
    const named_t *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->node > y->node) - (x->node < y->node);
}

/* twin[k] = 1 when another node of the world has node k's name: host names are cut at the first
 * dot (gpu01.rack1 and gpu01.rack2 are both gpu01), and hosts or containers may share a name
 * outright, while MPI still makes them distinct nodes. The reports then label such a node with
 * its index too, so that nothing sums two nodes as one (Prometheus' sum by (node)). Sorting
 * makes it O(n log n) in the nodes. False when memory is short. */
static bool find_twins(const sp_world_t *w, int nnodes, unsigned char *twin) {
    named_t *v = malloc((size_t)nnodes * sizeof *v);
    if (!v)
        return false;
    for (int k = 0; k < nnodes; k++) {
        const char *name = sp_world_node_name(w, k);
        v[k] = (named_t){name ? name : "", k};
        twin[k] = 0;
    }
    qsort(v, (size_t)nnodes, sizeof *v, by_name);
    for (int i = 1; i < nnodes; i++)
        if (strcmp(v[i - 1].name, v[i].name) == 0)
            twin[v[i - 1].node] = twin[v[i].node] = 1;
    free(v);
    return true;
}

/* Makes *p (every member NULL before) for nrec records; `rank0_tables`: rank 0 of a report.
 * Returns the first failure's status, logged and in sp_last_error() (which the caller keeps).
 * Local. */
static sp_status_t prepare(const gathered_t *g, size_t nrec, bool rank0_tables, int format,
                           const char *fn, prep_t *p) {
    int fail = s_test_fail_prep;
    int rc = MPI_Type_contiguous((int)sizeof(agg_t), MPI_BYTE, &p->type);
    if (rc != MPI_SUCCESS) {
        p->type = MPI_DATATYPE_NULL;
        return sp__mpi_status(rc, SP_SUB_COLL, fn, "MPI_Type_contiguous");
    }
    MPI_Type_commit(&p->type);
    rc = fail == SP_STATS_TEST_FAIL_OP ? MPI_ERR_OP : MPI_Op_create(combine, 1, &p->op);
    if (rc != MPI_SUCCESS) {
        p->op = MPI_OP_NULL;
        return sp__mpi_status(rc, SP_SUB_COLL, fn, "MPI_Op_create");
    }
    if (!rank0_tables)
        return SP_SUCCESS;
    size_t n = (size_t)g->nranks, nn = (size_t)g->nnodes;
    bool prom = format == SP_REPORT_PROMETHEUS;
    p->counts = calloc(n, sizeof *p->counts);
    p->displs = calloc(n, sizeof *p->displs);
    p->nodes = malloc(nn * nrec * sizeof *p->nodes);
    p->twin = malloc(nn);
    p->rows = prom ? malloc(n * (nrec - 1) * sizeof *p->rows) : NULL;
    if (!p->counts || !p->displs || !p->nodes || !p->twin || (prom && !p->rows) ||
        !find_twins(g->w, g->nnodes, p->twin) || fail == SP_STATS_TEST_FAIL_TABLES)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_COLL,
                         "%s: out of host memory for rank 0's tables (%d ranks on %d nodes)", fn,
                         g->nranks, g->nnodes);
    return SP_SUCCESS;
}

/* The outcome of the agreement round on every rank: this rank's own failure (its arguments or
 * stats: `reason`; its preparation: `mine`, whose text `reason` holds too), or the failed ranks'
 * (f[2] carries each rank's preparation status, 0 for an argument, so the peers of a rank that
 * could not prepare return its status). */
static sp_status_t round_status(const sp_agree_t *a, bool local_ok, sp_status_t mine,
                                const char *reason, const char *fn) {
    if (!local_ok)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_COLL, "%s: %s", fn, reason);
    if (mine != SP_SUCCESS) /* prepare() logged it: only its text again, after the round */
        return sp__error_quiet(mine, SP_SUB_COLL, "%s", reason);
    char ranks[96];
    if (a->nbad && a->hi[2] != SP_SUCCESS)
        return sp__error((sp_status_t)a->hi[2], SP_SUB_COLL,
                         "%s: %s could not prepare the call (out of host memory, or MPI refused "
                         "a datatype or op; its log says why); no rank moved any data",
                         fn, sp__agree_bad_ranks(a, ranks, sizeof ranks));
    if (a->nbad)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_COLL,
                         "%s: %s rejected its arguments (its log says why)", fn,
                         sp__agree_bad_ranks(a, ranks, sizeof ranks));
    return SP_SUCCESS;
}

/* Per-node aggregates, for the report: the same reduction within each node (to its lowest rank),
 * then the node leaders' results to rank 0 (into p's tables, made before the agreement). Two
 * steps instead of gathering every rank's record at rank 0: rank 0 receives one record set per
 * node, not per rank. Runs after the agreement and the job-wide reduction, so every rank is known
 * to be here and to have what it needs. */
static sp_status_t gather_nodes(sp_world_t *w, const agg_t *rec, size_t nrec, prep_t *p,
                                const char *fn, gathered_t *g) {
    int rank = sp_world_rank(w), n = sp_world_size(w);
    agg_t node_res[SP_STATS_MAX + N_SYM + 1];
    int rc = MPI_Reduce(rec, node_res, (int)nrec, p->type, p->op, 0, sp__world_node_comm(w));
    if (rc != MPI_SUCCESS)
        return sp__mpi_status(rc, SP_SUB_COLL, fn, "MPI_Reduce over the node");
    int send = sp_world_local_rank(w) == 0 ? (int)nrec : 0;
    int seen = -1; /* nodes are numbered by their lowest rank: leaders come in node order */
    for (int r = 0; rank == 0 && r < n; r++)
        if (sp_world_node(w, r) > seen) {
            seen = sp_world_node(w, r);
            p->counts[r] = (int)nrec;
            p->displs[r] = seen * (int)nrec;
        }
    rc = MPI_Gatherv(node_res, send, p->type, p->nodes, p->counts, p->displs, p->type, 0,
                     sp__world_comm(w));
    if (rc != MPI_SUCCESS)
        return sp__mpi_status(rc, SP_SUB_COLL, fn, "MPI_Gatherv of the node aggregates");
    g->nodes = p->nodes; /* rank 0's; NULL elsewhere */
    p->nodes = NULL;
    return SP_SUCCESS;
}

/* The one collective, after the agreement: the job-wide reduction of rec (nrec records), then a
 * report's per-node one. */
static sp_status_t reduce_all(sp_world_t *w, agg_t *rec, size_t nrec, bool per_node, prep_t *p,
                              const char *fn, gathered_t *g) {
    int n = g->nranks;
    agg_t res[SP_STATS_MAX + N_SYM + 1];
    int rc = MPI_Allreduce(rec, res, (int)nrec, p->type, p->op, sp__world_comm(w));
    if (rc != MPI_SUCCESS)
        return sp__mpi_status(rc, SP_SUB_COLL, fn, "MPI_Allreduce");
    if (per_node)
        SP_CHECK(gather_nodes(w, rec, nrec, p, fn, g));
    if (res[nrec - 1].max > 0)
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_COLL,
                         "%s: rank %d rejected its arguments (its log says why)", fn,
                         (int)(n - res[nrec - 1].max));
    memcpy(g->stats, res, g->nkeys * sizeof(agg_t));
    memcpy(g->sym, res + g->nkeys, N_SYM * sizeof(agg_t));
    g->rows = p->rows; /* rank 0 of a Prometheus report; sp_stats_report gathers into it */
    p->rows = NULL;
    g->twin = p->twin; /* rank 0 of a report */
    p->twin = NULL;
    return SP_SUCCESS;
}

/* This rank's values into g->mine. False, with why, when its device has no statistics. */
static bool own_values(sp_world_t *w, int device, gathered_t *g, char *why, size_t len) {
    size_t nmem = mem_keys(), nkeys = g->nkeys;
    sp_stats_t st;
    sp_device_usage_t u;
    if (sp_memory_stats(device, &st) != SP_SUCCESS || sp_device_usage(device, &u) != SP_SUCCESS) {
        snprintf(why, len, "device %d has no statistics: %s", device, sp_last_error());
        return false;
    }
    for (size_t i = 0; i < nmem; i++)
        g->mine[i] = st.value[i];
    g->mine[nmem] = (int64_t)u.used;
    g->mine[nmem + 1] = (int64_t)u.untracked;
    sp_sym_counters_t sc;
    sp__symmetric_counters(device, &sc);
    uint64_t eligible = 0, fallback = 0;
    sp__world_collective_counts(w, &eligible, &fallback);
#define X(e, field, help) sc.field,
    int64_t cv[N_SYM] = {SP_SYMC_LIST(X)(int64_t) eligible, (int64_t)fallback};
#undef X
    memcpy(g->mine + nkeys, cv, sizeof cv);
    return true;
}

/* A format's name in messages (the enum's, as sympool.h spells it). */
static const char *format_name(int format) {
    static const char *const names[] = {"SP_REPORT_TABLE", "SP_REPORT_JSON", "SP_REPORT_PROMETHEUS",
                                        "SP_REPORT_TABLE_ALL"};
    return format >= 0 && format < (int)(sizeof names / sizeof names[0]) ? names[format] : "?";
}

/* The one collective. local_ok false (with why) marks this rank's arguments bad: it still joins
 * the agreement round and then every rank returns SP_ERR_INVALID_ARGUMENT. `format` (the
 * report's, -1 for the aggregate) is agreed too: only a Prometheus report gathers every rank's
 * row after this, so a rank with another format would leave rank 0 alone in that gather. */
static sp_status_t gather_all(sp_world_t *w, int device, int format, bool local_ok, const char *why,
                              const char *fn, bool per_node, gathered_t *g) {
    int rank = sp_world_rank(w), n = sp_world_size(w);
    size_t nkeys = mem_keys() + N_DEV, nrec = nkeys + N_SYM + 1;
    char reason[256];
    snprintf(reason, sizeof reason, "%s", why ? why : "");
    memset(g, 0, sizeof *g);
    g->nkeys = nkeys;
    g->nranks = n;
    g->w = w;
    g->nnodes = sp_world_node_count(w);
    if (local_ok)
        local_ok = own_values(w, device, g, reason, sizeof reason);
    prep_t p = {MPI_DATATYPE_NULL, MPI_OP_NULL, NULL, NULL, NULL, NULL, NULL};
    sp_status_t mine = SP_SUCCESS;
    if (local_ok && (mine = prepare(g, nrec, per_node && rank == 0, format, fn, &p)) != SP_SUCCESS)
        snprintf(reason, sizeof reason, "%s", sp_last_error());
    /* The agreement round every collective sympool call starts with (world/agree.c): bounded
     * by SYMPOOL_SYM_TIMEOUT, and a rank in another call is SP_ERR_MISMATCH naming both. After
     * it the reduction is the data transfer, MPI's business. */
    sp_agree_t a = {.op = strcmp(fn, "sp_stats_report") == 0 ? SP_AGREE_STATS_REPORT
                                                             : SP_AGREE_STATS_AGGREGATE,
                    .ok = local_ok && mine == SP_SUCCESS,
                    .f = {(int64_t)nkeys, format, (int64_t)mine, device}};
    sp_status_t st = sp__world_agree(w, &a, fn);
    /* Each rank reports its own device (on cuda its local rank's): the report names them all. */
    g->dev_lo = (int)a.lo[3];
    g->dev_hi = (int)a.hi[3];
    if (st == SP_SUCCESS)
        st = round_status(&a, local_ok, mine, reason, fn);
    if (st == SP_SUCCESS && a.lo[1] != a.hi[1])
        st = sp__error(SP_ERR_MISMATCH, SP_SUB_COLL,
                       "%s: ranks passed different formats (this rank: %s); every rank must "
                       "pass the same format",
                       fn, format_name(format));
    agg_t rec[SP_STATS_MAX + N_SYM + 1];
    for (size_t i = 0; i < nkeys + N_SYM; i++)
        rec[i] = (agg_t){g->mine[i], g->mine[i], g->mine[i], rank, rank};
    rec[nrec - 1] = (agg_t){0, 0, 0, rank, rank}; /* the error record: every rank is fine here */
    if (st == SP_SUCCESS)
        st = reduce_all(w, rec, nrec, per_node, &p, fn, g);
    prep_free(&p);
    return st;
}

SP_EXPORT sp_status_t sp_stats_aggregate(sp_world_t *w, int device, sp_stats_summary_t *summary_p) {
    SP_CHECK(sp__world_check(w, "sp_stats_aggregate"));
    /* On the stack (about 8 KiB): a failed malloc would return before the agreement round and
     * leave the peers waiting there until its deadline. */
    gathered_t gathered, *g = &gathered;
    bool ok = summary_p != NULL;
    sp_status_t st =
        gather_all(w, device, -1, ok, "summary_p is NULL", "sp_stats_aggregate", false, g);
    if (st == SP_SUCCESS) {
        sp_stats_summary_t s;
        memset(&s, 0, sizeof s);
        for (size_t i = 0; i < g->nkeys; i++) {
            s.min[i] = g->stats[i].min;
            s.max[i] = g->stats[i].max;
            s.sum[i] = g->stats[i].sum;
            s.min_rank[i] = g->stats[i].min_rank;
            s.max_rank[i] = g->stats[i].max_rank;
        }
        s.nranks = g->nranks;
        *summary_p = s;
    }
    return st;
}

/* ---- formatting ------------------------------------------------------------------------- */

static bool is_bytes_key(const char *key) {
    return strstr(key, "bytes") != NULL || strcmp(key, "max_split_size") == 0;
}

/* "1.50 GiB", "512 B"; raw number for negative values (max_split_size's "unlimited"). */
static const char *human(double v, bool bytes, char *buf, size_t len) {
    if (!bytes || v < 0) {
        if (v == (double)(int64_t)v)
            snprintf(buf, len, "%" PRId64, (int64_t)v);
        else
            snprintf(buf, len, "%.2f", v);
        return buf;
    }
    return sp__size_format(v, SP_SIZE_HUMAN, buf, len);
}

/* Rows where the largest rank exceeds the mean by this much are marked: that rank is the one
 * to look at (a leak, a skewed shard, a straggler's cache). */
#define IMBALANCE_MARK 1.10

/* A node as the reports name it: its host name, and "name#k" (k its index, as JSON's "node")
 * when another node of the world has that name too (find_twins). */
#define NODE_LABEL (SP_WORLD_NODE_NAME + 16)
static const char *node_label(const gathered_t *g, int node, char *buf, size_t len) {
    const char *name = sp_world_node_name(g->w, node);
    if (!name)
        return "?";
    if (!g->twin || !g->twin[node])
        return name;
    snprintf(buf, len, "%s#%d", name, node);
    return buf;
}

/* "3@node7": a rank with the name of its node. */
static const char *rank_at(const gathered_t *g, int rank, char *buf, size_t len) {
    char label[NODE_LABEL];
    snprintf(buf, len, "%d@%s", rank,
             node_label(g, sp_world_node(g->w, rank), label, sizeof label));
    return buf;
}

static void table_row(FILE *out, const gathered_t *g, const char *key, const agg_t *a, bool bytes) {
    int n = g->nranks;
    char mn[32], me[32], mx[32], imb[16], worst[NODE_LABEL + 16];
    double mean = (double)a->sum / n;
    double ratio = mean > 0 ? (double)a->max / mean : 0;
    if (mean > 0)
        snprintf(imb, sizeof imb, "%.2f%s", ratio, ratio >= IMBALANCE_MARK ? " *" : "");
    else
        snprintf(imb, sizeof imb, "-");
    /* With every rank equal there is no worst rank. */
    if (a->min == a->max)
        snprintf(worst, sizeof worst, "-");
    else
        rank_at(g, a->max_rank, worst, sizeof worst);
    fprintf(out, "%-42s %12s %12s %12s %*s  %s\n", key, human((double)a->min, bytes, mn, sizeof mn),
            human(mean, bytes, me, sizeof me), human((double)a->max, bytes, mx, sizeof mx),
            g->worst_w, worst, imb);
}

static bool all_zero(const agg_t *a) {
    return a->min == 0 && a->max == 0;
}

/* The keys a person checks first: how much is in use and held, peaks, fragmentation, trouble. */
static const char *const headline[] = {"allocated_bytes.all.current",
                                       "allocated_bytes.all.peak",
                                       "reserved_bytes.all.current",
                                       "reserved_bytes.all.peak",
                                       "requested_bytes.all.peak",
                                       "inactive_split_bytes.all.current",
                                       "num_device_alloc",
                                       "num_alloc_retries",
                                       "num_ooms",
                                       "device.used_bytes",
                                       "device.untracked_bytes"};
#define N_HEADLINE (sizeof headline / sizeof headline[0])

static bool is_headline(const char *key) {
    for (size_t h = 0; h < N_HEADLINE; h++)
        if (strcmp(key, headline[h]) == 0)
            return true;
    return false;
}

static double imbalance(const agg_t *a, int n) {
    double mean = (double)a->sum / n;
    return mean > 0 ? (double)a->max / mean : 0;
}

static void table_head(FILE *out, gathered_t *g) {
    /* The "worst" column fits the longest rank@node. */
    g->worst_w = 6;
    for (int k = 0; k < g->nnodes; k++) {
        char label[NODE_LABEL];
        int len =
            (int)snprintf(NULL, 0, "%d@%s", g->nranks - 1, node_label(g, k, label, sizeof label));
        if (len > g->worst_w)
            g->worst_w = len;
    }
    if (g->dev_lo == g->dev_hi)
        fprintf(out, "sympool memory statistics: %d rank(s) on %d node(s), device %d, backend %s\n",
                g->nranks, g->nnodes, g->dev_lo, sp_backend_name());
    else /* the root's device alone would pass for every rank's */
        fprintf(out,
                "sympool memory statistics: %d rank(s) on %d node(s), devices %d to %d (each "
                "rank its own), backend %s\n",
                g->nranks, g->nnodes, g->dev_lo, g->dev_hi, sp_backend_name());
    fprintf(out, "%-42s %12s %12s %12s %*s  %s\n", "key", "min", "mean", "max", g->worst_w, "worst",
            "max/mean");
    fprintf(out, "-- key figures\n");
    for (size_t h = 0; h < N_HEADLINE; h++)
        for (size_t i = 0; i < g->nkeys; i++)
            if (strcmp(skey(i), headline[h]) == 0)
                table_row(out, g, headline[h], &g->stats[i], is_bytes_key(headline[h]));
}

/* Per-node sums of the figures that add up across ranks, most reserved first; the rank holding
 * the most reserved memory on each node. Only when the job spans nodes. */
#define NODE_ROWS 16
static void table_nodes(FILE *out, const gathered_t *g) {
    if (g->nnodes < 2 || g->nodes == NULL)
        return;
    static const char *const cols[] = {"allocated_bytes.all.current", "reserved_bytes.all.current",
                                       "device.used_bytes", "device.untracked_bytes"};
    static const char *const heads[] = {"allocated", "reserved", "device used", "untracked"};
    enum { NC = sizeof cols / sizeof cols[0] };
    size_t idx[NC];
    for (int c = 0; c < NC; c++)
        for (size_t i = 0; i < g->nkeys; i++)
            if (strcmp(skey(i), cols[c]) == 0)
                idx[c] = i;
    size_t stride = g->nkeys + N_SYM + 1, rsv = idx[1];
    int order[NODE_ROWS], m = 0;
    /* The NODE_ROWS nodes with the most reserved, by insertion (ties: lower node first). */
    for (int k = 0; k < g->nnodes; k++) {
        int64_t v = g->nodes[(size_t)k * stride + rsv].sum;
        int at = m < NODE_ROWS ? m++ : NODE_ROWS;
        while (at > 0 && g->nodes[(size_t)order[at - 1] * stride + rsv].sum < v) {
            if (at < NODE_ROWS)
                order[at] = order[at - 1];
            at--;
        }
        if (at < NODE_ROWS)
            order[at] = k;
    }
    if (m < g->nnodes)
        fprintf(out,
                "-- per node (%d nodes; the %d with most reserved): sums over the node's "
                "ranks\n",
                g->nnodes, m);
    else
        fprintf(out, "-- per node (%d nodes): sums over the node's ranks\n", g->nnodes);
    fprintf(out, "%-24s %5s %12s %12s %12s %12s  %s\n", "node", "ranks", heads[0], heads[1],
            heads[2], heads[3], "most reserved");
    for (int j = 0; j < m; j++) {
        const agg_t *a = &g->nodes[(size_t)order[j] * stride];
        int ranks = 0;
        for (int r = 0; r < g->nranks; r++)
            ranks += sp_world_node(g->w, r) == order[j];
        char v[NC][32], worst[NODE_LABEL + 16], label[NODE_LABEL];
        for (int c = 0; c < NC; c++)
            human((double)a[idx[c]].sum, true, v[c], sizeof v[c]);
        fprintf(out, "%-24s %5d %12s %12s %12s %12s  %s\n",
                node_label(g, order[j], label, sizeof label), ranks, v[0], v[1], v[2], v[3],
                rank_at(g, a[rsv].max_rank, worst, sizeof worst));
    }
}

static void table_symmetric(FILE *out, const gathered_t *g) {
    fprintf(out, "-- symmetric pools\n");
    for (int j = 0; j < N_SYM; j++) {
        char key[64];
        snprintf(key, sizeof key, "symmetric.%s", sym_names[j]);
        table_row(out, g, key, &g->sym[j], false);
    }
}

static void table_legend(FILE *out) {
    fprintf(out,
            "worst: the rank holding the max (lowest on ties) @ its node; * marks max/mean >= "
            "%.2f\n",
            IMBALANCE_MARK);
}

/* The default table: the key figures, then the keys where one rank stands out (most imbalanced
 * first), the symmetric counters if any pool exists, and one line saying how to see the rest. */
static void write_table(FILE *out, gathered_t *g) {
    int n = g->nranks;
    table_head(out, g);
    size_t order[SP_STATS_MAX], m = 0, nonzero = 0;
    for (size_t i = 0; i < g->nkeys; i++) {
        nonzero += !all_zero(&g->stats[i]);
        if (!is_headline(skey(i)) && imbalance(&g->stats[i], n) >= IMBALANCE_MARK)
            order[m++] = i;
    }
    /* Insertion sort by imbalance, descending (at most SP_STATS_MAX keys). */
    for (size_t a = 1; a < m; a++)
        for (size_t b = a;
             b > 0 && imbalance(&g->stats[order[b]], n) > imbalance(&g->stats[order[b - 1]], n);
             b--) {
            size_t t = order[b];
            order[b] = order[b - 1];
            order[b - 1] = t;
        }
    if (m == 0) {
        fprintf(out, "-- imbalanced keys: none (no key has max/mean >= %.2f)\n", IMBALANCE_MARK);
    } else {
        size_t shown = m < 12 ? m : 12;
        fprintf(out, "-- imbalanced keys (max/mean >= %.2f): %zu, most imbalanced first%s\n",
                IMBALANCE_MARK, m, shown < m ? "; the first 12" : "");
        for (size_t k = 0; k < shown; k++)
            table_row(out, g, skey(order[k]), &g->stats[order[k]], is_bytes_key(skey(order[k])));
    }
    bool sym = false;
    for (int j = 0; j < N_SYM; j++)
        sym |= !all_zero(&g->sym[j]);
    if (sym)
        table_symmetric(out, g);
    table_nodes(out, g);
    fprintf(out,
            "-- %zu of %zu keys are non-zero; every key: SYMPOOL_REPORT=table_all "
            "(SP_REPORT_TABLE_ALL), or json/prometheus\n",
            nonzero, g->nkeys);
    table_legend(out);
}

/* The full table: the key figures, every key that is not zero everywhere, the symmetric
 * counters, and the names of the keys that are zero on every rank. */
static void write_table_all(FILE *out, gathered_t *g) {
    table_head(out, g);
    size_t zeros = 0;
    for (size_t i = 0; i < g->nkeys; i++)
        zeros += all_zero(&g->stats[i]);
    fprintf(out, "-- every key that is not zero everywhere (%zu of %zu)\n", g->nkeys - zeros,
            g->nkeys);
    for (size_t i = 0; i < g->nkeys; i++)
        if (!all_zero(&g->stats[i]))
            table_row(out, g, skey(i), &g->stats[i], is_bytes_key(skey(i)));
    table_symmetric(out, g);
    table_nodes(out, g);
    if (zeros > 0) {
        /* Complete but compact: the keys that are zero on every rank, wrapped at ~100 columns. */
        fprintf(out, "-- zero on every rank (%zu keys):", zeros);
        size_t col = 100;
        for (size_t i = 0; i < g->nkeys; i++) {
            if (!all_zero(&g->stats[i]))
                continue;
            size_t len = strlen(skey(i));
            if (col + len + 1 > 100) {
                fprintf(out, "\n  ");
                col = 2;
            }
            fprintf(out, " %s", skey(i));
            col += len + 1;
        }
        fprintf(out, "\n");
    }
    table_legend(out);
}

/* Writes the UTF-8 character at *p_p and steps past it; a byte that starts none (a host name
 * is bytes: sethostname takes any) is U+FFFD, written as `bad` says, and one byte is stepped. */
static void utf8_char(FILE *out, const unsigned char **p_p, const char *bad) {
    size_t k = sp__utf8_len(*p_p);
    if (k == 0) {
        fputs(bad, out);
        k = 1;
    } else {
        fwrite(*p_p, 1, k, out);
    }
    *p_p += k;
}

/* A JSON string: host names are plain, but nothing in them may break the document (RFC 8259
 * wants UTF-8). */
static void json_string(FILE *out, const char *str) {
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)(str ? str : "?"); *p;) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p++);
        else if (*p < 0x20)
            fprintf(out, "\\u%04x", *p++);
        else
            utf8_char(out, &p, "\\ufffd");
    }
    fputc('"', out);
}

static void json_record(FILE *out, const gathered_t *g, const char *key, const agg_t *a, int n,
                        bool first, const char *indent) {
    fprintf(out,
            "%s\n%s\"%s\": {\"min\": %" PRId64 ", \"max\": %" PRId64 ", \"sum\": %" PRId64
            ", \"mean\": %.3f, \"min_rank\": %d, \"max_rank\": %d, \"min_node\": ",
            first ? "" : ",", indent, key, a->min, a->max, a->sum, n > 0 ? (double)a->sum / n : 0.0,
            a->min_rank, a->max_rank);
    char label[NODE_LABEL];
    json_string(out, node_label(g, sp_world_node(g->w, a->min_rank), label, sizeof label));
    fprintf(out, ", \"max_node\": ");
    json_string(out, node_label(g, sp_world_node(g->w, a->max_rank), label, sizeof label));
    fputc('}', out);
}

/* One object per node: its name, its ranks, and every key and counter reduced over them. */
static void json_nodes(FILE *out, const gathered_t *g) {
    size_t stride = g->nkeys + N_SYM + 1;
    fprintf(out, ",\n  \"nodes\": [");
    for (int k = 0; g->nodes && k < g->nnodes; k++) {
        const agg_t *a = &g->nodes[(size_t)k * stride];
        char label[NODE_LABEL];
        fprintf(out, "%s\n    {\"node\": %d, \"name\": ", k ? "," : "", k);
        json_string(out, node_label(g, k, label, sizeof label));
        fprintf(out, ", \"ranks\": [");
        int ranks = 0;
        for (int r = 0; r < g->nranks; r++)
            if (sp_world_node(g->w, r) == k)
                fprintf(out, "%s%d", ranks++ ? ", " : "", r);
        fprintf(out, "],\n     \"stats\": {");
        for (size_t i = 0; i < g->nkeys; i++)
            json_record(out, g, skey(i), &a[i], ranks, i == 0, "       ");
        fprintf(out, "},\n     \"symmetric\": {");
        for (int j = 0; j < N_SYM; j++)
            json_record(out, g, sym_names[j], &a[g->nkeys + (size_t)j], ranks, j == 0, "       ");
        fprintf(out, "}}");
    }
    fprintf(out, "\n  ]");
}

static void write_json(FILE *out, const gathered_t *g, int device) {
    fprintf(out,
            "{\n  \"nranks\": %d,\n  \"nnodes\": %d,\n  \"device\": %d,\n  \"device_min\": "
            "%d,\n  \"device_max\": %d,\n  \"backend\": \"%s\",\n  \"stats\": {",
            g->nranks, g->nnodes, device, g->dev_lo, g->dev_hi, sp_backend_name());
    for (size_t i = 0; i < g->nkeys; i++)
        json_record(out, g, skey(i), &g->stats[i], g->nranks, i == 0, "    ");
    fprintf(out, "\n  },\n  \"symmetric\": {");
    for (int j = 0; j < N_SYM; j++)
        json_record(out, g, sym_names[j], &g->sym[j], g->nranks, j == 0, "    ");
    fprintf(out, "\n  }");
    json_nodes(out, g);
    fprintf(out, "\n}\n");
}

/* ---- Prometheus ---------------------------------------------------------------------------
 * Few metric families with labels instead of one gauge per key: the stat and the pool kind are
 * labels (metric="allocated", pool="large_pool"), so a query can sum or compare them. Values that
 * only grow (a stat's "allocated" and "freed" totals, the num_* event counts, the symmetric
 * pools' event counts) are counters named *_total; current values and peaks are gauges. A key
 * this code does not know (a future one) is still exported, as a gauge named after it. */

typedef enum { FAM_GAUGE, FAM_COUNTER } fam_type_t;

typedef struct family {
    const char *name; /* full metric name, _total included for counters */
    fam_type_t type;
    const char *help;
} family_t;

enum {
    F_BYTES,
    F_BYTES_PEAK,
    F_BYTES_ALLOC,
    F_BYTES_FREED,
    F_BLOCKS,
    F_BLOCKS_PEAK,
    F_BLOCKS_ALLOC,
    F_BLOCKS_FREED,
    F_SCALAR, /* num_* and max_split_size: a family of their own each, named below */
    F_OTHER   /* unknown key: a gauge of its own */
};

static const family_t families[F_SCALAR] = {
    {"sympool_memory_bytes", FAM_GAUGE,
     "bytes now, by stat (allocated, reserved, active, inactive_split, requested) and pool"},
    {"sympool_memory_peak_bytes", FAM_GAUGE, "peak bytes since the last peak reset"},
    {"sympool_memory_allocated_bytes_total", FAM_COUNTER,
     "bytes ever added to the stat (PyTorch's .allocated)"},
    {"sympool_memory_freed_bytes_total", FAM_COUNTER,
     "bytes ever removed from the stat (PyTorch's .freed)"},
    {"sympool_blocks", FAM_GAUGE,
     "blocks or segments now, by stat (allocation, segment, active, inactive_split, "
     "oversize_allocations, oversize_segments) and pool"},
    {"sympool_blocks_peak", FAM_GAUGE, "peak count since the last peak reset"},
    {"sympool_blocks_allocated_total", FAM_COUNTER, "blocks or segments ever added"},
    {"sympool_blocks_freed_total", FAM_COUNTER, "blocks or segments ever removed"},
};

typedef struct prom_key {
    int family;       /* F_* */
    char labels[128]; /* `metric="..",pool=".."` or "" */
    char scalar[128]; /* F_SCALAR/F_OTHER: the metric name */
    fam_type_t type;  /* F_SCALAR/F_OTHER: its type */
} prom_key_t;

/* Prometheus metric names: [a-zA-Z_:][a-zA-Z0-9_:]*; everything else becomes '_'. */
static void metric_name(const char *prefix, const char *key, const char *suffix, char *buf,
                        size_t len) {
    size_t at = (size_t)snprintf(buf, len, "%s", prefix);
    for (const char *p = key; *p && at + 1 < len; p++)
        buf[at++] = (isalnum((unsigned char)*p) || *p == '_' || *p == ':') ? *p : '_';
    buf[at] = '\0';
    snprintf(buf + at, len - at, "%s", suffix);
}

/* Sort one memory_stats key into its family and labels. */
static void classify(const char *key, prom_key_t *k) {
    static const char *const fields[4] = {"current", "peak", "allocated", "freed"};
    memset(k, 0, sizeof *k);
    char stat[64], pool[32], field[32];
    int parts = 0;
    const char *dot1 = strchr(key, '.'), *dot2 = dot1 ? strchr(dot1 + 1, '.') : NULL;
    if (dot1 && dot2 && !strchr(dot2 + 1, '.')) {
        snprintf(stat, sizeof stat, "%.*s", (int)(dot1 - key), key);
        snprintf(pool, sizeof pool, "%.*s", (int)(dot2 - dot1 - 1), dot1 + 1);
        snprintf(field, sizeof field, "%s", dot2 + 1);
        parts = 3;
    } else if (dot1 && !dot2) { /* oversize_allocations.current */
        snprintf(stat, sizeof stat, "%.*s", (int)(dot1 - key), key);
        snprintf(pool, sizeof pool, "all");
        snprintf(field, sizeof field, "%s", dot1 + 1);
        parts = 2;
    }
    int f = -1;
    for (int i = 0; parts > 0 && i < 4; i++)
        if (strcmp(field, fields[i]) == 0)
            f = i;
    if (f >= 0) {
        size_t sl = strlen(stat);
        bool bytes = sl > 6 && strcmp(stat + sl - 6, "_bytes") == 0;
        if (bytes)
            stat[sl - 6] = '\0'; /* the family says bytes; the label names the stat */
        k->family = (bytes ? F_BYTES : F_BLOCKS) + f;
        snprintf(k->labels, sizeof k->labels, "metric=\"%s\",pool=\"%s\"", stat, pool);
        return;
    }
    if (strncmp(key, "num_", 4) == 0) {
        k->family = F_SCALAR;
        k->type = FAM_COUNTER;
        metric_name("sympool_", key + 4, "_total", k->scalar, sizeof k->scalar);
    } else if (strcmp(key, "max_split_size") == 0) {
        k->family = F_SCALAR;
        k->type = FAM_GAUGE;
        snprintf(k->scalar, sizeof k->scalar, "sympool_max_split_size_bytes");
    } else {
        k->family = F_OTHER;
        k->type = FAM_GAUGE;
        metric_name("sympool_", key, "", k->scalar, sizeof k->scalar);
    }
}

static void prom_head(FILE *out, const char *name, const char *help, fam_type_t type) {
    fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name,
            type == FAM_COUNTER ? "counter" : "gauge");
}

/* One sample per rank. max_split_size's -1 ("unlimited") is +Inf. */
/* A label value: backslash, double quote and newline escaped as the exposition format says. */
static void prom_label_value(FILE *out, const char *v) {
    for (const unsigned char *p = (const unsigned char *)(v ? v : "?"); *p;) {
        if (*p == '\\' || *p == '"')
            fprintf(out, "\\%c", *p++);
        else if (*p == '\n') {
            fputs("\\n", out);
            p++;
        } else
            utf8_char(out, &p, "\xef\xbf\xbd"); /* the exposition format is UTF-8 */
    }
}

/* Every sample carries its rank and its node, so a query can aggregate per node
 * (sum by (node) (...)) next to the job. */
static void prom_samples(FILE *out, const gathered_t *g, const char *name, const char *labels,
                         const int64_t *all, size_t stride, size_t index, int n,
                         bool inf_if_negative) {
    for (int r = 0; r < n; r++) {
        int64_t v = all[(size_t)r * stride + index];
        fprintf(out, "%s{%s%srank=\"%d\",node=\"", name, labels, labels[0] ? "," : "", r);
        char label[NODE_LABEL];
        prom_label_value(out, node_label(g, sp_world_node(g->w, r), label, sizeof label));
        fputs("\"} ", out);
        if (inf_if_negative && v < 0)
            fprintf(out, "+Inf\n");
        else
            fprintf(out, "%" PRId64 "\n", v);
    }
}

/* Each key is classified again for each family it is looked at for (a few hundred string
 * operations for the whole report): a table of the classified keys was a malloc whose failure
 * left the report short, with nothing to say so. */
static void write_prometheus(FILE *out, const gathered_t *g, const int64_t *all) {
    size_t stride = g->nkeys + N_SYM;
    prom_key_t key;
    for (int f = 0; f < F_SCALAR; f++) {
        bool any = false;
        for (size_t i = 0; i < g->nkeys; i++) {
            classify(skey(i), &key);
            if (key.family != f)
                continue;
            if (!any)
                prom_head(out, families[f].name, families[f].help, families[f].type);
            any = true;
            prom_samples(out, g, families[f].name, key.labels, all, stride, i, g->nranks, false);
        }
    }
    for (size_t i = 0; i < g->nkeys; i++) {
        classify(skey(i), &key);
        if (key.family < F_SCALAR)
            continue;
        char help[160];
        if (i >= mem_keys())
            snprintf(help, sizeof help, "%s",
                     i == mem_keys() ? "device memory in use by anyone (total - free)"
                                     : "device memory in use that sympool did not reserve "
                                       "(NCCL, other libraries and processes)");
        else
            snprintf(help, sizeof help, "PyTorch memory_stats key \"%s\"%s", skey(i),
                     strcmp(skey(i), "max_split_size") == 0 ? " (+Inf: unlimited)" : "");
        prom_head(out, key.scalar, help, key.type);
        prom_samples(out, g, key.scalar, "", all, stride, i, g->nranks,
                     strcmp(skey(i), "max_split_size") == 0);
    }
    for (int j = 0; j < N_SYM; j++) {
        char name[96];
        bool counter = strcmp(sym_names[j], "pools") != 0; /* the rest only grow */
        snprintf(name, sizeof name, "sympool_symmetric_%s%s", sym_names[j],
                 counter ? "_total" : "");
        prom_head(out, name, sym_help[j], counter ? FAM_COUNTER : FAM_GAUGE);
        prom_samples(out, g, name, "", all, stride, g->nkeys + (size_t)j, g->nranks, false);
    }
}

/* Rank 0's writing: the report is built in memory, then written to out in one fwrite and
 * flushed, so that the errno of the write that failed is read right after it (written straight
 * to out, a write failed inside one of the many fprintf calls' buffer flushes, and its errno was
 * long gone by the final fflush, which may well succeed; the message then said no why). */
static sp_status_t write_report(FILE *out, sp_report_format_t format, gathered_t *g, int device,
                                const char *fn) {
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    if (mem == NULL)
        return sp__error(SP_ERR_SYSTEM, SP_SUB_COLL, "%s: no host memory to build the report: %s",
                         fn, strerror(errno));
    void *old = sp__c_numeric_begin(); /* JSON's and the table's decimal point */
    switch (format) {
    case SP_REPORT_TABLE:
        write_table(mem, g);
        break;
    case SP_REPORT_JSON:
        write_json(mem, g, device);
        break;
    case SP_REPORT_PROMETHEUS:
        write_prometheus(mem, g, g->rows);
        break;
    case SP_REPORT_TABLE_ALL:
        write_table_all(mem, g);
        break;
    }
    sp__c_numeric_end(old);
    bool built = !ferror(mem);
    if (fclose(mem) != 0 || !built) { /* buf and len are final only now */
        free(buf);
        return sp__error(SP_ERR_SYSTEM, SP_SUB_COLL, "%s: no host memory to build the report", fn);
    }
    int e = 0;
    bool bad = ferror(out) != 0; /* an error the stream had before: nothing says which */
    errno = 0;
    if (fwrite(buf, 1, len, out) != len) {
        bad = true;
        e = errno;
    }
    errno = 0;
    if (fflush(out) != 0) {
        bad = true;
        if (e == 0)
            e = errno;
    }
    free(buf);
    if (bad || ferror(out))
        return sp__error(SP_ERR_SYSTEM, SP_SUB_COLL, "%s: writing the report failed: %s", fn,
                         e != 0 ? strerror(e)
                                : "the stream was in error before the report (no error code)");
    return SP_SUCCESS;
}

SP_EXPORT sp_status_t sp_stats_report(sp_world_t *w, int device, FILE *out,
                                      sp_report_format_t format) {
    static const char fn[] = "sp_stats_report";
    SP_CHECK(sp__world_check(w, fn));
    int rank = sp_world_rank(w);
    const char *why = NULL;
    if ((unsigned)format > (unsigned)SP_REPORT_TABLE_ALL)
        why = "format is not an sp_report_format_t";
    else if (rank == 0 && out == NULL)
        why = "out is NULL on rank 0 (the rank that writes)";
    gathered_t gathered, *g = &gathered; /* on the stack, as in sp_stats_aggregate */
    sp_status_t st = gather_all(w, device, (int)format, why == NULL, why, fn, true, g);
    if (st == SP_SUCCESS && format == SP_REPORT_PROMETHEUS) {
        /* Rank 0's rows were allocated before the agreement (prepare), so every rank is here. */
        int stride = (int)(g->nkeys + N_SYM);
        int rc = MPI_Gather(g->mine, stride, MPI_INT64_T, g->rows, stride, MPI_INT64_T, 0,
                            sp__world_comm(w));
        if (rc != MPI_SUCCESS)
            st = sp__mpi_status(rc, SP_SUB_COLL, fn, "MPI_Gather");
    }
    if (st == SP_SUCCESS && rank == 0)
        st = write_report(out, format, g, device, fn);
    free(g->rows);
    free(g->nodes);
    free(g->twin);
    return st;
}

/* ---- SYMPOOL_REPORT at sp_world_finalize ------------------------------------------------ */

/* Rank 0's destination: SYMPOOL_REPORT_FILE (%h %p %r expanded) into path (then *to_file), else
 * stdout. The file is written like a snapshot: the report goes to memory, then to a temporary
 * file beside the target that is renamed over it, so a full disk or a crash leaves the previous
 * report whole; and a target that is not a regular file (a FIFO would block the write forever)
 * is refused. NULL when the name cannot be expanded or memory is short (logged): rank 0 then
 * still joins the collective, which fails on every rank, so no rank waits and nothing lands in
 * the program's stdout. */
static FILE *report_out(sp_world_t *w, char *path, size_t cap, char **mem, size_t *mem_len,
                        bool *to_file) {
    *to_file = false;
    const char *pattern = sp__option_string(SP_OPT_REPORT_FILE);
    if (sp_world_rank(w) != 0)
        return NULL; /* only rank 0 writes */
    if (pattern[0] == '\0')
        return stdout;
    /* The one expansion the log file and snapshots use; rank 0 is the only writer. */
    if (sp__path_expand(pattern, 0, path, cap) != SP_EXPAND_OK) {
        (void)sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_COLL,
                        "SYMPOOL_REPORT_FILE: '%s' expands to more than %zu bytes", pattern,
                        cap - 1);
        return NULL;
    }
    FILE *f = open_memstream(mem, mem_len);
    if (f == NULL) {
        (void)sp__error(SP_ERR_SYSTEM, SP_SUB_COLL,
                        "SYMPOOL_REPORT_FILE: no memory to build the report for %s: %s", path,
                        strerror(errno));
        return NULL;
    }
    *to_file = true;
    return f;
}

static sp_status_t report_at_finalize(sp_world_t *w, bool in_step) {
    const char *what = sp__option_string(SP_OPT_REPORT);
    sp_report_format_t format = SP_REPORT_TABLE;
    bool wanted = true;
    if (strcmp(what, "table") == 0)
        format = SP_REPORT_TABLE;
    else if (strcmp(what, "table_all") == 0)
        format = SP_REPORT_TABLE_ALL;
    else if (strcmp(what, "json") == 0)
        format = SP_REPORT_JSON;
    else if (strcmp(what, "prometheus") == 0)
        format = SP_REPORT_PROMETHEUS;
    else
        wanted = false; /* no report here, but this rank joins the round below */
    if (!in_step) {
        /* The report is collective: with a rank late or gone it would only time out again. */
        if (wanted)
            SP_WARN(SP_SUB_COLL,
                    "SYMPOOL_REPORT=%s: no report, the ranks did not all reach "
                    "sp_world_finalize in time",
                    what);
        return SP_SUCCESS;
    }
    /* Every rank joins this round, with or without a report: SYMPOOL_REPORT set on some ranks
     * only (an mpirun -x on one host, a launcher that sets it per rank) would otherwise leave
     * them alone in the report's collective until their deadline. */
    sp_agree_t a = {
        .op = SP_AGREE_FINALIZE_REPORT, .ok = true, .f = {wanted ? (int64_t)format : -1}};
    if (sp__world_agree(w, &a, "SYMPOOL_REPORT at sp_world_finalize") != SP_SUCCESS) {
        SP_WARN(SP_SUB_COLL, "SYMPOOL_REPORT: no report: %s", sp_last_error());
        return SP_SUCCESS;
    }
    if (a.lo[0] != a.hi[0]) {
        SP_WARN(SP_SUB_COLL,
                "SYMPOOL_REPORT: no report: the ranks do not all set it alike (this rank: "
                "'%s'); set SYMPOOL_REPORT to the same value on every rank",
                what);
        return SP_SUCCESS;
    }
    if (!wanted)
        return SP_SUCCESS;
    /* A failure was already logged; finalize goes on. */
    char path[4096];
    char *mem = NULL;
    size_t mem_len = 0;
    bool to_file;
    FILE *out = report_out(w, path, sizeof path, &mem, &mem_len, &to_file);
    sp_status_t s = sp_stats_report(w, sp_world_device(w), out, format);
    if (to_file) {
        bool ok = fclose(out) == 0; /* mem and mem_len are final only now */
        if (s == SP_SUCCESS && !ok)
            (void)sp__error(SP_ERR_SYSTEM, SP_SUB_COLL,
                            "SYMPOOL_REPORT_FILE: no memory to build the report for %s", path);
        else if (s == SP_SUCCESS && sp__file_write_atomic(path, mem, mem_len) != SP_SUCCESS) {
            char why[512];
            snprintf(why, sizeof why, "%s", sp_last_error()); /* not formatted into itself */
            (void)sp__error(SP_ERR_SYSTEM, SP_SUB_COLL,
                            "SYMPOOL_REPORT_FILE: cannot write %s (a previous file there is "
                            "unchanged): %s",
                            path, why);
        }
        free(mem);
    }
    return SP_SUCCESS;
}

__attribute__((constructor)) static void register_report_hook(void) {
    (void)sp__world_on_finalize(report_at_finalize);
}
