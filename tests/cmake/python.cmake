# The ctypes smoke test: loads the shared libsympool.so the way PyTorch's CUDAPluggableAllocator
# does and calls sp_torch_malloc / sp_torch_free / sp_memory_stats on the host backend (no torch,
# no GPU). It is what proves the entry points are exported from the .so (the unit tests link the
# static library). Skipped when no Python 3 interpreter is found.
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME python.ctypes_smoke
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/examples/python/ctypes_smoke.py
            $<TARGET_FILE:sympool>)
  set_tests_properties(python.ctypes_smoke PROPERTIES LABELS "unit;python" TIMEOUT 60
    ENVIRONMENT "SYMPOOL_DEVICE=host")
endif()
