# Expandable segments through the CLI: `replay --conf expandable_segments:True` on the real trace
# lowers peak reserved, and the snapshot it writes loads in Python with PyTorch's structure: one
# segment per mapped range (is_expandable), segment_map entries and no segment_alloc, and the
# Allocator State History of PyTorch's viewer (MemoryViz.js simulate_memory) can undo every
# segment_map backwards from the final state without losing a segment.
if(TARGET sympool_cli)
  set(SP_EXP_TRACE ${CMAKE_CURRENT_SOURCE_DIR}/data/cs336-2.7b-ctx128-forward-bf16.pickle)
  set(SP_EXP_OUT ${CMAKE_CURRENT_BINARY_DIR}/cli_out)
  file(MAKE_DIRECTORY ${SP_EXP_OUT})

  # PyTorch reserved 22.580 GiB on this trace; expandable segments (with our defaults: 2 MiB large
  # pages, recycling, large blocks starting on a page boundary) stay within 0.03% of allocated.
  add_test(NAME cli.replay_expandable
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_EXP_TRACE} --conf expandable_segments:True --json)
  set_tests_properties(cli.replay_expandable PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "\"peak_allocated_bytes\":23873313792,\"peak_reserved_bytes\":23876075520,")

  # The device's side (issue 25's churn): pages mapped and unmapped on the device, after the
  # starting state. RECYCLE's unmaps that the same growth maps again stay mapped (main fa69d1e,
  # every call made: 5,337 mapped and 451 unmapped; the books, num_device_alloc/free, unchanged).
  add_test(NAME cli.replay_expandable_device_pages
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_EXP_TRACE} --conf expandable_segments:True --json)
  set_tests_properties(cli.replay_expandable_device_pages PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "\"num_device_alloc\":1132,\"num_device_free\":229,.*\"vmm_pages_mapped\":5272,\"vmm_pages_unmapped\":386,\"vmm_bytes_mapped\":11056185344,\"vmm_bytes_unmapped\":809500672,\"vmm_recycle_syncs\":163")

  if(Python3_Interpreter_FOUND)
    add_test(NAME cli.snapshot_expandable_viewer
      COMMAND ${CMAKE_COMMAND} -E env SYMPOOL_DEVICE=host
              sh -c "'$<TARGET_FILE:sympool_cli>' replay '${SP_EXP_TRACE}' --conf expandable_segments:True --snapshot '${SP_EXP_OUT}/exp.pickle' >/dev/null && '${Python3_EXECUTABLE}' '${CMAKE_CURRENT_SOURCE_DIR}/cmake/viewer_check.py' '${SP_EXP_OUT}/exp.pickle'")
    set_tests_properties(cli.snapshot_expandable_viewer PROPERTIES LABELS "unit;cli;python"
      TIMEOUT 120 PASS_REGULAR_EXPRESSION "viewer ok: [0-9]+ segments, [1-9][0-9]* segment_map")
  endif()
endif()

# replay --compare: one row per configuration and the capacity answer (which configurations fit,
# least peak first, each with its peak; those that do not, with their OOMs); --json: one object
# each. PyTorch's own expandable rules are the three options of ours set to 0.
if(TARGET sympool_cli)
  add_test(NAME cli.replay_compare
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_EXP_TRACE} --compare ""
            "expandable_segments:True,SYMPOOL_EXPANDABLE_PAGE=0,SYMPOOL_EXPANDABLE_RECYCLE=0,SYMPOOL_EXPANDABLE_BORROW=0"
            expandable_segments:True --capacity 22.4GiB)
  set_tests_properties(cli.replay_compare PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "\\(recorded\\) +22.580 +1.0092.*BORROW=0 +22.305 +1.0032.*fits in 22.4GiB with 2 of 3 configurations: 'expandable_segments:True' at 22.268 GiB peak, 'expandable_segments:True,SYMPOOL_EXPANDABLE_PAGE=0,SYMPOOL_EXPANDABLE_RECYCLE=0,SYMPOOL_EXPANDABLE_BORROW=0' at 22.305 GiB peak; not with '\\(recorded\\)' \\([1-9][0-9]* OOMs\\)")
  # garbage_collection_threshold acts under the memory fraction replay derives from --capacity:
  # three 30 MiB blocks, two freed, then 40 MiB: at 0.3 x 256 MiB the two free segments go back
  # before the growth (peak 90 MiB instead of 130 MiB).
  add_test(NAME cli.replay_gc_capacity
    COMMAND $<TARGET_FILE:sympool_cli> replay ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-gc-tiny.json
            --compare "" garbage_collection_threshold:0.3 --capacity 256MiB)
  set_tests_properties(cli.replay_gc_capacity PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "fits in 256MiB with 2 of 2 configurations: 'garbage_collection_threshold:0.3' at 0.088 GiB peak, '\\(defaults\\)' at 0.127 GiB peak")
  # A capacity without --capacity (SYMPOOL_HOST_CAPACITY as an item, or in the environment): a
  # configuration that runs out of memory is named by its OOMs, not by its peak as a need.
  add_test(NAME cli.replay_compare_capacity_item
    COMMAND $<TARGET_FILE:sympool_cli> replay ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-gc-tiny.json
            --compare "" SYMPOOL_HOST_CAPACITY=64MiB)
  set_tests_properties(cli.replay_compare_capacity_item PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "runs without OOM with 1 of 2 configurations \\(a capacity in force\\), least peak reserved first: '\\(defaults\\)' at 0.127 GiB peak; not with 'SYMPOOL_HOST_CAPACITY=64MiB' \\(1 OOMs\\)")
  add_test(NAME cli.replay_compare_json
    COMMAND ${CMAKE_COMMAND} -E env SYMPOOL_DEVICE=host sh -c "'$<TARGET_FILE:sympool_cli>' replay '${SP_EXP_TRACE}' --compare '' expandable_segments:True --json | grep -c '\"peak_reserved_bytes\"'")
  set_tests_properties(cli.replay_compare_json PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "^2\n")
  add_test(NAME cli.replay_compare_bad
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_EXP_TRACE} --compare SYMPOOL_NO_SUCH=1)
  set_tests_properties(cli.replay_compare_bad PROPERTIES LABELS "unit;cli" TIMEOUT 60 WILL_FAIL TRUE)
endif()
