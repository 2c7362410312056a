# The ctypes smoke test: loads the shared libsympool.so the way PyTorch's CUDAPluggableAllocator
# does and calls sp_torch_malloc / sp_torch_free / sp_memory_stats on the host backend (no torch,
# no GPU). It is what proves the entry points are exported from the .so (the unit tests link the
# static library). Skipped when no Python 3 interpreter is found.
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  set(SP_PY_ENV "SYMPOOL_DEVICE=host")
  # A sanitized .so loaded into an unsanitized python needs the ASan runtime preloaded; the
  # interpreter's own allocations are not ours to leak-check.
  if(SYMPOOL_SANITIZE MATCHES "address")
    execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
      OUTPUT_VARIABLE SP_LIBASAN OUTPUT_STRIP_TRAILING_WHITESPACE)
    list(APPEND SP_PY_ENV "LD_PRELOAD=${SP_LIBASAN}" "ASAN_OPTIONS=detect_leaks=0")
  endif()
  # TSan cannot be preloaded into the interpreter (it segfaults mapping its shadow memory), and
  # the script is single-threaded: nothing for TSan to find there.
  if(NOT SYMPOOL_SANITIZE MATCHES "thread")
    add_test(NAME python.ctypes_smoke
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/examples/python/ctypes_smoke.py
              $<TARGET_FILE:sympool>)
    set_tests_properties(python.ctypes_smoke PROPERTIES LABELS "unit;python" TIMEOUT 60
      ENVIRONMENT "${SP_PY_ENV}")
  endif()
endif()
