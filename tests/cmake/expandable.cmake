# Expandable segments through the CLI: `replay --conf expandable_segments:True` on the real trace
# lowers peak reserved, and the snapshot it writes loads in Python with PyTorch's structure: one
# segment per mapped range (is_expandable), segment_map entries and no segment_alloc, and the
# Allocator State History of PyTorch's viewer (MemoryViz.js simulate_memory) can undo every
# segment_map backwards from the final state without losing a segment.
if(TARGET sympool_cli)
  set(SP_EXP_TRACE ${CMAKE_CURRENT_SOURCE_DIR}/data/cs336-2.7b-ctx128-forward-bf16.pickle)
  set(SP_EXP_OUT ${CMAKE_CURRENT_BINARY_DIR}/cli_out)
  file(MAKE_DIRECTORY ${SP_EXP_OUT})

  # PyTorch reserved 22.580 GiB on this trace; expandable segments stay within 0.5% of allocated.
  add_test(NAME cli.replay_expandable
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_EXP_TRACE} --conf expandable_segments:True --json)
  set_tests_properties(cli.replay_expandable PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "\"peak_allocated_bytes\":23873313792,\"peak_reserved_bytes\":23949475840,")

  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    add_test(NAME cli.snapshot_expandable_viewer
      COMMAND ${CMAKE_COMMAND} -E env SYMPOOL_DEVICE=host
              sh -c "'$<TARGET_FILE:sympool_cli>' replay '${SP_EXP_TRACE}' --conf expandable_segments:True --snapshot '${SP_EXP_OUT}/exp.pickle' >/dev/null && '${Python3_EXECUTABLE}' '${CMAKE_CURRENT_SOURCE_DIR}/cmake/viewer_check.py' '${SP_EXP_OUT}/exp.pickle'")
    set_tests_properties(cli.snapshot_expandable_viewer PROPERTIES LABELS "unit;cli;python"
      TIMEOUT 120 PASS_REGULAR_EXPRESSION "viewer ok: [0-9]+ segments, [1-9][0-9]* segment_map")
  endif()
endif()

# replay --compare: one row per configuration and the capacity answer; --json: one object each.
if(TARGET sympool_cli)
  add_test(NAME cli.replay_compare
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_EXP_TRACE} --compare "" expandable_segments:True
            "expandable_segments:True,SYMPOOL_EXPANDABLE_PAGE=2MiB,SYMPOOL_EXPANDABLE_RECYCLE=1"
            --capacity 24GiB)
  set_tests_properties(cli.replay_compare PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "\\(defaults\\) +22.580 +1.0092.*expandable_segments:True +22.305 +1.0032.*fits in 24GiB with 3 of 3 configurations; least memory with 'expandable_segments:True,SYMPOOL_EXPANDABLE_PAGE=2MiB,SYMPOOL_EXPANDABLE_RECYCLE=1'")
  add_test(NAME cli.replay_compare_json
    COMMAND ${CMAKE_COMMAND} -E env SYMPOOL_DEVICE=host sh -c "'$<TARGET_FILE:sympool_cli>' replay '${SP_EXP_TRACE}' --compare '' expandable_segments:True --json | grep -c '\"peak_reserved_bytes\"'")
  set_tests_properties(cli.replay_compare_json PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "^2\n")
  add_test(NAME cli.replay_compare_bad
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_EXP_TRACE} --compare SYMPOOL_NO_SUCH=1)
  set_tests_properties(cli.replay_compare_bad PROPERTIES LABELS "unit;cli" TIMEOUT 60 WILL_FAIL TRUE)
endif()
