// mpi_main.cc: main() for the MPI GoogleTest binaries. Every test runs on every rank; only rank 0
// prints gtest's report, and a rank whose tests fail makes the whole job fail (exit status).
// Linked into every MPI test binary, so it also holds what each of them needs once per program.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

// Open MPI's libraries are built without frame pointers: LeakSanitizer's fast unwinder then
// stops inside them and the scripts/lsan.supp suppressions (leak:libmpi, ...) cannot match
// Open MPI's never-freed allocations. The slow unwinder sees the whole stack. This default is for
// a run by hand: ctest's runs keep Open MPI's components loaded and take the fast unwinder
// instead (tests/CMakeLists.txt, shim/no_dlclose.c).
#if defined(__SANITIZE_ADDRESS__)
extern "C" const char *__asan_default_options() {
    return "fast_unwind_on_malloc=0";
}
#endif

namespace {
// Rank-0-only printing: drop the default printer on the other ranks.
void quiet_other_ranks(int rank) {
    if (rank == 0)
        return;
    auto &listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
}
} // namespace

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
#if defined(SP_MPI_THREAD_MULTIPLE)
    // Binaries whose tests call sympool's collectives from several threads at once.
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE) {
        std::fprintf(stderr, "MPI_THREAD_MULTIPLE is not available (got %d)\n", provided);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
#else
    MPI_Init(&argc, &argv);
#endif
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    quiet_other_ranks(rank);
    int local = RUN_ALL_TESTS();
    int global = 0;
    MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (local != 0)
        std::fprintf(stderr, "rank %d: tests failed\n", rank);
    MPI_Finalize();
    return global;
}
