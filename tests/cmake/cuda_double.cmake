# cuda_double.cmake: the whole suite on the cuda backend under the CUDA/NCCL test doubles
# (-DSYMPOOL_CUDA_DOUBLE=ON; tests/cuda_double/), label cuda_double: every unit test (what needs
# the host backend skips with its reason), the MPI tests at 1, 2 and 4 ranks (each rank its own
# double GPU: CUDA_DOUBLE_GPUS=4, device = local rank, as sp_world_init picks it), the examples,
# the CLI, the doubles' own rule tests and the PyTorch pluggable-allocator harness. The only
# difference from a GPU run is LD_LIBRARY_PATH, which puts the doubles before the real libraries.
if(NOT SYMPOOL_CUDA_DOUBLE)
  return()
endif()

set(SP_DBL_LIBDIR ${PROJECT_BINARY_DIR}/cuda-double)
set(SP_DBL_ENV_BASE "SYMPOOL_DEVICE=cuda" "SYMPOOL_TEST_DEVICE=cuda" "LD_LIBRARY_PATH=${SP_DBL_LIBDIR}"
  "CUDA_DOUBLE_NCCL_TIMEOUT=60"
  "SP_TEST_DATA_DIR=${CMAKE_CURRENT_SOURCE_DIR}/data"
  "OMPI_ALLOW_RUN_AS_ROOT=1" "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
  "OMPI_MCA_rmaps_base_oversubscribe=1" "OMPI_MCA_mpi_yield_when_idle=1" "OMPI_MCA_btl_vader_single_copy_mechanism=none")
set(SP_DBL_ENV ${SP_DBL_ENV_BASE} "CUDA_DOUBLE_GPUS=1")
set(SP_DBL_ENV_MPI ${SP_DBL_ENV_BASE} "CUDA_DOUBLE_GPUS=4")
# Unit tests: the same binaries, registered a second time with the doubles' environment when
# ctest starts (tests/cuda_double/discover.cmake), one GPU each, each binary one test running all
# of its tests in one process, as a training job runs on one CUDA context: one process a test
# cost 60 of this build's test-seconds for 674 tests, the binaries whole 21 s one after the other
# (s38-ci). test_cuda_double's rules are about a fresh process (the first call that makes a
# context, ...): each of its tests runs alone.
# Left out: the suites that never reach a device backend (no sp_init, sp_malloc or pool: the free
# set, the lock, the pickle reader, the option table), which the doubles cannot change; they run
# in the sanitized stages (test_block_set alone took 16 s of this stage, s45).
set(SP_DBL_SKIP_UNIT test_block_set test_lock test_pickle test_core)
set(SP_DBL_BINARIES)
foreach(src ${SP_UNIT_TESTS})
  get_filename_component(name ${src} NAME_WE)
  if(TARGET ${name} AND NOT name IN_LIST SP_DBL_SKIP_UNIT) # TSan leaves some out (SP_TSAN_SKIP_UNIT)
    list(APPEND SP_DBL_BINARIES "$<TARGET_FILE:${name}>|1|whole")
  endif()
endforeach()

# The doubles' own rules, and sympool's cuda path held to them.
add_executable(test_cuda_double ${PROJECT_SOURCE_DIR}/tests/cuda_double/test_cuda_double.cc)
target_compile_options(test_cuda_double PRIVATE ${SP_WARN_CXX})
target_include_directories(test_cuda_double SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS} ${NCCL_INCLUDE_DIR})
target_link_libraries(test_cuda_double PRIVATE sp_test_shim GTest::gtest_main ${CMAKE_DL_LIBS})
sp_test_use_pch(test_cuda_double)
add_dependencies(test_cuda_double sp_cuda_double)
list(APPEND SP_DBL_BINARIES "$<TARGET_FILE:test_cuda_double>|2|each")
file(GENERATE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/cuda_double_tests.cmake CONTENT
  "set(SP_DBL_BINARIES [==[${SP_DBL_BINARIES}]==])
set(SP_DBL_ENV [==[${SP_DBL_ENV_BASE}]==])
include(${PROJECT_SOURCE_DIR}/tests/cuda_double/discover.cmake)
")
set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${CMAKE_CURRENT_BINARY_DIR}/cuda_double_tests.cmake)

# PyTorch's CUDAPluggableAllocator driving sp_torch_* (tests/cuda_double/torch_harness.c).
add_executable(sp_torch_harness ${PROJECT_SOURCE_DIR}/tests/cuda_double/torch_harness.c)
target_compile_options(sp_torch_harness PRIVATE ${SP_WARN})
target_compile_definitions(sp_torch_harness PRIVATE _GNU_SOURCE)
target_include_directories(sp_torch_harness SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
target_link_libraries(sp_torch_harness PRIVATE CUDA::cudart ${CMAKE_DL_LIBS})
add_dependencies(sp_torch_harness sympool)
add_dependencies(sp_torch_harness sp_cuda_double)
foreach(gpus 1 2)
  add_test(NAME cuda_double.torch_harness.gpus${gpus}
    COMMAND $<TARGET_FILE:sp_torch_harness> $<TARGET_FILE:sympool>)
  set_tests_properties(cuda_double.torch_harness.gpus${gpus} PROPERTIES LABELS cuda_double
    TIMEOUT 120 ENVIRONMENT "${SP_DBL_ENV_BASE};CUDA_DOUBLE_GPUS=${gpus};CUDA_DOUBLE_MEMORY=1GiB"
    PASS_REGULAR_EXPRESSION "torch-harness: ok" FAIL_REGULAR_EXPRESSION "torch-harness: FAIL")
endforeach()

# Without a usable GPU (none, or the host backend chosen), PyTorch gets NULL, never host memory.
add_test(NAME cuda_double.torch_harness.no_gpu
  COMMAND $<TARGET_FILE:sp_torch_harness> $<TARGET_FILE:sympool> --expect-refused)
add_test(NAME cuda_double.torch_harness.host_backend
  COMMAND $<TARGET_FILE:sp_torch_harness> $<TARGET_FILE:sympool> --expect-refused)
set_tests_properties(cuda_double.torch_harness.no_gpu PROPERTIES LABELS cuda_double TIMEOUT 60
  ENVIRONMENT "${SP_DBL_ENV_BASE};CUDA_DOUBLE_GPUS=0"
  PASS_REGULAR_EXPRESSION "torch-harness: ok" FAIL_REGULAR_EXPRESSION "torch-harness: FAIL")
set(env ${SP_DBL_ENV})
list(REMOVE_ITEM env "SYMPOOL_DEVICE=cuda")
set_tests_properties(cuda_double.torch_harness.host_backend PROPERTIES LABELS cuda_double
  TIMEOUT 60 ENVIRONMENT "${env};SYMPOOL_DEVICE=host"
  PASS_REGULAR_EXPRESSION "torch-harness: ok" FAIL_REGULAR_EXPRESSION "torch-harness: FAIL")

if(SP_HAVE_MPI)
  # sympool's NCCL paths with failures injected into the doubles (tests/cuda_double/). Some of
  # its tests grow pools and run collectives from several threads at once: MPI_THREAD_MULTIPLE
  # (mpi_main.cc compiled in, as sym_threads does).
  add_executable(test_cuda_double_mpi ${PROJECT_SOURCE_DIR}/tests/cuda_double/test_cuda_double_mpi.cc
    ${PROJECT_SOURCE_DIR}/tests/mpi/mpi_main.cc)
  target_compile_options(test_cuda_double_mpi PRIVATE ${SP_WARN_CXX})
  target_compile_definitions(test_cuda_double_mpi PRIVATE SP_MPI_THREAD_MULTIPLE=1)
  target_include_directories(test_cuda_double_mpi PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/mpi)
  target_include_directories(test_cuda_double_mpi SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS}
    ${NCCL_INCLUDE_DIR})
  target_link_libraries(test_cuda_double_mpi PRIVATE sp_test_shim MPI::MPI_CXX MPI::MPI_C
    ${CMAKE_DL_LIBS})
  sp_test_use_pch(test_cuda_double_mpi)
  add_dependencies(test_cuda_double_mpi sp_cuda_double)
  foreach(np 2 4)
    add_test(NAME cuda_double.mpi.test_cuda_double_mpi.np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_cuda_double_mpi> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(cuda_double.mpi.test_cuda_double_mpi.np${np} PROPERTIES
      LABELS cuda_double TIMEOUT 300
      ENVIRONMENT "${SP_DBL_ENV_MPI};CUDA_DOUBLE_MEMORY=256MiB;SYMPOOL_SYM_TIMEOUT=20")
  endforeach()
  # A rank that never joins the gather of the node's GPU table: its peers time out there (they
  # used to wait for good). Its own run with a short deadline, so the wait costs CI 2 s.
  add_test(NAME cuda_double.mpi.test_cuda_double_mpi.skip_gather.np2
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_cuda_double_mpi> ${MPIEXEC_POSTFLAGS}
            --gtest_filter=*APeerThatNeverJoinsTheNodeGpuTableIsATimeoutNotAHang)
  set_tests_properties(cuda_double.mpi.test_cuda_double_mpi.skip_gather.np2 PROPERTIES
    LABELS cuda_double TIMEOUT 60
    ENVIRONMENT "${SP_DBL_ENV_MPI};CUDA_DOUBLE_MEMORY=256MiB;SYMPOOL_SYM_TIMEOUT=2")
  # The world's NCCL set-up failing on one rank only: the others give up at the deadline (they
  # used to wait in NCCL's bootstrap for good). Their own runs with a short deadline.
  foreach(np 2 4)
    add_test(NAME cuda_double.mpi.test_cuda_double_mpi.nccl_init.np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_cuda_double_mpi> ${MPIEXEC_POSTFLAGS}
              --gtest_filter=*NcclSetUpFailingOnOneRankFailsEveryRankWithinTheDeadline)
    set_tests_properties(cuda_double.mpi.test_cuda_double_mpi.nccl_init.np${np} PROPERTIES
      LABELS cuda_double TIMEOUT 120
      ENVIRONMENT "${SP_DBL_ENV_MPI};CUDA_DOUBLE_MEMORY=256MiB;SYMPOOL_SYM_TIMEOUT=2")
  endforeach()
  add_test(NAME cuda_double.mpi.test_cuda_double_mpi.old_nccl.np2
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_cuda_double_mpi> ${MPIEXEC_POSTFLAGS}
            --gtest_filter=*NcclVersionIsLoggedOnce)
  set_tests_properties(cuda_double.mpi.test_cuda_double_mpi.old_nccl.np2 PROPERTIES
    LABELS cuda_double TIMEOUT 120
    ENVIRONMENT "${SP_DBL_ENV_MPI};CUDA_DOUBLE_NCCL_VERSION=22703")
  # Ranks with their own CUDA_VISIBLE_DEVICES (MPMD: one list a rank), where an ordinal names
  # different GPUs in different processes: "hidden" (rank 0 sees GPU 0, rank 1 GPUs 1,2 and is
  # on 2) and "reordered" (rank 0 sees 0,1; rank 1 sees 2,1,0 and is on 1; GPUs 0 and 1 have no
  # P2P).
  foreach(case hidden reordered)
    if(case STREQUAL "hidden")
      set(vis0 0)
      set(vis1 1,2)
      set(extra "")
    else()
      set(vis0 0,1)
      set(vis1 2,1,0)
      set(extra ";CUDA_DOUBLE_NO_P2P=0:1")
    endif()
    add_test(NAME cuda_double.mpi.test_cuda_double_mpi.visible_${case}.np2
      COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe
              ${MPIEXEC_NUMPROC_FLAG} 1 -x CUDA_VISIBLE_DEVICES=${vis0}
              $<TARGET_FILE:test_cuda_double_mpi> --gtest_filter=*GpusBusIdsNotTheRanksOrdinals :
              ${MPIEXEC_NUMPROC_FLAG} 1 -x CUDA_VISIBLE_DEVICES=${vis1}
              $<TARGET_FILE:test_cuda_double_mpi> --gtest_filter=*GpusBusIdsNotTheRanksOrdinals)
    set_tests_properties(cuda_double.mpi.test_cuda_double_mpi.visible_${case}.np2 PROPERTIES
      LABELS cuda_double TIMEOUT 120
      ENVIRONMENT "${SP_DBL_ENV_MPI};CUDA_DOUBLE_MEMORY=256MiB;SYMPOOL_SYM_TIMEOUT=20;SP_TEST_VISIBLE_CASE=${case}${extra}")
  endforeach()
  # NCCL reads NCCL_SYM_KERNEL once a process (2.28.9 src/sym_kernels.cc kernelMask_user): the
  # tests of it run in processes of their own, where the variable is set before any collective.
  foreach(np 2 4)
    add_test(NAME cuda_double.mpi.test_cuda_double_mpi.sym_kernel.np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_cuda_double_mpi> ${MPIEXEC_POSTFLAGS}
              --gtest_filter=*NcclSymKernelNamesTheOnlyKernel)
    set_tests_properties(cuda_double.mpi.test_cuda_double_mpi.sym_kernel.np${np} PROPERTIES
      LABELS cuda_double TIMEOUT 120
      ENVIRONMENT "${SP_DBL_ENV_MPI};CUDA_DOUBLE_MEMORY=256MiB;NCCL_SYM_KERNEL=AllGather_LL")
    add_test(NAME cuda_double.mpi.test_cuda_double_mpi.sym_kernel_rank0.np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_cuda_double_mpi> ${MPIEXEC_POSTFLAGS}
              --gtest_filter=*NcclSymKernelOnOneRankOnlyFailsEveryRank)
    set_tests_properties(cuda_double.mpi.test_cuda_double_mpi.sym_kernel_rank0.np${np} PROPERTIES
      LABELS cuda_double TIMEOUT 120
      ENVIRONMENT "${SP_DBL_ENV_MPI};CUDA_DOUBLE_MEMORY=256MiB;SYMPOOL_SYM_TIMEOUT=20;SP_TEST_SYM_KERNEL_RANK0=AllGather_ST")
  endforeach()

  foreach(src ${SP_MPI_TESTS})
    get_filename_component(name ${src} NAME_WE)
    set(nps 1 2 4)
    if(name STREQUAL "test_symmetric_timeout")
      set(nps 2 4) # a rank that stops calling needs a peer (it fails at one rank on host too)
    endif()
    foreach(np ${nps})
      add_test(NAME cuda_double.mpi.${name}.np${np}
        COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS})
      set_tests_properties(cuda_double.mpi.${name}.np${np} PROPERTIES LABELS cuda_double
        TIMEOUT 300 ENVIRONMENT "${SP_DBL_ENV_MPI}")
    endforeach()
  endforeach()

  if(TARGET sp_world_init_self)
    add_test(NAME cuda_double.world_init_self.singleton COMMAND $<TARGET_FILE:sp_world_init_self>)
    add_test(NAME cuda_double.world_init_self.np2
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
              $<TARGET_FILE:sp_world_init_self>)
    set_tests_properties(cuda_double.world_init_self.singleton cuda_double.world_init_self.np2
      PROPERTIES LABELS cuda_double TIMEOUT 120 ENVIRONMENT "${SP_DBL_ENV_MPI}"
      PASS_REGULAR_EXPRESSION "world-init-self: ok rank 0" FAIL_REGULAR_EXPRESSION "FAILED")
  endif()

  # Ranks on different backends (rank 0 on cuda, the others on host): world creation fails on
  # every rank with SP_ERR_DEVICE, instead of the host ranks returning success while rank 0
  # waits in the NCCL set-up for good. The verdict is mpirun's status (every rank exits 0 only
  # when it saw SP_ERR_DEVICE) and no FAIL line.
  add_executable(world_mixed_backend ${PROJECT_SOURCE_DIR}/tests/mpi/world_mixed_backend.c)
  target_compile_options(world_mixed_backend PRIVATE ${SP_WARN})
  target_link_libraries(world_mixed_backend PRIVATE sympool MPI::MPI_C)
  add_dependencies(world_mixed_backend sp_cuda_double)
  foreach(np 2 3)
    add_test(NAME cuda_double.world_mixed_backend.np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
              $<TARGET_FILE:world_mixed_backend>)
    set_tests_properties(cuda_double.world_mixed_backend.np${np} PROPERTIES LABELS cuda_double
      TIMEOUT 60 ENVIRONMENT "${SP_DBL_ENV_MPI};SYMPOOL_SYM_TIMEOUT=5"
      FAIL_REGULAR_EXPRESSION "world-mixed-backend: FAIL")
  endforeach()

  # More ranks than GPUs on a node: NCCL refuses the duplicate GPU; sp_world_init must fail on
  # every rank with a message instead of hanging.
  if(TARGET sp_world_init_self)
    add_test(NAME cuda_double.world_init_self.np2_one_gpu
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
              $<TARGET_FILE:sp_world_init_self>)
    set(env ${SP_DBL_ENV})
    set_tests_properties(cuda_double.world_init_self.np2_one_gpu PROPERTIES LABELS cuda_double
      TIMEOUT 120 ENVIRONMENT "${env}" WILL_FAIL TRUE)
  endif()

  set(SP_DBL_EXAMPLES "01_train_step:4" "01_train_step:1" "02_symmetric_basics:2"
    "02_symmetric_basics:4" "03_stats_report:2")
  foreach(run ${SP_DBL_EXAMPLES})
    string(REPLACE ":" ";" parts ${run})
    list(GET parts 0 name)
    list(GET parts 1 np)
    if(TARGET ${name})
      set(args)
      if(name STREQUAL "01_train_step")
        set(args --out ${CMAKE_CURRENT_BINARY_DIR}/cuda_double_example_01_np${np})
      endif()
      add_test(NAME cuda_double.example.${name}.np${np}
        COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${args} ${MPIEXEC_POSTFLAGS})
      set_tests_properties(cuda_double.example.${name}.np${np} PROPERTIES LABELS cuda_double
        TIMEOUT 300 ENVIRONMENT "${SP_DBL_ENV_MPI}")
    endif()
  endforeach()
endif()

if(TARGET sympool_cli)
  add_test(NAME cuda_double.cli.info COMMAND $<TARGET_FILE:sympool_cli> info)
  set_tests_properties(cuda_double.cli.info PROPERTIES LABELS cuda_double TIMEOUT 60
    ENVIRONMENT "${SP_DBL_ENV}"
    PASS_REGULAR_EXPRESSION "backend: cuda.*devices: 1.*NCCL 2\\.28\\.9")
  add_test(NAME cuda_double.cli.info_auto_picks_cuda COMMAND $<TARGET_FILE:sympool_cli> info)
  set(env ${SP_DBL_ENV})
  list(REMOVE_ITEM env "SYMPOOL_DEVICE=cuda")
  set_tests_properties(cuda_double.cli.info_auto_picks_cuda PROPERTIES LABELS cuda_double
    TIMEOUT 60 ENVIRONMENT "${env};SYMPOOL_DEVICE=auto" PASS_REGULAR_EXPRESSION "backend: cuda")
  add_test(NAME cuda_double.cli.info_no_gpu_falls_back COMMAND $<TARGET_FILE:sympool_cli> info)
  set(env ${SP_DBL_ENV_BASE})
  list(REMOVE_ITEM env "SYMPOOL_DEVICE=cuda")
  set_tests_properties(cuda_double.cli.info_no_gpu_falls_back PROPERTIES LABELS cuda_double
    TIMEOUT 60 ENVIRONMENT "${env};SYMPOOL_DEVICE=auto;CUDA_DOUBLE_GPUS=0"
    PASS_REGULAR_EXPRESSION "backend: host")
  set(SP_DBL_TRACE ${CMAKE_CURRENT_SOURCE_DIR}/data/cs336-2.7b-ctx128-forward-bf16.pickle)
  add_test(NAME cuda_double.cli.replay_json COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DBL_TRACE} --json)
  set_tests_properties(cuda_double.cli.replay_json PROPERTIES LABELS cuda_double TIMEOUT 120
    ENVIRONMENT "${SP_DBL_ENV}" PASS_REGULAR_EXPRESSION "\"ooms\":0,")
endif()
