# discover.cmake: read by ctest (TEST_INCLUDE_FILES) before it runs: registers each binary in
# SP_DBL_BINARIES ("path|gpus|whole" or "path|gpus|each") with the doubles' environment
# SP_DBL_ENV (one list): a whole one as one test, cuda_double.unit.<binary>, all its tests in one
# process as GoogleTest runs them; each GoogleTest test of the others as cuda_double.<Suite>.<Test>
# in a process of its own. gtest_discover_tests cannot carry an ENVIRONMENT of several variables
# through its generated scripts in CMake 3.25, hence this small twin of it.
foreach(entry ${SP_DBL_BINARIES})
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 bin)
  list(GET parts 1 gpus)
  list(GET parts 2 mode)
  if(NOT EXISTS "${bin}")
    add_test(cuda_double.NOT_BUILT.${bin} "${bin}")
    continue()
  endif()
  if(mode STREQUAL "whole")
    get_filename_component(name "${bin}" NAME)
    add_test("cuda_double.unit.${name}" "${bin}")
    set(env ${SP_DBL_ENV} "CUDA_DOUBLE_GPUS=${gpus}")
    set_tests_properties("cuda_double.unit.${name}" PROPERTIES LABELS cuda_double TIMEOUT 600
      ENVIRONMENT "${env}")
    continue()
  endif()
  execute_process(COMMAND "${bin}" --gtest_list_tests OUTPUT_VARIABLE out RESULT_VARIABLE rc
    TIMEOUT 60)
  if(NOT rc EQUAL 0)
    add_test(cuda_double.LIST_FAILED.${bin} "${bin}" --gtest_list_tests)
    continue()
  endif()
  string(REPLACE ";" "," out "${out}")
  string(REPLACE "\n" ";" lines "${out}")
  set(suite "")
  foreach(line ${lines})
    string(REGEX REPLACE " *#.*" "" line "${line}")
    if(line MATCHES "^[^ ]")
      string(STRIP "${line}" suite)
    elseif(line MATCHES "^  +([^ ]+)")
      set(test "${CMAKE_MATCH_1}")
      if(suite MATCHES "^DISABLED_" OR test MATCHES "^DISABLED_")
        continue()
      endif()
      set(name "cuda_double.${suite}${test}")
      add_test("${name}" "${bin}" "--gtest_filter=${suite}${test}")
      set(env ${SP_DBL_ENV} "CUDA_DOUBLE_GPUS=${gpus}")
      set_tests_properties("${name}" PROPERTIES LABELS cuda_double TIMEOUT 120
        SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]" ENVIRONMENT "${env}")
    endif()
  endforeach()
endforeach()
