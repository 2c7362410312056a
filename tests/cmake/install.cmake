# The newcomer's path: what README promises a user outside this tree.
# The tests that install or rebuild this build tree (install.consumers, python.install,
# python.pip_install: `cmake --install` writes install_manifest.txt into it, pip's build runs
# `cmake --build` on it) hold the lock sp_build_tree_install, one at a time; the others work in
# folders of their own and run beside any test (they were RUN_SERIAL: 40 s at the end of the plain
# stage with one core idle).
#  - install.consumers: `cmake --install --prefix`, then programs built against the installed
#    package with pkg-config (shared, C and C++; static after moving the prefix) and with
#    find_package (a C project and a C++-only one).
#  - scripts.*: test.sh states the options it needs (a build/ configured by run-main.sh must not
#    hide the tests) and fails on an empty test run.
set(SP_INSTALL_EXTRA_CFLAGS "")
if(SYMPOOL_SANITIZE)
  set(SP_INSTALL_EXTRA_CFLAGS "-fsanitize=${SYMPOOL_SANITIZE}")
endif()
find_program(SP_PKG_CONFIG pkg-config)
if(SP_PKG_CONFIG)
  if(SP_HAVE_MPI)
    set(SP_INSTALL_MPI 1)
  else()
    set(SP_INSTALL_MPI 0)
  endif()
  add_test(NAME install.consumers
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/install/check.sh ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR}
            ${CMAKE_CURRENT_BINARY_DIR}/install_check ${CMAKE_INSTALL_LIBDIR} ${CMAKE_C_COMPILER}
            ${CMAKE_CXX_COMPILER} ${SP_INSTALL_MPI} "${SP_INSTALL_EXTRA_CFLAGS}")
  set_tests_properties(install.consumers PROPERTIES LABELS "install" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "consumer ok.*consumer ok.*consumer ok.*consumer ok.*consumer ok.*install ok"
    ENVIRONMENT "${SP_TEST_ENV}" RESOURCE_LOCK sp_build_tree_install)
endif()

# A build/ that run-main.sh configured with tests off, then configured the way test.sh does:
# the tests come back. And an empty run fails with the flag test.sh passes. Configures of its
# own, no build (25-30 s): in the unsanitized build only, as the configures do not depend on
# the sanitizer.
if(NOT SYMPOOL_SANITIZE)
  add_test(NAME scripts.test_sh_after_run_main
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/install/scripts_check.sh ${PROJECT_SOURCE_DIR}
            ${CMAKE_CURRENT_BINARY_DIR}/scripts_check)
  set_tests_properties(scripts.test_sh_after_run_main PROPERTIES LABELS "install;plain_only" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "scripts ok")
endif()

# SYMPOOL_REPORT_FILE: the report in its own file, read by jq and promtool.
find_program(SP_JQ jq)
if(SP_HAVE_MPI AND TARGET 03_stats_report AND SP_JQ)
  add_test(NAME reports.file_jq_promtool
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/install/reports_check.sh ${MPIEXEC_EXECUTABLE}
            $<TARGET_FILE:03_stats_report> ${CMAKE_CURRENT_BINARY_DIR}/reports_check)
  set_tests_properties(reports.file_jq_promtool PROPERTIES LABELS "mpi;report" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "reports ok" ENVIRONMENT "${SP_TEST_ENV}")
  list(APPEND SP_MULTIRANK_TESTS reports.file_jq_promtool) # its MPI runs start 2 ranks
endif()

# NCCL as PyTorch's nvidia-nccl wheel lays it out (include/nccl.h, lib/libnccl.so.2 only), found
# through SYMPOOL_NCCL_ROOT: the library builds with the project's warnings and its installed
# consumers link. Library and CLI only, a Debug build (31 s of CI's plain stage; 57 s at -O2).
if(SP_HAVE_NCCL AND SP_PKG_CONFIG AND NOT SYMPOOL_SANITIZE)
  add_test(NAME install.nccl_wheel_layout
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/install/nccl_wheel_check.sh ${PROJECT_SOURCE_DIR}
            ${CMAKE_CURRENT_BINARY_DIR}/nccl_wheel_check ${NCCL_INCLUDE_DIR} ${NCCL_LIBRARY}
            ${CMAKE_INSTALL_LIBDIR} ${CMAKE_C_COMPILER} ${CMAKE_CXX_COMPILER} ${SP_INSTALL_MPI})
  set_tests_properties(install.nccl_wheel_layout PROPERTIES LABELS "install;plain_only" TIMEOUT 600
    PASS_REGULAR_EXPRESSION "wheel layout ok" ENVIRONMENT "${SP_TEST_ENV}")
endif()

# scripts/gpu-check.sh without a GPU: --plan fits one device call, the no-GPU run writes its
# two-file report to --out, a failed step's log is inside it, the deadline cuts late steps.
# Two CMake configures, no build (15-26 s, mostly waiting); unsanitized build only, as above.
if(Python3_Interpreter_FOUND AND NOT SYMPOOL_SANITIZE)
  add_test(NAME scripts.gpu_check_no_gpu
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/install/gpu_check_check.sh ${PROJECT_SOURCE_DIR}
            ${CMAKE_CURRENT_BINARY_DIR}/gpu_check_check)
  set_tests_properties(scripts.gpu_check_no_gpu PROPERTIES LABELS "install;plain_only" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "gpu-check ok")
endif()

# The default build needs no GoogleTest (a library-only configure), and -DSYMPOOL_BUILD_TESTS=ON
# without it fails saying so. Two configures, no build (10-30 s): in the unsanitized build only,
# as a configure does not depend on the sanitizer.
if(NOT SYMPOOL_SANITIZE)
  add_test(NAME install.configure_without_gtest
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/install/configure_check.sh ${PROJECT_SOURCE_DIR}
            ${CMAKE_CURRENT_BINARY_DIR}/configure_check)
  set_tests_properties(install.configure_without_gtest PROPERTIES LABELS "install;plain_only" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "configure ok")
endif()
