# symmetric.cmake: registrations for launch/ and symmetric/ beyond the tests/mpi glob:
#  - the path where sympool initializes MPI itself (a main without MPI_Init), singleton and
#    under mpirun;
#  - the sympoolrun launcher: --help, the forwarding flags (with a fake Open MPI launcher that
#    prints its arguments), and a real job whose ranks check SYMPOOL_DEBUG arrived;
#  - the timeout test with SYMPOOL_SYM_TIMEOUT=1 in its environment.
if(NOT SP_HAVE_MPI)
  return()
endif()

add_executable(sp_world_init_self ${CMAKE_CURRENT_LIST_DIR}/symmetric_world_init.c)
target_compile_options(sp_world_init_self PRIVATE ${SP_WARN})
target_link_libraries(sp_world_init_self PRIVATE sympool_static MPI::MPI_C)

add_test(NAME mpi.world_init_self.singleton COMMAND $<TARGET_FILE:sp_world_init_self>)
add_test(NAME mpi.world_init_self.np2
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
          $<TARGET_FILE:sp_world_init_self>)
set_tests_properties(mpi.world_init_self.singleton mpi.world_init_self.np2 PROPERTIES
  LABELS mpi TIMEOUT 120 ENVIRONMENT "${SP_TEST_ENV}"
  PASS_REGULAR_EXPRESSION "world-init-self: ok rank 0"
  FAIL_REGULAR_EXPRESSION "FAILED")

set(SP_SYMPOOLRUN ${PROJECT_SOURCE_DIR}/launch/sympoolrun)
set(SP_FAKE_LAUNCHER ${CMAKE_CURRENT_BINARY_DIR}/fake-ompi-mpirun)
file(WRITE ${SP_FAKE_LAUNCHER}
  "#!/bin/sh\n"
  "# A stand-in for Open MPI's mpirun: answers --version like it, prints its arguments.\n"
  "if [ \"$1\" = --version ]; then echo 'mpirun (Open MPI) 4.1.4'; exit 0; fi\n"
  "echo \"fake-mpirun args: $*\"\n")
file(CHMOD ${SP_FAKE_LAUNCHER} PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
  GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)

add_test(NAME sympoolrun.help COMMAND ${SP_SYMPOOLRUN} --help)
set_tests_properties(sympoolrun.help PROPERTIES LABELS mpi
  ENVIRONMENT "SYMPOOLRUN_LAUNCHER=${SP_FAKE_LAUNCHER};SYMPOOL_DEBUG=INFO"
  PASS_REGULAR_EXPRESSION "launcher: +${SP_FAKE_LAUNCHER}.*forwarded: +SYMPOOL_DEBUG")

add_test(NAME sympoolrun.forwards_variables
  COMMAND ${SP_SYMPOOLRUN} -np 3 ./prog "two words")
set_tests_properties(sympoolrun.forwards_variables PROPERTIES LABELS mpi
  ENVIRONMENT "SYMPOOLRUN_LAUNCHER=${SP_FAKE_LAUNCHER};SYMPOOL_DEBUG=INFO;NCCL_DEBUG=WARN;SYMPOOL_HOST_CAPACITY=1GiB"
  PASS_REGULAR_EXPRESSION "fake-mpirun args: -x NCCL_DEBUG -x SYMPOOL_DEBUG -x SYMPOOL_HOST_CAPACITY -np 3 ./prog two words")

add_test(NAME sympoolrun.no_launcher COMMAND ${SP_SYMPOOLRUN} -np 2 true)
set_tests_properties(sympoolrun.no_launcher PROPERTIES LABELS mpi
  ENVIRONMENT "SYMPOOLRUN_LAUNCHER=/nonexistent/mpirun" WILL_FAIL TRUE)

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
