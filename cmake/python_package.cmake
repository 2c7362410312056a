# The Python package (python/sympool, pure Python over libsympool.so) and its install rule.
#   cmake --install build --prefix P
# puts the package in P/<SYMPOOL_PYTHON_SITEDIR>/sympool (default lib/pythonX.Y/site-packages,
# which for P=~/.local is the user site Python already searches) and a relative link
# sympool/libsympool.so -> the installed library, so `import sympool` finds its library with no
# environment variable. It prints the folder and, when python3 does not search it, the
# PYTHONPATH line to add.
include(${CMAKE_CURRENT_LIST_DIR}/python_sitedir.cmake)
set(SP_PY_INTERP "${Python3_EXECUTABLE}")

install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/sympool DESTINATION ${SYMPOOL_PYTHON_SITEDIR}
  FILES_MATCHING PATTERN "*.py" PATTERN "*.cpp" PATTERN "__pycache__" EXCLUDE)
# At install time (the prefix may be --prefix's): link the library next to the package, relative
# so that the prefix can move, and say where the package went.
install(CODE "
  set(sp_sitedir \"${SYMPOOL_PYTHON_SITEDIR}\")
  if(NOT IS_ABSOLUTE \"\${sp_sitedir}\")
    set(sp_sitedir \"\${CMAKE_INSTALL_PREFIX}/\${sp_sitedir}\")
  endif()
  set(sp_libdir \"${CMAKE_INSTALL_LIBDIR}\")
  if(NOT IS_ABSOLUTE \"\${sp_libdir}\")
    set(sp_libdir \"\${CMAKE_INSTALL_PREFIX}/\${sp_libdir}\")
  endif()
  file(RELATIVE_PATH sp_rel \"\${sp_sitedir}/sympool\" \"\${sp_libdir}/libsympool.so.${PROJECT_VERSION_MAJOR}\")
  file(REMOVE \"\$ENV{DESTDIR}\${sp_sitedir}/sympool/libsympool.so\")
  file(CREATE_LINK \"\${sp_rel}\" \"\$ENV{DESTDIR}\${sp_sitedir}/sympool/libsympool.so\" SYMBOLIC)
  message(STATUS \"sympool Python package: \${sp_sitedir}/sympool (library: \${sp_rel})\")
  if(EXISTS \"${SP_PY_INTERP}\")
    execute_process(COMMAND \"${SP_PY_INTERP}\" -c \"import sys, os; d = os.path.realpath(sys.argv[1]); sys.exit(0 if any(os.path.realpath(p) == d for p in sys.path) else 1)\" \"\${sp_sitedir}\"
      RESULT_VARIABLE sp_on_path OUTPUT_QUIET ERROR_QUIET)
    if(NOT sp_on_path EQUAL 0)
      message(STATUS \"${SP_PY_INTERP} does not search that folder: export PYTHONPATH=\${sp_sitedir}\")
    endif()
  endif()
")

# The distribution's metadata beside the package, as pip writes it, so that `pip show sympool`,
# importlib.metadata.version("sympool") and `pip uninstall sympool` (the Python package; the
# library stays in lib/) know a CMake-installed sympool. The version is project(VERSION)'s.
set(SP_DIST_INFO "sympool-${PROJECT_VERSION}.dist-info")
file(WRITE ${PROJECT_BINARY_DIR}/python_dist_info/METADATA
"Metadata-Version: 2.1
Name: sympool
Version: ${PROJECT_VERSION}
Summary: A CUDA caching allocator with PyTorch's semantics, MemPools and symmetric (NCCL-window) pools for mpirun-launched jobs
License: MIT
Requires-Python: >=3.8
")
file(WRITE ${PROJECT_BINARY_DIR}/python_dist_info/INSTALLER "cmake\n")
install(FILES ${PROJECT_BINARY_DIR}/python_dist_info/METADATA
  ${PROJECT_BINARY_DIR}/python_dist_info/INSTALLER
  DESTINATION ${SYMPOOL_PYTHON_SITEDIR}/${SP_DIST_INFO})
install(CODE "
  set(sp_sitedir \"${SYMPOOL_PYTHON_SITEDIR}\")
  if(NOT IS_ABSOLUTE \"\${sp_sitedir}\")
    set(sp_sitedir \"\${CMAKE_INSTALL_PREFIX}/\${sp_sitedir}\")
  endif()
  set(sp_root \"\$ENV{DESTDIR}\${sp_sitedir}\")
  file(GLOB_RECURSE sp_files LIST_DIRECTORIES false RELATIVE \"\${sp_root}\"
    \"\${sp_root}/sympool/*\" \"\${sp_root}/${SP_DIST_INFO}/*\")
  set(sp_record \"\")
  foreach(f \${sp_files})
    if(NOT f STREQUAL \"${SP_DIST_INFO}/RECORD\")
      string(APPEND sp_record \"\${f},,\\n\")
    endif()
  endforeach()
  string(APPEND sp_record \"${SP_DIST_INFO}/RECORD,,\\n\")
  file(WRITE \"\${sp_root}/${SP_DIST_INFO}/RECORD\" \"\${sp_record}\")
")
