/**
 * @file world.h
 * @brief The MPI world: bootstrap, local rank -> device, NCCL communicator on the cuda backend.
 *
 * fork(): a world belongs to the process that made it. In the child of a process that started
 * sp_world_init or sp_world_from_comm, every world, symmetric pool and collective call returns
 * SP_ERR_INVALID_USAGE (MPI and NCCL communicators do not survive fork(), and another thread may
 * have held the world's locks across a wait for other ranks), and the accessors answer as for a
 * finalized world.
 */
#ifndef SYMPOOL_WORLD_H
#define SYMPOOL_WORLD_H

/* A C++ program includes this header too: without these, Open MPI's and MPICH's mpi.h pull in
 * their deprecated C++ bindings, whose symbols live in a library (libmpi_cxx) that sympool's
 * link line does not name. sympool uses the C API only. */
#if defined(__cplusplus)
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#endif
#include <mpi.h>

#include "sympool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sp_world sp_world_t;

/**
 * Collective over MPI_COMM_WORLD. Initializes MPI if nobody did (then finalize will finalize it;
 * a failed creation leaves it initialized, for a later sp_world_init to use: MPI_Finalize waits
 * for every process of the job, which a rank that never came would make a hang), duplicates the
 * communicator, finds the local rank, picks the device by local rank and on cuda
 * creates the NCCL communicator from an id rank 0 makes and broadcasts. Bounded by
 * SYMPOOL_SYM_TIMEOUT like every collective call: a rank that never comes (or, for
 * sp_world_from_comm, passes another communicator) is SP_ERR_TIMEOUT on the ranks waiting for it,
 * and so is NCCL's set-up failing on one rank (a bad NCCL_SOCKET_IFNAME, out of memory): that
 * rank's SP_ERR_NCCL, SP_ERR_TIMEOUT naming it on the others at their deadline (NCCL would wait
 * for it for good), after which a new world can be made; a set-up that is healthy but slower than
 * the deadline fails the same way (raise SYMPOOL_SYM_TIMEOUT for very large jobs). NCCL applies
 * NCCL_COMM_BLOCKING from the environment to every communicator, over sympool's choice: =1 makes
 * the set-up wait inside NCCL with no deadline again; =0 makes the world's communicator
 * nonblocking, whose collectives and window registrations sympool does not wait out: leave it
 * unset. Ranks on different backends
 * (SYMPOOL_DEVICE, or auto where some ranks see no GPU) are SP_ERR_DEVICE on every rank.
 * @return SP_SUCCESS, SP_ERR_INVALID_ARGUMENT, SP_ERR_MPI, SP_ERR_NCCL, SP_ERR_DEVICE,
 * SP_ERR_TIMEOUT.
 */
sp_status_t sp_world_init(int *argc, char ***argv, sp_world_t **world_p);

/** As sp_world_init on a communicator the caller owns (MPI must be initialized). Collective over
 * comm, which must be an intracommunicator (an intercommunicator: SP_ERR_INVALID_ARGUMENT on
 * every rank). */
sp_status_t sp_world_from_comm(MPI_Comm comm, sp_world_t **world_p);

/**
 * Collective: frees the world; finalizes MPI only if sp_world_init initialized it, this was the
 * last world from sp_world_init, and every rank came to this call in time (after a timeout MPI
 * stays initialized: MPI_Finalize would wait for the missing rank; the next world from
 * sp_world_init, or the caller, finalizes it). First it
 * runs what must happen while the world still works (SYMPOOL_REPORT, releasing the segments of
 * symmetric pools still alive). Calling it twice on one world (also from two threads at once:
 * one call finalizes, the other is SP_ERR_INVALID_USAGE), or on a pointer that is not a world,
 * is refused without touching anything. While a CUDA graph capture is under way on any
 * rank's device, no rank releases those segments (releasing synchronizes the device, which breaks
 * a capture, and the graph may use the memory): each rank warns, naming the capturing ranks, and
 * leaves them to process exit; finalize still succeeds. Destroy symmetric pools with
 * sp_symmetric_mempool_destroy after the capture instead.
 *
 * Deadlines: every collective sympool call on a world (sp_symmetric_mempool_create, the
 * collectives and the statistics of collectives.h, and the symmetric pool calls) starts with an
 * agreement round bounded by SYMPOOL_SYM_TIMEOUT (seconds; 0 or inf: no deadline; at most one
 * year). A rank whose deadline passes returns SP_ERR_TIMEOUT naming the call; a rank that
 * arrives after a peer's deadline returns SP_ERR_TIMEOUT too. The world stays usable after a
 * timeout in a world-level call: the abandoned round stays pending on a communicator of its own
 * and is completed by the late rank's call, after which the ranks are in step again (a rank that
 * skipped the call instead gets SP_ERR_TIMEOUT or SP_ERR_MISMATCH at its next call, then is in
 * step). A round still pending at sp_world_finalize (the peer never came) leaves that
 * communicator allocated, with a warning, rather than freeing it under MPI. The deadline covers
 * agreement only: once ranks have agreed, the data moves through MPI or NCCL, and a peer that
 * dies during that transfer is MPI's or NCCL's business (MPI aborts the job by default; NCCL
 * waits).
 *
 * @return SP_SUCCESS; SP_ERR_INVALID_ARGUMENT (NULL) or SP_ERR_INVALID_USAGE (not a live world,
 *         or another call is finalizing it), with nothing done. Any other failure comes after the
 *         world is finalized all the same (its handle is gone; the first failure is returned):
 *         SP_ERR_INVALID_USAGE (MPI already finalized, or the world broken: finalized locally),
 *         SP_ERR_TIMEOUT or SP_ERR_MISMATCH (the agreement round: a rank late, gone, or in
 *         another call; also a symmetric pool out of step), SP_ERR_SYSTEM (a rank without host
 *         memory to release the symmetric pools' registrations: none releases them), SP_ERR_MPI,
 *         SP_ERR_NCCL.
 */
sp_status_t sp_world_finalize(sp_world_t *world);

/* The accessors answer like NULL for a world already finalized (they never read freed memory). */
int sp_world_rank(const sp_world_t *w);       /**< rank in the world's communicator, -1 for NULL */
int sp_world_size(const sp_world_t *w);       /**< number of ranks, 0 for NULL */
int sp_world_local_rank(const sp_world_t *w); /**< rank among the ranks of this node, -1 for NULL */
/** The device this rank uses: sp_world_local_rank() modulo the node's device count, so the ranks
 * of one node take devices 0, 1, 2, ... in rank order and every node starts again at 0. -1 for
 * NULL. */
int sp_world_device(const sp_world_t *w);

/**
 * @name Nodes
 * A node is what MPI puts in one MPI_COMM_TYPE_SHARED communicator: the ranks that share memory
 * (Open MPI: the ranks started by one daemon, i.e. one host of the hostfile). Nodes are numbered
 * 0..sp_world_node_count()-1 in the order of their lowest world rank, identically on every rank;
 * the table is gathered once when the world is made (one MPI_Allgather of a 68-byte record per
 * rank), so these calls are local, thread-safe and O(1).
 * @{
 */
/** Longest node name kept, the terminating NUL included (longer host names are cut). */
#define SP_WORLD_NODE_NAME 64
/** Ranks on this rank's node (the size of its node communicator); 0 for NULL. */
int sp_world_local_size(const sp_world_t *w);
/** Number of nodes the world spans; 0 for NULL. */
int sp_world_node_count(const sp_world_t *w);
/** The node of world rank @p rank; -1 for NULL or a rank outside the world. */
int sp_world_node(const sp_world_t *w, int rank);
/** The host name of node @p node (short form, as its lowest rank's gethostname() says, up to the
 * first dot); NULL for NULL or a node outside 0..sp_world_node_count()-1. Valid until
 * sp_world_finalize. */
const char *sp_world_node_name(const sp_world_t *w, int node);
/** @} */

#ifdef __cplusplus
}
#endif

#endif /* SYMPOOL_WORLD_H */
