/* Compiles every public header as strict C11 (-pedantic -Werror): the C++ tests would hide
 * C-only breakage. Nothing here runs. */
#include <sympool/sympool.h>
#include <sympool/history.h>
#include <sympool/mempool.h>
#include <sympool/pool.h>
#include <sympool/stats.h>
#include <sympool/status.h>
#include <sympool/summary.h>
#include <sympool/torch.h>
#include <sympool/experimental.h>
#if defined(SP_CHECK_MPI_HEADERS)
#include <sympool/collectives.h>
#include <sympool/symmetric.h>
#include <sympool/world.h>
#endif

int sp_header_check_anchor(void);
int sp_header_check_anchor(void) {
    return (int)SP_NUM_STATUS + (int)SP_STATS_MAX;
}
