# examples.cmake: every example runs as a CTest under mpirun on the host backend (label example):
# 01_train_step, the README's main job, at 4 ranks as the README runs it; the others at 2.
# Included from tests/CMakeLists.txt, so SP_TEST_ENV (backend, run-as-root for Open MPI) applies.
if(SP_HAVE_MPI)
  set(SP_EXAMPLE_RUNS "01_train_step:4" "02_symmetric_basics:2" "03_stats_report:2")
  foreach(run ${SP_EXAMPLE_RUNS})
    string(REPLACE ":" ";" parts ${run})
    list(GET parts 0 name)
    list(GET parts 1 np)
    if(TARGET ${name})
      set(args)
      if(name STREQUAL "01_train_step")
        # Snapshots go to the build tree, not to wherever ctest was started.
        set(args --out ${CMAKE_CURRENT_BINARY_DIR}/example_01_out)
      endif()
      add_test(NAME example.${name}.np${np}
        COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${args} ${MPIEXEC_POSTFLAGS})
      set_tests_properties(example.${name}.np${np} PROPERTIES LABELS example TIMEOUT 300
        ENVIRONMENT "${SP_TEST_ENV}")
    endif()
  endforeach()
endif()

# Every example README's shown output against what the program prints now, and its shown
# commands (pipes into jq included) run as written. About 20 s (01_train_step at 4 ranks once):
# in the unsanitized build only, as what the programs print does not depend on the sanitizer.
if(SP_HAVE_MPI AND Python3_Interpreter_FOUND AND TARGET 03_stats_report AND NOT SYMPOOL_SANITIZE)
  add_test(NAME example.readmes
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/install/readme_check.py
            ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR} ${CMAKE_CURRENT_BINARY_DIR}/readme_check
            ${MPIEXEC_EXECUTABLE})
  set_tests_properties(example.readmes PROPERTIES LABELS "example;plain_only" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "readmes ok" ENVIRONMENT "${SP_TEST_ENV}")
  list(APPEND SP_MULTIRANK_TESTS example.readmes) # its MPI runs start 2 and 4 ranks
endif()
