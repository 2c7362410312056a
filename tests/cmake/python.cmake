# Python tests (label python), on the host backend, against the shared libsympool.so of this build
# (the unit tests link the static library: these prove the .so's exports and the package).
#   python.ctypes_smoke       examples/python/ctypes_smoke.py: the PyTorch entry points through ctypes
#   python.pytest.<file>      tests/python/test_<file>.py under pytest, one process per file
#   python.pytest_mpi.np2     tests/python/mpi/ under mpirun -np 2 (World, symmetric pool, collectives)
#   python.example.train_ddp_style.np2   examples/python/train_ddp_style.py on the host backend
# pytest and mpi4py come from Debian (python3-pytest, python3-mpi4py) for the system python3,
# which may not be the python3 first on PATH (pyenv): SYMPOOL_TEST_PYTHON picks the interpreter,
# else the first of /usr/bin/python3 and the found Python3 that imports pytest. If none does, a
# failing test says so: a suite that silently runs no Python tests must not look green. The
# conftest fails a pytest run in which no test passed (pytest alone exits 5 only when nothing is
# collected, and 0 when everything is skipped).
set(SYMPOOL_TEST_PYTHON "" CACHE FILEPATH "Python 3 with pytest (and mpi4py) for the Python tests")

set(SP_PY_ENV "SYMPOOL_DEVICE=host" "SYMPOOL_LIBRARY=$<TARGET_FILE:sympool>"
  "PYTHONPATH=${PROJECT_SOURCE_DIR}/python" "PYTHONDONTWRITEBYTECODE=1" "SYMPOOL_SYM_TIMEOUT=30"
  "OMPI_ALLOW_RUN_AS_ROOT=1" "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
  "OMPI_MCA_rmaps_base_oversubscribe=1" "OMPI_MCA_mpi_yield_when_idle=1" "OMPI_MCA_btl_vader_single_copy_mechanism=none")
set(SP_PY_MPI_FLAGS)
# A sanitized .so loaded into an unsanitized python needs the ASan runtime preloaded; the
# interpreter's own allocations are not ours to leak-check. Under mpirun only the ranks get it.
# GCC's runtime is libasan.so; clang's shared one (executables link its static one) carries
# UndefinedBehaviorSanitizer's handlers as well.
if(SYMPOOL_SANITIZE MATCHES "address")
  set(sp_asan_rt libasan.so)
  if(CMAKE_C_COMPILER_ID MATCHES "Clang")
    set(sp_asan_rt libclang_rt.asan-${CMAKE_SYSTEM_PROCESSOR}.so)
  endif()
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=${sp_asan_rt}
    OUTPUT_VARIABLE SP_LIBASAN OUTPUT_STRIP_TRAILING_WHITESPACE)
  list(APPEND SP_PY_ENV "LD_PRELOAD=${SP_LIBASAN}" "ASAN_OPTIONS=detect_leaks=0")
  set(SP_PY_MPI_FLAGS -x LD_PRELOAD=${SP_LIBASAN} -x ASAN_OPTIONS=detect_leaks=0)
  set(SP_PY_PRELOAD "LD_PRELOAD=${SP_LIBASAN}")
  set(SP_PY_ENV_MPI "${SP_PY_ENV}")
  list(REMOVE_ITEM SP_PY_ENV_MPI "LD_PRELOAD=${SP_LIBASAN}")
else()
  set(SP_PY_ENV_MPI "${SP_PY_ENV}")
  set(SP_PY_PRELOAD "")
endif()
# cli.replay_self and cli.replay_self_expandable (cli.cmake) load this build's .so into Python too.
foreach(t cli.replay_self cli.replay_self_expandable)
  if(TEST ${t} AND SP_PY_PRELOAD)
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "${SP_PY_PRELOAD}"
      "ASAN_OPTIONS=detect_leaks=0")
  endif()
endforeach()

# TSan cannot be preloaded into the interpreter (it segfaults mapping its shadow memory): the
# Python tests are left out of the TSan build.
if(SYMPOOL_SANITIZE MATCHES "thread")
  return()
endif()

function(sp_python_can interp module out)
  execute_process(COMMAND ${interp} -c "import ${module}" RESULT_VARIABLE rc OUTPUT_QUIET
    ERROR_QUIET)
  if(rc EQUAL 0)
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

set(SP_TEST_PY "${SYMPOOL_TEST_PYTHON}")
if(NOT SP_TEST_PY)
  foreach(cand /usr/bin/python3 ${Python3_EXECUTABLE})
    if(EXISTS ${cand})
      sp_python_can(${cand} pytest ok)
      if(ok)
        set(SP_TEST_PY ${cand})
        break()
      endif()
    endif()
  endforeach()
endif()

if(Python3_Interpreter_FOUND)
  add_test(NAME python.ctypes_smoke
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/examples/python/ctypes_smoke.py
            $<TARGET_FILE:sympool>)
  set_tests_properties(python.ctypes_smoke PROPERTIES LABELS "unit;python" TIMEOUT 60
    ENVIRONMENT "${SP_PY_ENV}")
endif()

# The install path a user takes: cmake --install into a fresh prefix, then import the package
# from there with no SYMPOOL_LIBRARY: it must find the library through the link next to it.
if(Python3_Interpreter_FOUND OR SP_TEST_PY)
  set(SP_INSTALL_PY "${SP_TEST_PY}")
  if(NOT SP_INSTALL_PY)
    set(SP_INSTALL_PY "${Python3_EXECUTABLE}")
  endif()
  set(SP_PREFIX ${CMAKE_CURRENT_BINARY_DIR}/python_install_prefix)
  add_test(NAME python.install
    COMMAND sh -c "rm -rf '${SP_PREFIX}' && '${CMAKE_COMMAND}' --install '${PROJECT_BINARY_DIR}' --prefix '${SP_PREFIX}' >/dev/null && cd / && env -u SYMPOOL_LIBRARY ${SP_PY_PRELOAD} PYTHONPATH='${SP_PREFIX}/${SYMPOOL_PYTHON_SITEDIR}' '${SP_INSTALL_PY}' -c 'import sympool, os, importlib.metadata as m; assert m.version(\"sympool\") == sympool.__version__, sympool.__version__; p = sympool.library_path(); assert p.startswith(\"${SP_PREFIX}\"), p; p = sympool.malloc(100); sympool.free(p); print(\"python.install: OK\", sympool.library_path(), sympool.backend())'")
  # Only python gets the ASan runtime (SP_PY_PRELOAD), not cmake and sh.
  set_tests_properties(python.install PROPERTIES LABELS "unit;python" TIMEOUT 120
    ENVIRONMENT "${SP_PY_ENV_MPI}" PASS_REGULAR_EXPRESSION "python.install: OK"
    RESOURCE_LOCK sp_build_tree_install)
endif()

# README's pip path: pip install --no-build-isolation --no-index . in a fresh venv (offline, with
# Debian's setuptools), the library taken from this build. About 10 s.
if(SP_TEST_PY)
  set(SP_PIP_PRELOAD "")
  if(SYMPOOL_SANITIZE MATCHES "address")
    set(SP_PIP_PRELOAD "${SP_LIBASAN}")
  endif()
  add_test(NAME python.pip_install
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/install/pip_check.sh ${SP_TEST_PY} ${PROJECT_SOURCE_DIR}
            ${PROJECT_BINARY_DIR} ${CMAKE_CURRENT_BINARY_DIR}/pip_check "${SP_PIP_PRELOAD}")
  set_tests_properties(python.pip_install PROPERTIES LABELS "install;python" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "pip ok" ENVIRONMENT "${SP_PY_ENV_MPI}"
    RESOURCE_LOCK sp_build_tree_install) # see install.cmake
endif()

if(NOT SP_TEST_PY)
  add_test(NAME python.pytest_missing
    COMMAND sh -c "echo 'no python3 with pytest: install python3-pytest and python3-mpi4py (scripts/deps.sh does) or set -DSYMPOOL_TEST_PYTHON=...'; exit 1")
  set_tests_properties(python.pytest_missing PROPERTIES LABELS "unit;python" TIMEOUT 10)
  return()
endif()

set(SP_PYTEST ${SP_TEST_PY} -m pytest -q -p no:cacheprovider --color=no -rfEs)
file(GLOB SP_PY_TESTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/python/test_*.py)
foreach(src ${SP_PY_TESTS})
  get_filename_component(name ${src} NAME_WE)
  string(REGEX REPLACE "^test_" "" name ${name})
  add_test(NAME python.pytest.${name} COMMAND ${SP_PYTEST} ${src}
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(python.pytest.${name} PROPERTIES LABELS "unit;python" TIMEOUT 120
    ENVIRONMENT "${SP_PY_ENV}")
endforeach()
# The torch ports (PyTorch's own suites, ported) are the longest Python runs: room for a loaded
# two-core machine. TIMEOUT overrides ctest --timeout.
set_tests_properties(python.pytest.torch_module python.pytest.parity_torch PROPERTIES TIMEOUT 300)

# test/test_cuda_expandable_segments.py runs test_cuda.py's TestCuda and TestMemPool again with
# expandable segments on: the torch port runs again so, with PyTorch's exact page rules (our three
# defaults that change them off; docs/expandable.md). About 3 s. CuPy has no such run.
add_test(NAME python.pytest.parity_torch_expandable
  COMMAND ${SP_PYTEST} ${CMAKE_CURRENT_SOURCE_DIR}/python/test_parity_torch.py
  WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(python.pytest.parity_torch_expandable PROPERTIES LABELS "unit;python"
  TIMEOUT 300 ENVIRONMENT "${SP_PY_ENV};SYMPOOL_ALLOC_CONF=expandable_segments:True;SYMPOOL_EXPANDABLE_PAGE=0;SYMPOOL_EXPANDABLE_RECYCLE=0;SYMPOOL_EXPANDABLE_BORROW=0")
# CI runs the two torch ports in its plain build only (label plain_only, scripts/test.sh): they
# check PyTorch's semantics through the package, and the library calls they make are the ones
# test_parity's C++ port of the same tests (unit.test_parity, unit.test_parity_expandable) makes
# under ASan+UBSan. Under ASan they were the longest Python runs (21 and 23 s of that stage's
# test time, a Python interpreter with the ASan runtime preloaded; s38-ci).
set_property(TEST python.pytest.parity_torch python.pytest.parity_torch_expandable APPEND
  PROPERTY LABELS plain_only)

if(SP_HAVE_MPI)
  sp_python_can(${SP_TEST_PY} "mpi4py.MPI" SP_PY_HAS_MPI4PY)
  if(SP_PY_HAS_MPI4PY)
    # -x: a rank that fails stops at once; mpirun then ends the others instead of leaving them
    # waiting in the next collective.
    add_test(NAME python.pytest_mpi.np2
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe ${SP_PY_MPI_FLAGS}
              ${MPIEXEC_PREFLAGS} ${SP_PYTEST} -x ${CMAKE_CURRENT_SOURCE_DIR}/python/mpi
              ${MPIEXEC_POSTFLAGS}
      WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
    add_test(NAME python.example.train_ddp_style.np2
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe ${SP_PY_MPI_FLAGS}
              ${MPIEXEC_PREFLAGS} ${SP_TEST_PY}
              ${PROJECT_SOURCE_DIR}/examples/python/train_ddp_style.py --steps 3 --mode host
              ${MPIEXEC_POSTFLAGS}
      WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
    set_tests_properties(python.pytest_mpi.np2 python.example.train_ddp_style.np2 PROPERTIES
      LABELS "mpi;python" TIMEOUT 300 ENVIRONMENT "${SP_PY_ENV_MPI}")
  else()
    add_test(NAME python.mpi4py_missing
      COMMAND sh -c "echo '${SP_TEST_PY} has no mpi4py: install python3-mpi4py (scripts/deps.sh does)'; exit 1")
    set_tests_properties(python.mpi4py_missing PROPERTIES LABELS "mpi;python" TIMEOUT 10)
  endif()
endif()
