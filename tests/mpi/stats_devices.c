/*
 * stats_devices.c: ranks that report different devices (each rank its own, as on a cuda node
 * where device = local rank) get a report that says so. The header and JSON named only the
 * root's device ("device 0"), which read as every rank's. Run with SYMPOOL_HOST_DEVICES=2 at 2
 * ranks: rank r reports device r. Rank 0 checks the table's header and the JSON's fields; then
 * both ranks report device 0 and the header names that one device.
 *
 * Every rank prints "stats-devices: ok rank R" or "stats-devices: FAIL ..."; the ctest
 * registration (tests/cmake/symmetric.cmake) matches those lines.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sympool/collectives.h>
#include <sympool/sympool.h>

static int failures;

/* The report rank 0 writes, read back from a temporary file ("" on other ranks). */
static void report(sp_world_t *w, int device, sp_report_format_t fmt, char *text, size_t len) {
    FILE *f = tmpfile();
    text[0] = '\0';
    if (!f || sp_stats_report(w, device, f, fmt) != SP_SUCCESS) {
        printf("stats-devices: FAIL report on device %d: %s\n", device, sp_last_error());
        failures++;
    }
    if (f) {
        rewind(f);
        size_t got = fread(text, 1, len - 1, f);
        text[got] = '\0';
        fclose(f);
    }
}

static void expect(int rank, const char *text, const char *want) {
    if (rank == 0 && strstr(text, want) == NULL) {
        printf("stats-devices: FAIL rank 0: no \"%s\" in:\n%.300s\n", want, text);
        failures++;
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    sp_world_t *w = NULL;
    if (sp_world_from_comm(MPI_COMM_WORLD, &w) != SP_SUCCESS) {
        printf("stats-devices: FAIL rank %d: world (%s)\n", rank, sp_last_error());
        return 1;
    }
    static char text[1 << 16];
    report(w, rank % 2, SP_REPORT_TABLE, text, sizeof text);
    expect(rank, text, "devices 0 to 1 (each rank its own)");
    report(w, rank % 2, SP_REPORT_JSON, text, sizeof text);
    expect(rank, text, "\"device_min\": 0,\n  \"device_max\": 1,");
    report(w, 0, SP_REPORT_TABLE, text, sizeof text);
    expect(rank, text, "node(s), device 0, backend");
    if (sp_world_finalize(w) != SP_SUCCESS) {
        printf("stats-devices: FAIL rank %d: finalize (%s)\n", rank, sp_last_error());
        failures++;
    }
    if (!failures)
        printf("stats-devices: ok rank %d\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return failures ? 1 : 0;
}
