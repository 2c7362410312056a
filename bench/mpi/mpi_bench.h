/*
 * mpi_bench.h: what every MPI benchmark stops on and reports with. A program defines
 * BENCH_NAME (its binary's name, for messages) before including it.
 */
#ifndef SP_BENCH_MPI_BENCH_H
#define SP_BENCH_MPI_BENCH_H

#include <mpi.h>
#include <stdio.h>

#include <sympool/sympool.h>

/* A failed call ends the whole job: a benchmark has no partial result worth keeping. */
static inline void die(const char *what, sp_status_t s) {
    fprintf(stderr, "%s: %s: %s: %s\n", BENCH_NAME, what, sp_status_name(s), sp_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

#define OK(call)                                                                                   \
    do {                                                                                           \
        sp_status_t s_ = (call);                                                                   \
        if (s_ != SP_SUCCESS)                                                                      \
            die(#call, s_);                                                                        \
    } while (0)

/* The slowest rank's value: what a collective step costs the job. */
static inline double worst(double v) {
    double m = 0;
    MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

#endif /* SP_BENCH_MPI_BENCH_H */
