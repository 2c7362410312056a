/*
 * mpi_error.c: the one place an MPI return code becomes a sympool status and message. Every
 * module that calls MPI (world/, symmetric/, collectives/) goes through it, so the message form
 * ("<call> failed: <MPI_Error_string>") and the status (SP_ERR_MPI) are the same everywhere.
 * The caller's file and line are passed through, so the log line points at the MPI call.
 */
#include <stdio.h>

#include "core/core.h"
#include "world/world.h"

sp_status_t sp__mpi_status_at(int rc, unsigned subsys, const char *fn, const char *what,
                              const char *file, int line) {
    if (SP_LIKELY(rc == MPI_SUCCESS))
        return SP_SUCCESS;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error code %d", rc);
    if (fn)
        return sp__error_at(SP_ERR_MPI, subsys, file, line, "%s: %s failed: %s", fn, what, text);
    return sp__error_at(SP_ERR_MPI, subsys, file, line, "%s failed: %s", what, text);
}
