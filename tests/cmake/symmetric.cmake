# symmetric.cmake: registrations for world/ and symmetric/ beyond the tests/mpi glob:
#  - the path where sympool initializes MPI itself (a main without MPI_Init), singleton and
#    under mpirun;
#  - the sympoolrun launcher: --help, the forwarding flags (with a fake Open MPI launcher that
#    prints its arguments), and a real job whose ranks check SYMPOOL_DEBUG arrived;
#  - the timeout test with SYMPOOL_SYM_TIMEOUT=1 in its environment;
#  - the C programs for what a GoogleTest process cannot set up (an exiting rank, MPI finalized
#    by the user, two host devices for a report whose ranks are on different devices).
if(NOT SP_HAVE_MPI)
  return()
endif()

add_executable(sp_world_init_self ${CMAKE_CURRENT_LIST_DIR}/symmetric_world_init.c)
target_compile_options(sp_world_init_self PRIVATE ${SP_WARN})
target_link_libraries(sp_world_init_self PRIVATE sympool_static MPI::MPI_C)
if(SP_HAVE_CUDA)
  # On the cuda backend it reads and writes device memory through cudaMemcpy.
  target_compile_definitions(sp_world_init_self PRIVATE SP_HAVE_CUDA=1)
  target_link_libraries(sp_world_init_self PRIVATE CUDA::cudart)
endif()

add_test(NAME mpi.world_init_self.singleton COMMAND $<TARGET_FILE:sp_world_init_self>)
add_test(NAME mpi.world_init_self.np2
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
          $<TARGET_FILE:sp_world_init_self>)
set_tests_properties(mpi.world_init_self.singleton mpi.world_init_self.np2 PROPERTIES
  LABELS mpi TIMEOUT 120 ENVIRONMENT "${SP_TEST_ENV}"
  PASS_REGULAR_EXPRESSION "world-init-self: ok rank 0"
  FAIL_REGULAR_EXPRESSION "FAILED")

set(SP_SYMPOOLRUN ${PROJECT_SOURCE_DIR}/tools/sympoolrun)
set(SP_FAKE_LAUNCHER ${CMAKE_CURRENT_BINARY_DIR}/fake-ompi-mpirun)
file(WRITE ${SP_FAKE_LAUNCHER}
  "#!/bin/sh\n"
  "# A stand-in for Open MPI's mpirun: answers --version like it, prints its arguments.\n"
  "if [ \"$1\" = --version ]; then echo 'mpirun (Open MPI) 4.1.4'; exit 0; fi\n"
  "echo \"fake-mpirun args: $*\"\n")
file(CHMOD ${SP_FAKE_LAUNCHER} PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
  GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)

# The two tests below check the exact list of forwarded variables, so they run in an environment
# of their own (env -i): whatever SYMPOOL_*/NCCL_* the caller has (a GPU machine exports
# NCCL_ROOT, scripts/gpu-check.sh SYMPOOL_CACHE_DIR) must not reach the list.
set(SP_CLEAN_ENV env -i "PATH=$ENV{PATH}" "SYMPOOLRUN_LAUNCHER=${SP_FAKE_LAUNCHER}")
add_test(NAME sympoolrun.help COMMAND ${SP_CLEAN_ENV} SYMPOOL_DEBUG=INFO ${SP_SYMPOOLRUN} --help)
set_tests_properties(sympoolrun.help PROPERTIES LABELS mpi
  PASS_REGULAR_EXPRESSION "launcher: +${SP_FAKE_LAUNCHER}.*forwarded: +SYMPOOL_DEBUG")

add_test(NAME sympoolrun.forwards_variables
  COMMAND ${SP_CLEAN_ENV} SYMPOOL_DEBUG=INFO NCCL_DEBUG=WARN SYMPOOL_HOST_CAPACITY=1GiB
          ${SP_SYMPOOLRUN} -np 3 ./prog "two words")
set_tests_properties(sympoolrun.forwards_variables PROPERTIES LABELS mpi
  PASS_REGULAR_EXPRESSION "fake-mpirun args: -x NCCL_DEBUG -x SYMPOOL_DEBUG -x SYMPOOL_HOST_CAPACITY -np 3 ./prog two words")

# Only variables this environment has: a value holding a newline and then NAME=... (here X's
# and SYMPOOL_DEBUG's) made `env`'s listing show names that are not set, and each got a -x.
add_test(NAME sympoolrun.forwards_only_set_variables
  COMMAND ${SP_CLEAN_ENV} "X=a\nSYMPOOL_EVIL=1" "SYMPOOL_DEBUG=INFO\nNCCL_EVIL=2"
          ${SP_SYMPOOLRUN} -np 2 ./prog)
set_tests_properties(sympoolrun.forwards_only_set_variables PROPERTIES LABELS mpi
  PASS_REGULAR_EXPRESSION "fake-mpirun args: -x SYMPOOL_DEBUG -np 2 ./prog"
  FAIL_REGULAR_EXPRESSION "EVIL")

add_test(NAME sympoolrun.no_launcher COMMAND ${SP_SYMPOOLRUN} -np 2 true)
set_tests_properties(sympoolrun.no_launcher PROPERTIES LABELS mpi
  ENVIRONMENT "SYMPOOLRUN_LAUNCHER=/nonexistent/mpirun" WILL_FAIL TRUE)
# ... saying that, once (it went on with "no MPI launcher found (tried mpirun, mpiexec, srun);
# set SYMPOOLRUN_LAUNCHER", which it had neither tried nor left unset), and exiting 127.
add_test(NAME sympoolrun.bad_launcher_one_line COMMAND sh -c "\"$0\" -np 2 true 2>&1; echo rc=$?"
  ${SP_SYMPOOLRUN})
set_tests_properties(sympoolrun.bad_launcher_one_line PROPERTIES LABELS mpi
  ENVIRONMENT "SYMPOOLRUN_LAUNCHER=/nonexistent/mpirun"
  PASS_REGULAR_EXPRESSION "^sympoolrun: SYMPOOLRUN_LAUNCHER=/nonexistent/mpirun is not an executable\nrc=127\n$")

add_test(NAME sympoolrun.np2_world_init_self
  COMMAND ${SP_SYMPOOLRUN} -np 2 --oversubscribe $<TARGET_FILE:sp_world_init_self>)
set_tests_properties(sympoolrun.np2_world_init_self PROPERTIES LABELS mpi TIMEOUT 120
  ENVIRONMENT "${SP_TEST_ENV};SYMPOOLRUN_LAUNCHER=${MPIEXEC_EXECUTABLE};SYMPOOL_DEBUG=VERSION;SP_EXPECT_SYMPOOL_DEBUG=VERSION"
  PASS_REGULAR_EXPRESSION "world-init-self: ok rank 0"
  FAIL_REGULAR_EXPRESSION "FAILED")

if(TARGET test_symmetric_timeout)
  add_test(NAME mpi.test_symmetric_timeout.env_timeout_1s.np4
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe
            $<TARGET_FILE:test_symmetric_timeout>)
  set_tests_properties(mpi.test_symmetric_timeout.env_timeout_1s.np4 PROPERTIES LABELS mpi
    TIMEOUT 120 ENVIRONMENT "${SP_TEST_ENV};SYMPOOL_SYM_TIMEOUT=1")
endif()

# Growth holds no pool lock while ranks wait (two threads, two pools, opposite
# orders; an sp_malloc during a growth waiting for a late rank). Needs MPI_THREAD_MULTIPLE.
add_executable(sym_threads ${PROJECT_SOURCE_DIR}/tests/mpi/sym_threads.cc
                           ${PROJECT_SOURCE_DIR}/tests/mpi/mpi_main.cc)
target_compile_options(sym_threads PRIVATE ${SP_WARN_CXX})
target_compile_definitions(sym_threads PRIVATE SP_MPI_THREAD_MULTIPLE=1)
target_link_libraries(sym_threads PRIVATE sp_test_shim MPI::MPI_CXX MPI::MPI_C)
sp_test_use_pch(sym_threads)
add_test(NAME mpi.sym_threads.np2
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe $<TARGET_FILE:sym_threads>)
set_tests_properties(mpi.sym_threads.np2 PROPERTIES LABELS mpi TIMEOUT 120
  ENVIRONMENT "${SP_TEST_ENV}")

# Every collective call a clear error on every rank (skip, add, delay, bad arguments),
# each call under test bounded by a 1 s deadline (the fixture sets it around the call, 120 s
# elsewhere); at 2 and 4 ranks only.
add_executable(sym_faults ${PROJECT_SOURCE_DIR}/tests/mpi/sym_faults.cc
                          $<TARGET_OBJECTS:sp_test_mpi_main>)
target_compile_options(sym_faults PRIVATE ${SP_WARN_CXX})
target_link_libraries(sym_faults PRIVATE sp_test_shim MPI::MPI_CXX MPI::MPI_C)
sp_test_use_pch(sym_faults)
foreach(np 2 4)
  add_test(NAME mpi.sym_faults.np${np}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
            $<TARGET_FILE:sym_faults>)
  set_tests_properties(mpi.sym_faults.np${np} PROPERTIES LABELS mpi TIMEOUT 180
    ENVIRONMENT "${SP_TEST_ENV}")
endforeach()

# A rank that _exits right before each kind of collective call; the survivors get
# SP_ERR_TIMEOUT naming the call within the deadline. Open MPI lets survivors go on only with
# orte_abort_on_non_zero_status=0; mpirun's own status is not the verdict (the survivors cannot
# finalize with a dead peer), the printed lines are.
add_executable(sym_exit ${PROJECT_SOURCE_DIR}/tests/mpi/sym_exit.c)
target_compile_options(sym_exit PRIVATE ${SP_WARN})
target_link_libraries(sym_exit PRIVATE sympool_static MPI::MPI_C)
foreach(call create malloc empty_cache destroy allreduce allgather reduce_scatter broadcast
        stats_aggregate stats_report)
  add_test(NAME mpi.sym_exit.${call}.np3
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3 --oversubscribe
            --mca orte_abort_on_non_zero_status 0 $<TARGET_FILE:sym_exit> ${call})
  # No SYMPOOL_SYM_TIMEOUT here: sym_exit sets its deadlines itself (sp_x_option_set wins).
  set_tests_properties(mpi.sym_exit.${call}.np3 PROPERTIES LABELS mpi TIMEOUT 60
    ENVIRONMENT "${SP_TEST_ENV}"
    PASS_REGULAR_EXPRESSION "sym-exit: ok rank 0.*sym-exit: ok rank 1|sym-exit: ok rank 1.*sym-exit: ok rank 0"
    FAIL_REGULAR_EXPRESSION "sym-exit: FAIL")
endforeach()

# A C program of tests/mpi run on 2 ranks: each rank prints "TAG: ok rank R" (both must) or
# "TAG: FAIL"; ENV is added to the test's environment.
function(sp_mpi_c_test_np2 exe tag env)
  add_executable(${exe} ${PROJECT_SOURCE_DIR}/tests/mpi/${exe}.c)
  target_compile_options(${exe} PRIVATE ${SP_WARN})
  target_link_libraries(${exe} PRIVATE sympool_static MPI::MPI_C)
  add_test(NAME mpi.${exe}.np2
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe $<TARGET_FILE:${exe}>)
  set_tests_properties(mpi.${exe}.np2 PROPERTIES LABELS mpi TIMEOUT 60
    ENVIRONMENT "${SP_TEST_ENV};${env}"
    PASS_REGULAR_EXPRESSION "${tag}: ok rank 0.*${tag}: ok rank 1|${tag}: ok rank 1.*${tag}: ok rank 0"
    FAIL_REGULAR_EXPRESSION "${tag}: FAIL")
endfunction()

# World creation whose deadline passes while its communicator duplicate is in flight on every
# rank: the same SP_ERR_TIMEOUT everywhere, and the user's MPI_Finalize afterwards completes (the
# ok line is printed after it).
sp_mpi_c_test_np2(world_dup_abandoned world-dup-abandoned "SYMPOOL_SYM_TIMEOUT=1e-9")

# sympool initialized MPI and a peer never comes to sp_world_init (init) or sp_world_finalize
# (finalize): the waiting rank returns SP_ERR_TIMEOUT at its deadline with MPI still initialized,
# instead of waiting in MPI_Finalize (collective over the job) until the peer ends.
add_executable(world_peer_missing ${PROJECT_SOURCE_DIR}/tests/mpi/world_peer_missing.c)
target_compile_options(world_peer_missing PRIVATE ${SP_WARN})
target_link_libraries(world_peer_missing PRIVATE sympool_static MPI::MPI_C)
foreach(mode init finalize)
  add_test(NAME mpi.world_peer_missing.${mode}.np2
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
            $<TARGET_FILE:world_peer_missing> ${mode})
  set_tests_properties(mpi.world_peer_missing.${mode}.np2 PROPERTIES LABELS mpi TIMEOUT 120
    ENVIRONMENT "${SP_TEST_ENV};SYMPOOL_SYM_TIMEOUT=1"
    PASS_REGULAR_EXPRESSION "world-peer-missing: ok rank 0.*world-peer-missing: ok rank 1|world-peer-missing: ok rank 1.*world-peer-missing: ok rank 0"
    FAIL_REGULAR_EXPRESSION "world-peer-missing: FAIL")
endforeach()

# The user finalizes MPI while a world and a symmetric pool are live: every later collective
# call is refused with SP_ERR_INVALID_USAGE instead of entering MPI (an abort), and
# sp_world_finalize still frees the world.
sp_mpi_c_test_np2(sym_mpi_gone sym-mpi-gone "SYMPOOL_SYM_TIMEOUT=5")

# sp_symmetric_peer_ptr from a worker thread with MPI at MPI_THREAD_FUNNELED: no MPI call off
# the main thread (the mpi registrar's peer table is filled when the segment is made).
sp_mpi_c_test_np2(sym_peer_funneled sym-peer-funneled "SYMPOOL_SYM_TIMEOUT=20")

# Ranks that report different devices (each its own, as on a cuda node): the report's header
# and JSON name them all, not the root's alone. Two host devices, rank r on device r.
sp_mpi_c_test_np2(stats_devices stats-devices "SYMPOOL_HOST_DEVICES=2;SYMPOOL_SYM_TIMEOUT=20")
# Host names that are no UTF-8 (a name cut inside a character, a 0xFF byte): the JSON and
# Prometheus reports are UTF-8 all the same.
sp_mpi_c_test_np2(stats_utf8 stats-utf8 "SYMPOOL_SYM_TIMEOUT=20")

# fork() while another thread is inside a symmetric pool call (holding the pool's lock, which a
# call keeps across its rounds): the child refuses every world, symmetric and collective call
# with SP_ERR_INVALID_USAGE instead of waiting for that lock forever. One rank: the child's
# refusals need no peer.
add_executable(world_fork ${PROJECT_SOURCE_DIR}/tests/mpi/world_fork.c)
target_compile_options(world_fork PRIVATE ${SP_WARN})
target_link_libraries(world_fork PRIVATE sympool_static MPI::MPI_C Threads::Threads)
add_test(NAME mpi.world_fork.np1
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 $<TARGET_FILE:world_fork>)
set_tests_properties(mpi.world_fork.np1 PROPERTIES LABELS mpi TIMEOUT 60
  ENVIRONMENT "${SP_TEST_ENV};SYMPOOL_SYM_TIMEOUT=20"
  PASS_REGULAR_EXPRESSION "world-fork: ok"
  FAIL_REGULAR_EXPRESSION "world-fork: FAIL")
