# SYMPOOL_PYTHON_SITEDIR: where `cmake --install` puts the sympool Python package. Its own file
# because tests/ (python.install) needs the value before the install rules are declared.
include_guard(GLOBAL)
# Python3_*: found once by the top-level CMakeLists.txt.
if(Python3_Interpreter_FOUND)
  set(SP_PY_DEFAULT_DIR "lib/python${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}/site-packages")
else()
  set(SP_PY_DEFAULT_DIR "lib/python3/site-packages")
endif()
set(SYMPOOL_PYTHON_SITEDIR "${SP_PY_DEFAULT_DIR}" CACHE STRING
  "Where cmake --install puts the sympool Python package: relative to the prefix, or absolute")
