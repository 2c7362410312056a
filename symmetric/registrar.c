/*
 * registrar.c: which registrar a symmetric pool's segments come from (SYMPOOL_SYM_REGISTRAR and
 * the backend decide), kept apart from the registrars themselves so the protocol depends on the
 * choice and the registrars on nothing above them.
 */
#include <string.h>

#include "core/core.h"
#include "symmetric/registrar.h"
#include "sympool/pool.h"

sp_status_t sp__registrar_select(const sp_world_t *w, const sp_registrar_ops_t **ops_p) {
    const char *want = sp__option_string(SP_OPT_SYM_REGISTRAR);
    /* The backend, not the world's NCCL communicator: a cuda build without NCCL still hands
     * out device memory, which the mpi registrar's host segments cannot stand in for. */
    bool cuda = strcmp(sp_backend_name(), "cuda") == 0;
    if (strcmp(want, "nccl") == 0 || (strcmp(want, "auto") == 0 && cuda)) {
#if defined(SP_HAVE_NCCL)
        if (cuda && sp__world_is_cuda(w) && sp__world_nccl_comm(w)) {
            *ops_p = &sp__registrar_nccl;
            return SP_SUCCESS;
        }
        return sp__error(SP_ERR_NOT_SUPPORTED, SP_SUB_SYM,
                         "the nccl registrar needs the cuda backend and an NCCL communicator "
                         "(backend here: %s); use SYMPOOL_SYM_REGISTRAR=mpi or auto on host",
                         sp_backend_name());
#else
        return sp__error(SP_ERR_NOT_SUPPORTED, SP_SUB_SYM,
                         "the nccl registrar is not in this build (no NCCL found at configure "
                         "time); use SYMPOOL_SYM_REGISTRAR=mpi or auto");
#endif
    }
    if (cuda)
        return sp__error(SP_ERR_NOT_SUPPORTED, SP_SUB_SYM,
                         "the mpi registrar gives host memory, not device memory: on the cuda "
                         "backend use SYMPOOL_SYM_REGISTRAR=nccl or auto");
    *ops_p = &sp__registrar_mpi;
    return SP_SUCCESS;
}
