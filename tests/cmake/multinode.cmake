# multinode.cmake: MPI tests over several emulated nodes (ctest label multinode). Each test runs
# one Open MPI job through tests/multinode/mn-run.sh: network + UTS namespaces on a private
# bridge, TCP between nodes, shared memory within one. Two shapes: 2 nodes x 2 ranks (peers on
# the same node and on another) and 3 nodes x 1 rank (no two ranks share memory). The script
# needs root; elsewhere it exits 77 with the reason, which ctest reports as a skip.
#
# The selection keeps the label's time small: the node table, the symmetric protocol, the
# collectives on symmetric and staged buffers, the statistics report, and never-hang (a late
# rank, a skipped call, a rank that dies). The every-dtype sweeps of test_collectives are the
# same code over TCP as over shared memory and stay in the single-node label.
if(NOT SP_HAVE_MPI)
  return()
endif()

set(SP_MN_RUN ${PROJECT_SOURCE_DIR}/tests/multinode/mn-run.sh)

# This file is read after every other module (tests/CMakeLists.txt), so the targets it runs exist
# here; $<TARGET_FILE> resolves them at generation time.
# sp_multinode_test(NAME nodes ppn TARGET target [CUDA_DOUBLE] [ARGS ...] [MPIRUN ...] [ENV ...]
#                   [WRAP command ...] [PASS regex] [FAIL regex])
# WRAP: a command each rank runs the target through (it execs the target with its arguments).
# CUDA_DOUBLE: the cuda backend under the CUDA/NCCL test doubles (cuda_double.cmake's
# environment; labels multinode and cuda_double).
# ppn: ranks per node, or one count per node ("1,2,1": uneven nodes; the test's name says 1-2-1).
function(sp_multinode_test name nodes ppn)
  cmake_parse_arguments(MN "CUDA_DOUBLE" "TARGET;PASS;FAIL" "ARGS;MPIRUN;ENV;WRAP" ${ARGN})
  string(REPLACE "," "-" shape "${ppn}")
  set(t multinode.${name}.${nodes}x${shape})
  set(labels multinode)
  set(env ${SP_TEST_ENV})
  if(MN_CUDA_DOUBLE)
    set(t multinode.cuda_double.${name}.${nodes}x${shape})
    set(labels multinode cuda_double)
    set(env ${SP_DBL_ENV_BASE})
  endif()
  add_test(NAME ${t}
    COMMAND ${SP_MN_RUN} ${nodes} ${ppn} ${MN_MPIRUN} -- ${MN_WRAP} $<TARGET_FILE:${MN_TARGET}>
            ${MN_ARGS})
  set_tests_properties(${t} PROPERTIES LABELS "${labels}" TIMEOUT 150 SKIP_RETURN_CODE 77
    # Namespaces and the private subnet are per run, but two jobs at once would only compete
    # for the same cores: the label runs one job at a time.
    RESOURCE_LOCK multinode
    ENVIRONMENT "${env};SP_TEST_EXPECT_NODES=${nodes};${MN_ENV}")
  if(MN_PASS)
    set_tests_properties(${t} PROPERTIES PASS_REGULAR_EXPRESSION "${MN_PASS}")
  endif()
  if(MN_FAIL)
    set_tests_properties(${t} PROPERTIES FAIL_REGULAR_EXPRESSION "${MN_FAIL}")
  endif()
endfunction()

foreach(shape "2;2" "3;1")
  list(GET shape 0 nodes)
  list(GET shape 1 ppn)
  sp_multinode_test(world_nodes ${nodes} ${ppn} TARGET test_world_nodes)
  sp_multinode_test(symmetric ${nodes} ${ppn} TARGET test_symmetric)
  # CollectivesStaged.AllreduceAndReduceScatterEveryDtypeOp's reference for SP_AVG is exact only
  # when the rank count is a power of two (it fails at 3 ranks on one node too): 2x2 only.
  set(staged "CollectivesStaged.AllgatherAndBroadcastMoveEveryByte:CollectivesStaged.AvgPreMultipliesAsNcclDoesOnThreeRanks")
  if(ppn EQUAL 2)
    set(staged "CollectivesStaged.*")
  endif()
  sp_multinode_test(collectives ${nodes} ${ppn} TARGET test_collectives
    ARGS "--gtest_filter=Collectives.AllreduceOnSymmetricBuffers:${staged}:CollectiveArgs.NullBufferOnOneRankFailsEverywhere:CollectiveArgs.RanksDisagreeOnCountDtypeOpRoot")
  sp_multinode_test(stats_report ${nodes} ${ppn} TARGET test_stats_report)
  # A late rank (past the deadline) and a rank that skips collectives and statistics calls.
  sp_multinode_test(late_rank ${nodes} ${ppn} TARGET sym_faults
    ARGS "--gtest_filter=SymFaults.LateCreateTimesOutEverywhereAndFinalizeIsSafe:SymFaults.SkippedCollectivesAndStatsTimeOutNamingTheCall")
  # A rank that dies before a symmetric malloc and before an allreduce: the survivors on its own
  # node and on the others get SP_ERR_TIMEOUT (see tests/cmake/symmetric.cmake for the verdict).
  foreach(call malloc allreduce)
    sp_multinode_test(rank_dies_${call} ${nodes} ${ppn} TARGET sym_exit ARGS ${call}
      MPIRUN --mca orte_abort_on_non_zero_status 0
      PASS "sym-exit: ok rank 0.*sym-exit: ok rank 1|sym-exit: ok rank 1.*sym-exit: ok rank 0"
      FAIL "sym-exit: FAIL")
  endforeach()
endforeach()

# Uneven nodes, as a hostfile with different slots per host gives, mapped round-robin over the
# nodes (--map-by node: ranks 0,3 on the first node, 1 on the second, 2,4 on the third), so
# that no node's ranks are consecutive and the nodes' sizes differ: the node table, local ranks
# and devices against the host names and MPI's own split.
sp_multinode_test(world_nodes_by_node 3 "2,1,2" TARGET test_world_nodes MPIRUN --map-by node)

# Nodes whose hosts share a short name (every node's host is twin.<its own name>): the reports
# still name each node apart (Prometheus' node label, JSON, the table). Each node gets its own
# /dev/shm (MN_PRIVATE_SHM), which Open MPI needs when host names collide.
sp_multinode_test(stats_report_same_host_name 2 2 TARGET test_stats_report
  WRAP ${PROJECT_SOURCE_DIR}/tests/multinode/mn-same-name.sh twin
  ARGS "--gtest_filter=StatsReport.NodesSharingAHostNameAreToldApart:StatsReport.PrometheusHasEveryKeyForEveryRankAsLabelledFamilies:StatsReport.JsonParsesBackAndMatchesTheAggregate"
  ENV "MN_PRIVATE_SHM=1")

# mn-run.sh stopped by SIGTERM while its job runs ends at once and removes its namespaces,
# files and the job's processes (the job would sleep for an hour: a script that cleans up only
# after it ends fails by the timeout).
add_test(NAME multinode.mn_run_sigterm
  COMMAND ${PROJECT_SOURCE_DIR}/tests/multinode/mn-signal.sh ${SP_MN_RUN})
set_tests_properties(multinode.mn_run_sigterm PROPERTIES LABELS multinode TIMEOUT 120
  SKIP_RETURN_CODE 77 RESOURCE_LOCK multinode ENVIRONMENT "${SP_TEST_ENV}"
  PASS_REGULAR_EXPRESSION "mn-signal: ok" FAIL_REGULAR_EXPRESSION "mn-signal: FAIL")

# The cuda backend and its NCCL path over the nodes, under the CUDA/NCCL doubles (built with
# -DSYMPOOL_CUDA_DOUBLE=ON; cuda_double.cmake defines the targets and the environment): the world's
# NCCL communicator over every node (device 0 of two nodes is two GPUs, as NCCL's host hash says),
# symmetric pools registered as NCCL windows, collectives through NCCL and their symmetric-kernel
# eligibility by NCCL 2.28's one-node rule, peer pointers within a node only, device.used and
# device.untracked_bytes, and NCCL failures, aborts and out of memory on every rank. Two double
# GPUs per node: 2x2 uses devices 0 and 1 of each node, 3x1 device 0 of every node.
if(SYMPOOL_CUDA_DOUBLE AND TARGET test_cuda_double_mpi)
  foreach(shape "2;2" "3;1")
    list(GET shape 0 nodes)
    list(GET shape 1 ppn)
    sp_multinode_test(nccl ${nodes} ${ppn} TARGET test_cuda_double_mpi CUDA_DOUBLE
      ENV "CUDA_DOUBLE_GPUS=2" "CUDA_DOUBLE_MEMORY=256MiB" "SYMPOOL_SYM_TIMEOUT=20")
    sp_multinode_test(world_nodes ${nodes} ${ppn} TARGET test_world_nodes CUDA_DOUBLE
      ENV "CUDA_DOUBLE_GPUS=2")
    sp_multinode_test(stats_report ${nodes} ${ppn} TARGET test_stats_report CUDA_DOUBLE
      ENV "CUDA_DOUBLE_GPUS=2")
  endforeach()
  # Two ranks per node and one GPU per node: the world fails on every rank of both nodes with the
  # reason, before NCCL could refuse the duplicate GPU (3x1 above shows device 0 of several nodes
  # is no duplicate).
  # (sp_world_init_self comes from symmetric.cmake, read before this file.) Its failure line is
  # written in three pieces that the four ranks interleave: the status is one piece, the reason
  # is in each rank's WARN line.
  set(refused "sp_world_init -> SP_ERR_INVALID_USAGE")
  set(why "share 1 GPU\\(s\\), and NCCL refuses two ranks of one communicator on one GPU")
  sp_multinode_test(world_init_one_gpu_per_node 2 2 TARGET sp_world_init_self CUDA_DOUBLE
    MPIRUN --mca orte_abort_on_non_zero_status 0 ENV "CUDA_DOUBLE_GPUS=1"
    PASS "${why}.*${refused}.*${refused}.*${refused}.*${refused}" FAIL "world-init-self: ok")
  # A rank short of host memory for its node's GPU table, on uneven nodes (1+2+1 ranks): the
  # failing rank is one that shares its node, chosen alike on every rank.
  sp_multinode_test(node_gpu_table 3 "1,2,1" TARGET test_cuda_double_mpi CUDA_DOUBLE
    ARGS "--gtest_filter=CudaDoubleMpi.NodeDeviceTableOutOfHostMemoryOnOneRankFailsEveryRank"
    ENV "CUDA_DOUBLE_GPUS=2" "CUDA_DOUBLE_MEMORY=256MiB" "SYMPOOL_SYM_TIMEOUT=20")
  # A rank that dies before a symmetric malloc (ncclMemAlloc and the window registration) or an
  # allreduce (ncclAllReduce): the survivors on both nodes time out in the round before NCCL,
  # none waits inside it. At 2x2 only: the rounds are the same code at 3x1.
  foreach(call malloc allreduce)
    sp_multinode_test(rank_dies_${call} 2 2 TARGET sym_exit CUDA_DOUBLE ARGS ${call}
      MPIRUN --mca orte_abort_on_non_zero_status 0
      ENV "CUDA_DOUBLE_GPUS=2"
      PASS "sym-exit: ok rank 0.*sym-exit: ok rank 1|sym-exit: ok rank 1.*sym-exit: ok rank 0"
      FAIL "sym-exit: FAIL")
  endforeach()
endif()
