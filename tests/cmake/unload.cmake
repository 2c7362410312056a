# A thread that used the library outlives its dlclose (tests/unload/unload_probe.c): the pthread
# keys' destructors must not be left pointing into the unloaded code.
add_executable(sp_unload_probe ${PROJECT_SOURCE_DIR}/tests/unload/unload_probe.c)
target_compile_options(sp_unload_probe PRIVATE ${SP_WARN})
target_link_libraries(sp_unload_probe PRIVATE Threads::Threads ${CMAKE_DL_LIBS})
add_dependencies(sp_unload_probe sympool)
sp_unit_target(sp_unload_probe sympool)
add_test(NAME unit.unload_thread_exit
  COMMAND $<TARGET_FILE:sp_unload_probe> $<TARGET_FILE:sympool>)
set_tests_properties(unit.unload_thread_exit PROPERTIES LABELS unit TIMEOUT 60
  ENVIRONMENT "${SP_UNIT_TEST_ENV}" PASS_REGULAR_EXPRESSION "unload-probe: ok")
# The same for the thread cache's key and the lock records' key (the probe's modes).
add_test(NAME unit.unload_thread_exit_cache
  COMMAND $<TARGET_FILE:sp_unload_probe> $<TARGET_FILE:sympool> cache)
set_tests_properties(unit.unload_thread_exit_cache PROPERTIES LABELS unit TIMEOUT 60
  ENVIRONMENT "${SP_UNIT_TEST_ENV};SYMPOOL_THREAD_CACHE=64KiB"
  PASS_REGULAR_EXPRESSION "unload-probe: ok")
add_test(NAME unit.unload_thread_exit_rebias
  COMMAND $<TARGET_FILE:sp_unload_probe> $<TARGET_FILE:sympool> rebias)
set_tests_properties(unit.unload_thread_exit_rebias PROPERTIES LABELS unit TIMEOUT 60
  ENVIRONMENT "${SP_UNIT_TEST_ENV}" PASS_REGULAR_EXPRESSION "unload-probe: ok")
# A world's MPI_Finalize notice outlives the library's dlclose (tests/unload/unload_mpi_probe.c).
if(SP_HAVE_MPI)
  add_executable(sp_unload_mpi_probe ${PROJECT_SOURCE_DIR}/tests/unload/unload_mpi_probe.c)
  target_compile_options(sp_unload_mpi_probe PRIVATE ${SP_WARN})
  target_link_libraries(sp_unload_mpi_probe PRIVATE MPI::MPI_C ${CMAKE_DL_LIBS})
  add_dependencies(sp_unload_mpi_probe sympool)
  add_test(NAME mpi.unload_mpi_finalize.np1
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 ${MPIEXEC_PREFLAGS}
            $<TARGET_FILE:sp_unload_mpi_probe> ${MPIEXEC_POSTFLAGS} $<TARGET_FILE:sympool>)
  set_tests_properties(mpi.unload_mpi_finalize.np1 PROPERTIES LABELS mpi TIMEOUT 120
    ENVIRONMENT "${SP_TEST_ENV}" PASS_REGULAR_EXPRESSION "unload-mpi-probe: ok")
endif()
