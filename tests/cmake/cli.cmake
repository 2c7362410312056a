# The history/snapshot suites and the `sympool` command.
#  - test_pickle and test_replay (and test_history, which reads its own snapshots back) compile the
#    CLI's reader and trace code in, since tools/ is not part of the library.
#  - cli.* run the built `sympool` on the real PyTorch trace in tests/data/ and check its output.
set(SP_CLI_TOOL_SOURCES
  ${PROJECT_SOURCE_DIR}/tools/pickle_read.c
  ${PROJECT_SOURCE_DIR}/tools/trace.c
  ${PROJECT_SOURCE_DIR}/tools/json_read.c
  ${PROJECT_SOURCE_DIR}/tools/replay.c)
# test_history exports its symbols (-rdynamic) so that dladdr can name the C frames it checks.
if(TARGET test_history)
  set_target_properties(test_history PROPERTIES ENABLE_EXPORTS ON)
endif()
foreach(t test_pickle test_replay test_history)
  if(TARGET ${t})
    target_sources(${t} PRIVATE ${SP_CLI_TOOL_SOURCES})
    # The data folder also as a compile-time default: the suites must find tests/data even when
    # SP_TEST_DATA_DIR does not reach them through the test environment.
    target_compile_definitions(${t} PRIVATE _GNU_SOURCE
      SP_TEST_DATA_DIR_DEFAULT="${CMAKE_CURRENT_SOURCE_DIR}/data")
  endif()
endforeach()

if(TARGET sympool_cli)
  set(SP_CLI_TRACE ${CMAKE_CURRENT_SOURCE_DIR}/data/cs336-2.7b-ctx128-forward-bf16.pickle)
  set(SP_CLI_OUT ${CMAKE_CURRENT_BINARY_DIR}/cli_out)
  file(MAKE_DIRECTORY ${SP_CLI_OUT})

  # replay --json prints one object with API.md's keys, and our peak reserved is not above
  # PyTorch's on this trace.
  add_test(NAME cli.replay_json
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_CLI_TRACE} --json)
  set_tests_properties(cli.replay_json PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "\"events\":[0-9]+,.*\"peak_requested_bytes\":[0-9]+,\"peak_allocated_bytes\":[0-9]+,\"peak_reserved_bytes\":[0-9]+,\"pytorch_peak_reserved_bytes\":[0-9]+,.*\"ooms\":0,.*\"ns_per_event\":[0-9.]+")

  add_test(NAME cli.replay_capacity_oom
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_CLI_TRACE} --json --capacity 16GiB)
  set_tests_properties(cli.replay_capacity_oom PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "\"ooms\":[1-9][0-9]*,")

  add_test(NAME cli.replay_conf
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_CLI_TRACE} --conf max_split_size_mb:64
            --snapshot ${SP_CLI_OUT}/replay.pickle)
  set_tests_properties(cli.replay_conf PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "peak reserved +[0-9.]+ GiB +recorded run: 22.580 GiB")

  add_test(NAME cli.replay_repeat
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_CLI_TRACE} --json --repeat 3)
  set_tests_properties(cli.replay_repeat PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "\"peak_reserved_bytes\":24245174272,\"pytorch_peak_reserved_bytes\":24245174272,")

  add_test(NAME cli.replay_bad_repeat
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_CLI_TRACE} --repeat 0)
  set_tests_properties(cli.replay_bad_repeat PROPERTIES LABELS "unit;cli" TIMEOUT 60 WILL_FAIL TRUE)

  add_test(NAME cli.replay_bad_conf
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_CLI_TRACE} --conf no_such_key:1)
  set_tests_properties(cli.replay_bad_conf PROPERTIES LABELS "unit;cli" TIMEOUT 60 WILL_FAIL TRUE)

  add_test(NAME cli.replay_missing_file
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_CLI_OUT}/does-not-exist.pickle)
  set_tests_properties(cli.replay_missing_file PROPERTIES LABELS "unit;cli" TIMEOUT 60 WILL_FAIL TRUE)

  add_test(NAME cli.plot
    COMMAND $<TARGET_FILE:sympool_cli> plot ${SP_CLI_TRACE} -o ${SP_CLI_OUT}/timeline.svg)
  set_tests_properties(cli.plot PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "wrote .*timeline.svg .*peak allocated 22.234 GiB, peak reserved 22.580 GiB")

  add_test(NAME cli.info COMMAND $<TARGET_FILE:sympool_cli> info)
  set_tests_properties(cli.info PROPERTIES LABELS "unit;cli" TIMEOUT 60
    ENVIRONMENT "SYMPOOL_DEVICE=host;SYMPOOL_HOST_CAPACITY=3GiB"
    PASS_REGULAR_EXPRESSION "backend: host.*capacity 3.00 GiB.*SYMPOOL_HOST_CAPACITY")

  add_test(NAME cli.unknown_command COMMAND $<TARGET_FILE:sympool_cli> frobnicate)
  set_tests_properties(cli.unknown_command PROPERTIES LABELS "unit;cli" TIMEOUT 60 WILL_FAIL TRUE)

  # PyTorch's own loader: the snapshot of the replay loads with pickle.load, block sizes add up,
  # and the JSON form parses.
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    add_test(NAME cli.snapshot_python_load
      COMMAND ${CMAKE_COMMAND} -E env SYMPOOL_DEVICE=host
              sh -c "'$<TARGET_FILE:sympool_cli>' replay '${SP_CLI_TRACE}' --snapshot '${SP_CLI_OUT}/py.pickle' >/dev/null && '$<TARGET_FILE:sympool_cli>' replay '${SP_CLI_TRACE}' --snapshot '${SP_CLI_OUT}/py.json' >/dev/null && '${Python3_EXECUTABLE}' -c \"import pickle,json,sys; s=pickle.load(open(sys.argv[1],'rb')); j=json.load(open(sys.argv[2])); assert set(s)=={'segments','device_traces','allocator_settings','external_annotations'}; assert all(sum(b['size'] for b in g['blocks'])==g['total_size'] for g in s['segments']); assert len(s['device_traces'])>max(g['device'] for g in s['segments']); assert s['device_traces'][0][-1]['action']=='snapshot'; assert len(j['segments'])==len(s['segments']); print('python ok', len(s['segments']), len(s['device_traces'][0]))\" '${SP_CLI_OUT}/py.pickle' '${SP_CLI_OUT}/py.json'")
    set_tests_properties(cli.snapshot_python_load PROPERTIES LABELS "unit;cli;python" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "python ok 688")
  endif()
endif()
