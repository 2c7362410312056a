# The history/snapshot suites and the `sympool` command.
#  - test_pickle and test_replay (and test_history, which reads its own snapshots back) compile the
#    CLI's reader and trace code in, since tools/ is not part of the library.
#  - cli.* run the built `sympool` on the real PyTorch trace in tests/data/ and check its output.
# test_history exports its symbols (-rdynamic) so that dladdr can name the C frames it checks.
if(TARGET test_history)
  set_target_properties(test_history PROPERTIES ENABLE_EXPORTS ON)
endif()
# test_fuzz_repro replays tests/fuzz/repro through what the fuzzer runs (tests/fuzz/fuzz_one.c).
if(TARGET test_fuzz_repro)
  target_sources(test_fuzz_repro PRIVATE ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_one.c)
  target_compile_definitions(test_fuzz_repro PRIVATE
    SP_FUZZ_REPRO_DIR="${PROJECT_SOURCE_DIR}/tests/fuzz/repro")
endif()
# The CLI's reader and trace code, compiled once for the CLI and these five suites (the top
# CMakeLists.txt, sympool_tools_obj).
foreach(t test_pickle test_pickle_text test_replay test_history test_fuzz_repro)
  if(TARGET ${t})
    target_link_libraries(${t} PRIVATE $<TARGET_OBJECTS:sympool_tools_obj>)
    # The data folder also as a compile-time default: the suites must find tests/data even when
    # SP_TEST_DATA_DIR does not reach them through the test environment.
    target_compile_definitions(${t} PRIVATE _GNU_SOURCE
      SP_TEST_DATA_DIR_DEFAULT="${CMAKE_CURRENT_SOURCE_DIR}/data")
  endif()
endforeach()

if(TARGET sympool_cli)
  sp_unit_target(sympool_cli)
  set(SP_CLI_TRACE ${CMAKE_CURRENT_SOURCE_DIR}/data/cs336-2.7b-ctx128-forward-bf16.pickle)
  set(SP_CLI_OUT ${CMAKE_CURRENT_BINARY_DIR}/cli_out)
  file(MAKE_DIRECTORY ${SP_CLI_OUT})

  # replay --json prints one object with API.md's keys, and our peak reserved is not above
  # PyTorch's on this trace.
  add_test(NAME cli.replay_json
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_CLI_TRACE} --json)
  set_tests_properties(cli.replay_json PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "\"events\":[0-9]+,.*\"peak_requested_bytes\":[0-9]+,\"peak_allocated_bytes\":[0-9]+,\"peak_reserved_bytes\":[0-9]+,\"pytorch_peak_reserved_bytes\":[0-9]+,.*\"ooms\":0,.*\"ns_per_event\":[0-9.]+")

  if(Python3_EXECUTABLE)
    add_test(NAME cli.replay_json_strings
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cli/replay_json_strings.py
              $<TARGET_FILE:sympool_cli> ${PROJECT_SOURCE_DIR}/tests/data/trace-gc-tiny.json)
    set_tests_properties(cli.replay_json_strings PROPERTIES LABELS "unit;cli;python" TIMEOUT 60
      PASS_REGULAR_EXPRESSION "^ok")
    # U+0000 and lone surrogates in a snapshot's strings (JSON escapes, pickle bytes): every
    # command reads them, replay --snapshot writes the same str back as pickle and as JSON.
    add_test(NAME cli.python_strs
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cli/python_strs.py
              $<TARGET_FILE:sympool_cli> ${SP_CLI_OUT}/python_strs)
    set_tests_properties(cli.python_strs PROPERTIES LABELS "unit;cli;python" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "^ok")
    # replay --snapshot shows the recorded streams, not the replay's handles.
    add_test(NAME cli.replay_streams
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cli/replay_streams.py
              $<TARGET_FILE:sympool_cli> ${SP_CLI_OUT}/replay_streams)
    set_tests_properties(cli.replay_streams PROPERTIES LABELS "unit;cli;python" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "^ok")
    # replay orders the trace's streams by their recorded values, whatever the heap: the
    # segments empty_cache frees go in the recorded order, and another heap layout changes
    # nothing.
    add_test(NAME cli.replay_stream_order
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cli/replay_stream_order.py
              $<TARGET_FILE:sympool_cli> ${SP_CLI_OUT}/replay_stream_order)
    set_tests_properties(cli.replay_stream_order PROPERTIES LABELS "unit;cli;python" TIMEOUT 300
      PASS_REGULAR_EXPRESSION "^ok")
    # Snapshot forms found in public repositories: frees recorded as free_completed only, a
    # trace that requests more than the recorded run reserved (the reason said), a pickled list
    # that is no snapshot.
    add_test(NAME cli.trace_variants
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cli/trace_variants.py
              $<TARGET_FILE:sympool_cli> ${SP_CLI_OUT}/trace_variants)
    set_tests_properties(cli.trace_variants PROPERTIES LABELS "unit;cli;python" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "^ok")
    # Trace entries whose keys change from one to the next (order, a key for another, a key
    # twice): each read as itself, by the entry hook as when read whole.
    add_test(NAME cli.entry_shapes
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cli/entry_shapes.py
              $<TARGET_FILE:sympool_cli> ${SP_CLI_OUT}/entry_shapes)
    set_tests_properties(cli.entry_shapes PROPERTIES LABELS "unit;cli;python" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "^ok")
    # Dicts of a few key lists in turns (entries with and without a stream, a final state's
    # segments and their blocks): none reads a value of a key only the dict before it had.
    add_test(NAME cli.entry_shape_turns
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cli/entry_shape_turns.py
              $<TARGET_FILE:sympool_cli> ${SP_CLI_OUT}/entry_shape_turns)
    set_tests_properties(cli.entry_shape_turns PROPERTIES LABELS "unit;cli;python" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "^ok")
    # Real snapshots re-pickled with protocols 0-3 read as their protocol-4 originals (replay
    # --json, info, summary the same), and malformed text opcodes are refused saying what.
    add_test(NAME cli.pickle_protocols
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cli/pickle_protocols.py
              $<TARGET_FILE:sympool_cli> ${SP_CLI_OUT}/pickle_protocols
              ${CMAKE_CURRENT_SOURCE_DIR}/data/real/silmont-small.pickle
              ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-small-u64.pickle
              ${CMAKE_CURRENT_SOURCE_DIR}/data/real/layoutediting-legacy-list.pickle
              ${CMAKE_CURRENT_SOURCE_DIR}/data/real/attention-state-only.pickle
              ${CMAKE_CURRENT_SOURCE_DIR}/data/real/bolong-expandable-recorded.pickle)
    set_tests_properties(cli.pickle_protocols PROPERTIES LABELS "unit;cli;python" TIMEOUT 300
      PASS_REGULAR_EXPRESSION "^ok")
    # A snapshot emptied while it is read (PyTorch rewrites its file in place): exit 1 and one
    # line, not SIGBUS.
    add_test(NAME cli.truncated_while_read
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cli/truncated_while_read.py
              $<TARGET_FILE:sympool_cli> ${SP_CLI_OUT}/truncated_while_read)
    set_tests_properties(cli.truncated_while_read PROPERTIES LABELS "unit;cli;python" TIMEOUT 300
      PASS_REGULAR_EXPRESSION "^ok")
    # A pickle that memoizes more than 2^24 values (as snapshots of about 1.5 GB do) was refused
    # ("memo index 16777216 exceeds the limit"): the memo's bound is the document's size now.
    add_test(NAME cli.memo_past_2_24
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cli/memo_past_2_24.py
              $<TARGET_FILE:sympool_cli> ${SP_CLI_OUT}/memo_past_2_24)
    set_tests_properties(cli.memo_past_2_24 PROPERTIES LABELS "unit;cli;python" TIMEOUT 300
      PASS_REGULAR_EXPRESSION "^ok")
    # A stream of junk (a pipe, /dev/zero) is refused from its first bytes, as the same bytes
    # in a regular file are: not read to the 4 GiB cap first, nor waited on for more.
    add_test(NAME cli.stream_junk
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cli/stream_junk.py
              $<TARGET_FILE:sympool_cli> ${SP_CLI_OUT}/stream_junk)
    set_tests_properties(cli.stream_junk PROPERTIES LABELS "unit;cli;python" TIMEOUT 300
      PASS_REGULAR_EXPRESSION "^ok")
    # Snapshots no PyTorch writes (a segment on device 100, ...): refused with one line that
    # names the trace and what is wrong.
    add_test(NAME cli.hostile_snapshots
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cli/hostile_snapshots.py
              $<TARGET_FILE:sympool_cli> ${SP_CLI_OUT}/hostile_snapshots)
    set_tests_properties(cli.hostile_snapshots PROPERTIES LABELS "unit;cli;python" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "^ok")
    # A snapshot saved with torch.save (a ZIP64 archive as PyTorch's writer lays it out, and
    # one from Python's zipfile): every command reads its data.pkl as the pickle itself;
    # archives that are not such a snapshot are refused with what they are.
    add_test(NAME cli.torch_save
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cli/torch_save.py
              $<TARGET_FILE:sympool_cli> ${PROJECT_SOURCE_DIR}/tests/data/trace-small-p4.pickle
              ${SP_CLI_OUT}/torch_save)
    set_tests_properties(cli.torch_save PROPERTIES LABELS "unit;cli;python" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "torch save ok")
    # sympool's own snapshots of random programs (bench/replay_self.py: two devices, streams,
    # frees held for other streams, MemPools, empty_cache, OOMs under a fraction) replay to
    # their recorded peak reserved exactly, under the settings that once missed it: a
    # garbage_collection_threshold with and without a memory fraction (an empty_cache before a
    # malloc was read as a collection that never came).
    add_test(NAME cli.replay_self
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bench/replay_self.py
              $<TARGET_FILE:sympool_cli> $<TARGET_FILE:sympool> ${SP_CLI_OUT}/replay_self
              --seeds 1-8 --check
              --conf garbage_collection_threshold:0.6
              --conf garbage_collection_threshold:0.6,per_process_memory_fraction:0.01
              --conf max_split_size_mb:40,garbage_collection_threshold:0.5,per_process_memory_fraction:0.01)
    set_tests_properties(cli.replay_self PROPERTIES LABELS "unit;cli;python" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "replay-self: ok")
    # With expandable segments, by sympool's own rules (the snapshot records them; 10-31% above
    # when the replay took PyTorch's rules in their place), and the unmaps of
    # SYMPOOL_EXPANDABLE_RECYCLE before a growth that a held free outlasts read as that growth's
    # (read as an empty_cache, they completed the free: 0.3-1.8% off). Not every program is
    # exact yet (docs/API.md): these 8 are.
    add_test(NAME cli.replay_self_expandable
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bench/replay_self.py
              $<TARGET_FILE:sympool_cli> $<TARGET_FILE:sympool>
              ${SP_CLI_OUT}/replay_self_expandable --seeds 1-8 --check
              --conf expandable_segments:True)
    set_tests_properties(cli.replay_self_expandable PROPERTIES LABELS "unit;cli;python"
      TIMEOUT 120 PASS_REGULAR_EXPRESSION "replay-self: ok")
    # Traces no allocator could have written (found by tests/fuzz/fuzz_replay.c): the replay
    # neither frees a block twice nor loses one (--repeat's sp_shutdown finds nothing left).
    add_test(NAME cli.replay_adversary
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/cli/replay_adversary.py
              $<TARGET_FILE:sympool_cli> ${SP_CLI_OUT}/replay_adversary)
    set_tests_properties(cli.replay_adversary PROPERTIES LABELS "unit;cli;python" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "^ok")
  endif()

  # Extreme but legal values (sizes near 2^64, time_us at +-2^63 or going backwards, an alloc
  # at address 0, sums past 4 EiB): each command handles the snapshot or refuses it naming the
  # field. The snapshots are written by the script; the same ones are in tests/fuzz/repro.
  if(Python3_EXECUTABLE)
    add_test(NAME cli.extreme_values
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/fuzz/cli_extreme.py
              $<TARGET_FILE:sympool_cli> ${SP_CLI_OUT}/extreme)
    set_tests_properties(cli.extreme_values PROPERTIES LABELS "unit;cli" TIMEOUT 300
      PASS_REGULAR_EXPRESSION "cli-extreme: ok")
  endif()

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

  # A single replay of a trace this size runs on the heap prepared for it and leaves the
  # allocator to the exit; --repeat releases everything between replays: the same results.
  add_test(NAME cli.replay_single_is_repeated
    COMMAND sh -c "a=$('$<TARGET_FILE:sympool_cli>' replay '${SP_CLI_TRACE}' --json | sed 's/\"ns_per_event\":[^,]*//') && b=$('$<TARGET_FILE:sympool_cli>' replay '${SP_CLI_TRACE}' --json --repeat 2 | sed 's/\"ns_per_event\":[^,]*//') && [ -n \"$a\" ] && [ \"$a\" = \"$b\" ] && echo same")
  set_tests_properties(cli.replay_single_is_repeated PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "^same")

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
    PASS_REGULAR_EXPRESSION "wrote .*timeline.svg .*peak requested 22.234 GiB, peak reserved 22.580 GiB")

  add_test(NAME cli.info COMMAND $<TARGET_FILE:sympool_cli> info)
  set_tests_properties(cli.info PROPERTIES LABELS "unit;cli" TIMEOUT 60
    ENVIRONMENT "SYMPOOL_DEVICE=host;SYMPOOL_HOST_CAPACITY=3GiB"
    PASS_REGULAR_EXPRESSION "backend: host.*capacity 3.00 GiB.*SYMPOOL_HOST_CAPACITY")

  add_test(NAME cli.unknown_command COMMAND $<TARGET_FILE:sympool_cli> frobnicate)
  set_tests_properties(cli.unknown_command PROPERTIES LABELS "unit;cli" TIMEOUT 60 WILL_FAIL TRUE)

  # PyTorch's own loader: the snapshot of the replay loads with pickle.load, block sizes add up,
  # no dump ends with its own `snapshot` entry (PyTorch copies the traces before recording it),
  # and the JSON form parses.
  if(Python3_Interpreter_FOUND)
    add_test(NAME cli.snapshot_python_load
      COMMAND ${CMAKE_COMMAND} -E env SYMPOOL_DEVICE=host
              sh -c "'$<TARGET_FILE:sympool_cli>' replay '${SP_CLI_TRACE}' --snapshot '${SP_CLI_OUT}/py.pickle' >/dev/null && '$<TARGET_FILE:sympool_cli>' replay '${SP_CLI_TRACE}' --snapshot '${SP_CLI_OUT}/py.json' >/dev/null && '${Python3_EXECUTABLE}' -c \"import pickle,json,sys; s=pickle.load(open(sys.argv[1],'rb')); j=json.load(open(sys.argv[2])); assert set(s)=={'segments','device_traces','allocator_settings','external_annotations'}; assert all(sum(b['size'] for b in g['blocks'])==g['total_size'] for g in s['segments']); assert len(s['device_traces'])>max(g['device'] for g in s['segments']); assert s['device_traces'][0][-1]['action']!='snapshot'; assert len(j['segments'])==len(s['segments']); print('python ok', len(s['segments']), len(s['device_traces'][0]))\" '${SP_CLI_OUT}/py.pickle' '${SP_CLI_OUT}/py.json'")
    set_tests_properties(cli.snapshot_python_load PROPERTIES LABELS "unit;cli;python" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "python ok 688")
  endif()
endif()

# ---- the command line itself: getopt_long, --help everywhere, refusals ---------
# sp_cli_check(NAME n RC code REGEX re ARGS ...): run `sympool ARGS...` with stdout and stderr
# together, then check the output and the exit status (the wrapper prints "rc=N" last).
if(TARGET sympool_cli)
  function(sp_cli_check)
    cmake_parse_arguments(A "" "NAME;RC;REGEX" "ARGS;ENV" ${ARGN})
    add_test(NAME cli.${A_NAME}
      COMMAND sh -c "\"$@\" 2>&1; echo \"rc=$?\"" sh $<TARGET_FILE:sympool_cli> ${A_ARGS})
    set_tests_properties(cli.${A_NAME} PROPERTIES LABELS "unit;cli" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "${A_REGEX}.*rc=${A_RC}\n" ENVIRONMENT "SYMPOOL_DEVICE=host;${A_ENV}")
  endfunction()
  set(SMALL ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-small-p4.pickle)

  if(SP_HELP2MAN)
    sp_unit_target(sympool_man)
    # The page has the commands' own --help texts (cmake/man_include.cmake).
    add_test(NAME cli.man_page COMMAND sh -c "cat '${PROJECT_BINARY_DIR}/sympool.1'")
    set_tests_properties(cli.man_page PROPERTIES LABELS "unit;cli" TIMEOUT 30
      PASS_REGULAR_EXPRESSION "\\.TH SYMPOOL.*replay.*\\.SH COMMANDS.*sympool info.*json.*sympool replay.*capacity.*sympool plot.*sympool summary.*\\.SH ENVIRONMENT")
  endif()
  sp_cli_check(NAME version RC 0 REGEX "^sympool [0-9]+\\.[0-9]+\\.[0-9]+\n" ARGS --version)
  sp_cli_check(NAME help RC 0 REGEX "usage: sympool .*summary SNAPSHOT" ARGS --help)
  # `help` is a command, and every command takes --help: `help --help` said "unknown command".
  sp_cli_check(NAME help_help RC 0 REGEX "usage: sympool .*summary SNAPSHOT" ARGS help --help)
  sp_cli_check(NAME help_h RC 0 REGEX "usage: sympool .*summary SNAPSHOT" ARGS help -h)
  sp_cli_check(NAME no_command RC 2 REGEX "usage: sympool" ARGS)
  sp_cli_check(NAME bad_global_option RC 2 REGEX "sympool: unknown option '--frob'" ARGS --frob)
  foreach(cmd info replay plot summary)
    sp_cli_check(NAME ${cmd}_help RC 0 REGEX "usage: sympool ${cmd}" ARGS ${cmd} --help)
    sp_cli_check(NAME ${cmd}_h RC 0 REGEX "usage: sympool ${cmd}" ARGS ${cmd} -h)
    sp_cli_check(NAME help_${cmd} RC 0 REGEX "usage: sympool ${cmd}" ARGS help ${cmd})
    sp_cli_check(NAME ${cmd}_unknown_option RC 2
      REGEX "sympool ${cmd}: unknown option '--no-such-option' \\(see sympool ${cmd} --help\\)"
      ARGS ${cmd} --no-such-option)
  endforeach()
  # The words after "--" are the trace and the configurations (a file named like an option):
  # they were dropped, and replay said "no trace given".
  sp_cli_check(NAME replay_after_double_dash RC 0 REGEX "^\\{\"trace\":\"[^\"]*trace-small-p4.pickle\","
    ARGS replay --json -- ${SMALL})
  sp_cli_check(NAME replay_compare_after_double_dash RC 0
    REGEX "trace-small-p4.pickle: 2 configurations.*\n  max_split_size_mb:64 .*\n  max_split_size_mb:128 "
    ARGS replay ${SMALL} --compare -- max_split_size_mb:64 max_split_size_mb:128)
  # A long option given a value it does not take is named as written, not by its short letter
  # ("unknown option '-j'" for --json=1).
  sp_cli_check(NAME replay_flag_with_value RC 2
    REGEX "^sympool replay: option '--json' takes no value \\('--json=1'\\)"
    ARGS replay ${SMALL} --json=1)
  # ... and only then: an unknown short option in a cluster after a long option is itself
  # ("'--json' takes no value ('--json')" named the word before it).
  sp_cli_check(NAME replay_unknown_short_after_long RC 2
    REGEX "^sympool replay: unknown option '-x' \\(see sympool replay --help\\)\n"
    ARGS replay ${SMALL} --json -xj)
  sp_cli_check(NAME replay_unknown_short_after_long_value RC 2
    REGEX "^sympool replay: unknown option '-x' \\(see sympool replay --help\\)\n"
    ARGS replay ${SMALL} --conf=max_split_size_mb:64 -xj)
  # A prefix of several long options is ambiguous, not unknown: each option it abbreviates is
  # named ("--co" was an "unknown option '--co'", though --conf and --compare are known).
  sp_cli_check(NAME replay_ambiguous_option RC 2
    REGEX "^sympool replay: option '--co' is ambiguous: --conf --compare \\(see sympool replay --help\\)\n"
    ARGS replay ${SMALL} --co=x)
  sp_cli_check(NAME replay_missing_value RC 2 REGEX "sympool replay: option '--conf' needs a value"
    ARGS replay ${SMALL} --conf)
  # --opt=value and --opt value mean the same.
  sp_cli_check(NAME replay_opt_equals RC 0
    REGEX "\"ooms\":[1-9][0-9]*,.*\"capacity\":\"64MiB\"" ARGS replay ${SMALL} --json --capacity=64MiB)
  sp_cli_check(NAME replay_snapshot_txt RC 2
    REGEX "--snapshot writes OUT.pickle or OUT.json, not '.*out.txt'"
    ARGS replay ${SMALL} --snapshot ${SP_CLI_OUT}/out.txt)
  # The snapshot's own settings (fixed segments) rebuild its segments; expandable segments cannot
  # have that layout, so its live blocks are requested instead (and the output says which).
  sp_cli_check(NAME replay_start_recorded RC 0
    REGEX "\"start_segments\":12,.*\"starting_state\":\"recorded_segments\"" ARGS replay ${SMALL} --json)
  sp_cli_check(NAME replay_start_requested RC 0
    REGEX "starting state +its live blocks requested under this configuration \\(the recorded segment layout is fixed segments\\): 21 blocks"
    ARGS replay ${SMALL} --conf expandable_segments:True)
  sp_cli_check(NAME replay_two_traces RC 2 REGEX "more than one trace" ARGS replay ${SMALL} ${SMALL})
  # Recorded settings PyTorch cannot have (a max_split_size of 1 byte) are the snapshot's fault:
  # exit 1 naming allocator_settings, not 2 blaming a SYMPOOL_ALLOC_CONF the user never set.
  sp_cli_check(NAME replay_recorded_settings_invalid RC 1
    REGEX "sympool replay: .*trace-settings-not-pytorchs.json: allocator_settings read as SYMPOOL_ALLOC_CONF='max_split_size_mb:0' are not valid: .*below the minimum 20"
    ARGS replay ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-not-pytorchs.json)
  # Every command loads such a snapshot (PyTorch's viewer does) and says the same about its
  # settings: info and summary that they are not valid, replay (and --compare, which starts from
  # them) refuses them. A threshold PyTorch cannot have (-0.5) was left out without a word.
  sp_cli_check(NAME info_recorded_settings_invalid RC 0
    REGEX "settings: 'max_split_size_mb:0'.*\n  not valid: max_split_size_mb: 0 is below the minimum 20"
    ARGS info ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-not-pytorchs.json)
  sp_cli_check(NAME summary_recorded_settings_invalid RC 0
    REGEX "note: .*allocator_settings read as SYMPOOL_ALLOC_CONF='max_split_size_mb:0' are not valid: .*the allocated peaks are not replayed"
    ARGS summary ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-not-pytorchs.json)
  sp_cli_check(NAME replay_compare_recorded_settings_invalid RC 1
    REGEX "allocator_settings read as SYMPOOL_ALLOC_CONF='max_split_size_mb:0' are not valid"
    ARGS replay ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-not-pytorchs.json --compare "" max_split_size_mb:64)
  sp_cli_check(NAME replay_recorded_gc_negative RC 1
    REGEX "allocator_settings read as SYMPOOL_ALLOC_CONF='garbage_collection_threshold:-0.5' are not valid: garbage_collection_threshold"
    ARGS replay ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-gc-negative.json)
  sp_cli_check(NAME info_recorded_gc_negative RC 0
    REGEX "not valid: garbage_collection_threshold"
    ARGS info ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-gc-negative.json)
  # The string's per_process_memory_fraction too: NaN was read as no fraction by every command.
  sp_cli_check(NAME replay_recorded_fraction_nan RC 1
    REGEX "allocator_settings read as .* are not valid: per_process_memory_fraction is invalid"
    ARGS replay ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-fraction-nan.json)
  sp_cli_check(NAME info_recorded_fraction_nan RC 0
    REGEX "not valid: per_process_memory_fraction is invalid"
    ARGS info ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-fraction-nan.json)
  # roundup_power2_divisions' keys are MB boundaries: one holding ",max_split_size_mb:64," went
  # into the configuration as a setting of its own. A key written twice is the dict's one key,
  # with its last value (the list was "[1:4,2:2,1:8]", which no parser takes).
  sp_cli_check(NAME info_recorded_roundup_key_injected RC 0
    REGEX "settings: 'defaults'\n  not valid: roundup_power2_divisions: key '1:4.,max_split_size_mb:64"
    ARGS info ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-roundup-keys.json)
  sp_cli_check(NAME replay_recorded_roundup_key_injected RC 1
    REGEX "are not valid: roundup_power2_divisions: key"
    ARGS replay ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-roundup-keys.json)
  sp_cli_check(NAME info_recorded_roundup_key_twice RC 0
    REGEX "settings: 'roundup_power2_divisions:.1:8,2:2.'"
    ARGS info ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-roundup-twice.json)
  # More keys than PyTorch writes are refused at once: a key written twice is looked for among the
  # others, and a million keys took minutes.
  sp_cli_check(NAME info_recorded_roundup_many_keys RC 0
    REGEX "not valid: roundup_power2_divisions has 65 keys"
    ARGS info ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-roundup-many.json)
  # A setting of a kind PyTorch never records (expandable_segments "True", a float
  # max_split_size, a str threshold, a str count of divisions, a number for the conf string) was
  # left out without a word: info showed 'defaults' and replay ran them in its place (rc 0).
  foreach(sp_kind IN ITEMS "expandable-str|expandable_segments'. is a str, not the bool"
                           "split-float|max_split_size'. is a float, not the int"
                           "gc-str|garbage_collection_threshold'. is a str, not the float"
                           "roundup-value-str|roundup_power2_divisions.'1'. is a str, not a count"
                           "conf-int|PYTORCH_CUDA_ALLOC_CONF'. is an int, not the str")
    string(REPLACE "|" ";" sp_kind "${sp_kind}")
    list(GET sp_kind 0 sp_name)
    list(GET sp_kind 1 sp_why)
    sp_cli_check(NAME info_recorded_settings_kind_${sp_name} RC 0 REGEX "\n  not valid: .*${sp_why}"
      ARGS info ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-kind-${sp_name}.json)
    sp_cli_check(NAME replay_recorded_settings_kind_${sp_name} RC 1
      REGEX "sympool replay: .*trace-settings-kind-${sp_name}.json: allocator_settings read as .* are not valid: .*${sp_why}"
      ARGS replay ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-kind-${sp_name}.json)
  endforeach()
  # A max_split_size PyTorch cannot have written (it writes -1 for none, else at least 20 MiB):
  # 0, another negative or an int past 2^64 read as no limit, and the replay ran the defaults
  # (rc 0). SIZE_MAX written unsigned is no limit, as -1 is.
  foreach(sp_split IN ITEMS "zero|is 0, not -1" "negative|is -5, not -1"
                            "int64-min|is -9223372036854775808, not -1"
                            "uint|is 9223372036854775808, not -1"
                            "bigint|is an int outside .-2.63, 2.64., not -1")
    string(REPLACE "|" ";" sp_split "${sp_split}")
    list(GET sp_split 0 sp_name)
    list(GET sp_split 1 sp_why)
    sp_cli_check(NAME info_recorded_split_${sp_name} RC 0
      REGEX "\n  not valid: allocator_settings.'max_split_size'. ${sp_why}"
      ARGS info ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-split-${sp_name}.json)
    sp_cli_check(NAME replay_recorded_split_${sp_name} RC 1
      REGEX "trace-settings-split-${sp_name}.json: allocator_settings read as .* are not valid: allocator_settings.'max_split_size'. ${sp_why}"
      ARGS replay ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-split-${sp_name}.json)
  endforeach()
  sp_cli_check(NAME replay_recorded_split_size_max RC 0 REGEX "peak reserved"
    ARGS replay ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-split-size-max.json)
  # PyTorch clamps max_split_size_mb to SIZE_MAX / 1 MiB and records that size as int64 -2^20
  # (2^64 - 2^20 unsigned): a size it can have written, refused as "not valid" before.
  foreach(sp_name IN ITEMS clamped clamped-uint)
    sp_cli_check(NAME replay_recorded_split_${sp_name} RC 0
      REGEX "\"settings\":\"max_split_size_mb:17592186044415\""
      ARGS replay ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-settings-split-${sp_name}.json --json)
  endforeach()
  sp_cli_check(NAME replay_repeat_garbage RC 2 REGEX "--repeat takes 1 to 64, not '3x'"
    ARGS replay ${SMALL} --repeat=3x)
  # Only digits are a number: strtol's leading white space and '+' were taken (--repeat ' 3' ran
  # three times, -d +0 was device 0).
  sp_cli_check(NAME replay_repeat_space RC 2 REGEX "--repeat takes 1 to 64, not ' 3'"
    ARGS replay ${SMALL} "--repeat= 3")
  # A recorded run that held more than SYMPOOL_HOST_CAPACITY's default (80 GiB: an H200's,
  # a B200's): without --capacity the emulated device holds it (twice its peak), so replay and
  # summary give its peaks; on 80 GiB the replay ran out of memory at once (peak 0, summary "-").
  sp_cli_check(NAME replay_past_80gib RC 0
    REGEX "peak reserved +90.000 GiB +recorded run: 90.000 GiB \\(\\+0.00%\\).*OOMs +0 "
    ARGS replay ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-90gib.json)
  # Each device's recorded bytes stay below 4 EiB (the loader's bound), but replay adds them up
  # over devices: six devices of 3 EiB reported PyTorch's peak reserved as 2 EiB (18 EiB wrapped
  # at 2^64), rc 0. Refused, naming the sum.
  sp_cli_check(NAME replay_device_sums_past_16eib RC 1
    REGEX "trace-devices-past-16eib.json: the recorded peak reserved of devices 0 to 5 together reach 16 EiB"
    ARGS replay --json ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-devices-past-16eib.json)
  sp_cli_check(NAME summary_past_80gib RC 0 REGEX "Allocated memory +\\| +0 B +\\| +90.0 GiB "
    ARGS summary ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-90gib.json)
  # The capacity the user gives is the one replay uses.
  sp_cli_check(NAME replay_past_80gib_env_capacity RC 0 REGEX "OOMs +1 "
    ARGS replay ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-90gib.json ENV SYMPOOL_HOST_CAPACITY=85GiB)
  # summary's allocated peak is the recorded run's, under the snapshot's settings alone: the
  # allocator's own variables in the environment do not reach its replay (a 5 MiB block in a
  # 20 MiB segment peaked at 6 MiB under SYMPOOL_ROUNDUP_POWER2_DIVISIONS=2; a thread cache or a
  # small capacity made the peak "-").
  sp_cli_check(NAME summary_peak_ignores_allocator_env RC 0
    REGEX "Allocated memory +\\| +30.3 MiB +\\| +3.0 GiB "
    ARGS summary ${CMAKE_CURRENT_SOURCE_DIR}/data/real/silmont-small.pickle
    ENV SYMPOOL_ROUNDUP_POWER2_DIVISIONS=2 SYMPOOL_THREAD_CACHE=64KiB SYMPOOL_HOST_CAPACITY=1GiB)
  # An unmap of two small-pool pages at once (PyTorch unmaps a merged free block of an expandable
  # segment whole): the small pool's, as the maps that made them; by its size (not one 2 MiB
  # page) it was counted in the large pool.
  sp_cli_check(NAME summary_small_pool_unmap RC 0
    REGEX "from large pool +\\| +0 B +\\| +0 B +\\| +0 B +\\| +0 B +\\|\n\\| +from small pool +\\| +0 B +\\| +4.0 MiB +\\| +4.0 MiB +\\| +4.0 MiB"
    ARGS summary ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-small-unmap.json)
  # A trace that names its entries' pools (sympool's snapshots: "pool_id" on a private pool's
  # entries, none on the default pool's): a default-pool allocation at an address where a private
  # pool's segment lies in the end state (made there after an empty_cache) is the default pool's,
  # not routed by address into that pool, where it made a segment the recorded run never had.
  sp_cli_check(NAME replay_pool_ids_name_the_default_pool RC 0
    REGEX "peak reserved +0.020 GiB +recorded run: 0.020 GiB \\(\\+0.00%\\)"
    ARGS replay ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-pool-ids-default.json)
  # An expandable segment is no segment to PyTorch's memory_stats (map_block adds reserved bytes
  # only) and its free blocks are no inactive split (free_block and alloc_found_block leave
  # expandable segments out): of the two segments here, 40 MiB expandable and 20 MiB fixed, each
  # with one free block, the fixed one alone is a reserved segment and non-releasable (15 MiB).
  sp_cli_check(NAME summary_expandable_state RC 0
    REGEX "Non-releasable memory +\\| +15.0 MiB .*Reserved segments +\\| +1 \\| +1 \\| +1 \\|.*Non-releasable allocs +\\| +1 \\|"
    ARGS summary ${CMAKE_CURRENT_SOURCE_DIR}/data/snapshot-expandable-state.json)
  sp_cli_check(NAME summary_device_plus RC 2 REGEX "--device takes 0 to 4095, not '\\+0'"
    ARGS summary ${SMALL} -d +0)
  # A file that is not a pickle says so, not "memo key 105 is not defined".
  sp_cli_check(NAME replay_not_a_pickle RC 1 REGEX "CMakeLists.txt: not a pickle"
    ARGS replay ${PROJECT_SOURCE_DIR}/CMakeLists.txt)
  sp_cli_check(NAME summary_not_a_pickle RC 1 REGEX "CMakeLists.txt: not a pickle"
    ARGS summary ${PROJECT_SOURCE_DIR}/CMakeLists.txt)
  # --compare: one row per configuration, the recorded settings alone first.
  # (CMake drops empty arguments, so the "" configuration goes through the shell.)
  add_test(NAME cli.replay_compare_rows COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' replay '${SMALL}' --compare '' max_split_size_mb:64 garbage_collection_threshold:0.5 2>&1; echo rc=$?")
  set_tests_properties(cli.replay_compare_rows PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "settings: the snapshot's 'expandable_segments:False'.*configuration.*\n  \\(recorded\\) .*\n  max_split_size_mb:64 .*\n  garbage_collection_threshold:0.5 .*rc=0")
  add_test(NAME cli.replay_compare_json_lines COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' replay '${SMALL}' --json --compare '' max_split_size_mb:64 2>&1; echo rc=$?")
  set_tests_properties(cli.replay_compare_json_lines PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "^\\{[^\n]*\"conf\":\"\"[^\n]*\n\\{[^\n]*\"conf\":\"max_split_size_mb:64\"[^\n]*\nrc=0")
  sp_cli_check(NAME replay_compare_bad_conf RC 2 REGEX "no_such_key"
    ARGS replay ${SMALL} --compare "" no_such_key:1)
  # A --compare item naming the trace as SYMPOOL_DEBUG_FILE appended the replay's log lines to
  # the trace it read: refused (as main.c refuses the variable), the trace left byte for byte.
  add_test(NAME cli.replay_compare_debug_file_is_trace COMMAND sh -c
    "cp '${SMALL}' '${SP_CLI_OUT}/cmp_dbg.pickle' && '$<TARGET_FILE:sympool_cli>' replay '${SP_CLI_OUT}/cmp_dbg.pickle' --compare 'SYMPOOL_DEBUG=INFO,SYMPOOL_DEBUG_FILE=${SP_CLI_OUT}/cmp_dbg.pickle' 2>&1; echo rc=$?; cmp '${SMALL}' '${SP_CLI_OUT}/cmp_dbg.pickle' && echo unchanged")
  set_tests_properties(cli.replay_compare_debug_file_is_trace PROPERTIES LABELS "unit;cli"
    TIMEOUT 120 ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "SYMPOOL_DEBUG_FILE=.*cmp_dbg.pickle names the trace being replayed.*rc=2\nunchanged")
  # Items that set what the replay sets itself were overridden without a word (a row labelled
  # SYMPOOL_ALLOC_CONF=max_split_size_mb:64 replayed the recorded settings) or left the emulated
  # device (SYMPOOL_DEVICE=cuda): refused, naming the option.
  sp_cli_check(NAME replay_compare_item_alloc_conf RC 2
    REGEX "configuration 'SYMPOOL_ALLOC_CONF=max_split_size_mb:64': SYMPOOL_ALLOC_CONF is what the configuration's KEY:VALUE items set"
    ARGS replay ${SMALL} --compare SYMPOOL_ALLOC_CONF=max_split_size_mb:64)
  sp_cli_check(NAME replay_compare_item_device RC 2
    REGEX "configuration 'SYMPOOL_DEVICE=cuda': the replay sets SYMPOOL_DEVICE itself"
    ARGS replay ${SMALL} --compare SYMPOOL_DEVICE=cuda)
  sp_cli_check(NAME replay_compare_item_capacity RC 2
    REGEX "configuration 'SYMPOOL_HOST_CAPACITY=1GiB': --capacity sets SYMPOOL_HOST_CAPACITY"
    ARGS replay ${SMALL} --capacity 64MiB --compare SYMPOOL_HOST_CAPACITY=1GiB)
  # What a configuration's items set is put back before the next one: past 16 items the 17th
  # option was kept (SYMPOOL_NO_CACHING=1 leaked into the next row: 0.431 GiB, not 0.451), and
  # an option set in the environment went back to its default, not to the environment's value.
  string(REPEAT "SYMPOOL_DEBUG=WARN," 16 SP_SIXTEEN)
  sp_cli_check(NAME replay_compare_options_reset RC 0
    REGEX "\n\\{[^\n]*\"peak_reserved_bytes\":484442112,[^\n]*\"conf\":\"SYMPOOL_DEBUG=WARN\"[^\n]*\n"
    ARGS replay ${SMALL} --json --compare ${SP_SIXTEEN}SYMPOOL_NO_CACHING=1 SYMPOOL_DEBUG=WARN)
  sp_cli_check(NAME replay_compare_options_reset_env RC 0
    REGEX "\n\\{[^\n]*\"peak_reserved_bytes\":463071232,[^\n]*\"conf\":\"SYMPOOL_DEBUG=WARN\"[^\n]*\n"
    ARGS replay ${SMALL} --json --compare SYMPOOL_NO_CACHING=0 SYMPOOL_DEBUG=WARN
    ENV SYMPOOL_NO_CACHING=1)
  # Every configuration is checked before the first replay: a bad one last in the list is refused
  # before anything runs (it was refused after the others had replayed; INFO shows each init).
  sp_cli_check(NAME replay_compare_checked_first RC 2 REGEX "no_such_key"
    ARGS replay ${SMALL} --compare max_split_size_mb:64 no_such_key:1 ENV SYMPOOL_DEBUG=INFO)
  set_tests_properties(cli.replay_compare_checked_first PROPERTIES
    FAIL_REGULAR_EXPRESSION "allocator ready")
  # A failed write to stdout (a full disk) is the command's failure: it exited 0 over a
  # truncated or empty output (`sympool replay T --json > out.json` on a full disk). The message
  # says why (the first failed write's errno): an output larger than stdout's buffer (`info
  # TRACE`) failed inside an earlier flush, whose errno was gone by the end, and said no why.
  add_test(NAME cli.stdout_write_error COMMAND sh -c
    "for c in 'info --json' 'info ${SMALL}' 'summary ${SMALL}' 'replay ${SMALL} --json'; do '$<TARGET_FILE:sympool_cli>' $c > /dev/full; echo \"rc=$?\"; done 2>&1")
  set_tests_properties(cli.stdout_write_error PROPERTIES LABELS "unit;cli" TIMEOUT 120
    ENVIRONMENT "SYMPOOL_DEVICE=host;LC_ALL=C"
    PASS_REGULAR_EXPRESSION "^sympool: cannot write the output to stdout: No space left on device\nrc=1\nsympool: cannot write the output to stdout: No space left on device\nrc=1\nsympool: cannot write the output to stdout: No space left on device\nrc=1\nsympool: cannot write the output to stdout: No space left on device\nrc=1\n$")
  # Started with stdout closed, the command's text went into the first file it opened for writing
  # (here the SYMPOOL_DEBUG_FILE log, which took descriptor 1): refused as a failed write.
  add_test(NAME cli.stdout_closed COMMAND sh -c
    "rm -f '${SP_CLI_OUT}/closed.log'; SYMPOOL_DEBUG=INFO SYMPOOL_DEBUG_FILE='${SP_CLI_OUT}/closed.log' '$<TARGET_FILE:sympool_cli>' replay '${SMALL}' >&-; echo \"rc=$?\"; grep -c 'replay of' '${SP_CLI_OUT}/closed.log'")
  set_tests_properties(cli.stdout_closed PROPERTIES LABELS "unit;cli" TIMEOUT 120
    ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "cannot write the output to stdout[^\n]*\nrc=1\n0\n$")
  # SYMPOOL_DEBUG_FILE in a folder that does not exist: the replay's own log lines (an OOM
  # warning, at the default level the library logs nothing itself) went to stderr without a
  # word. Said once, naming the file and why (as the library says it), the lines still on stderr.
  add_test(NAME cli.replay_debug_file_missing_dir COMMAND sh -c
    "SYMPOOL_DEBUG_FILE='${SP_CLI_OUT}/no-such-dir/log' '$<TARGET_FILE:sympool_cli>' replay '${CMAKE_CURRENT_SOURCE_DIR}/data/trace-times-tiny.json' --capacity 4MiB 2>&1 >/dev/null | tee '${SP_CLI_OUT}/debug_missing.err'; echo \"notices=$(grep -c 'cannot open SYMPOOL_DEBUG_FILE' '${SP_CLI_OUT}/debug_missing.err')\"")
  set_tests_properties(cli.replay_debug_file_missing_dir PROPERTIES LABELS "unit;cli" TIMEOUT 120
    ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "^[^\n]* SYMPOOL WARN cannot open SYMPOOL_DEBUG_FILE '[^']*/no-such-dir/log': No such file or directory; logging to stderr\n[^\n]*SYMPOOL WARN [^\n]*out of memory on device 0.*\nnotices=1\n$")
  # The same at SYMPOOL_DEBUG=INFO, where the library logs lines of its own while the replay has
  # no filter set, and fails on the file too: it was said twice, by the library and the CLI. One
  # line about the file, in a replay and in a --compare.
  add_test(NAME cli.replay_debug_file_missing_dir_info COMMAND sh -c
    "for a in '--capacity 4MiB' '--compare max_split_size_mb:64 max_split_size_mb:128'; do SYMPOOL_DEBUG=INFO SYMPOOL_DEBUG_FILE='${SP_CLI_OUT}/no-such-dir/log' '$<TARGET_FILE:sympool_cli>' replay '${CMAKE_CURRENT_SOURCE_DIR}/data/trace-times-tiny.json' $a 2>&1 >/dev/null | grep 'SYMPOOL_DEBUG_FILE'; echo \"rc=$?\"; done")
  set_tests_properties(cli.replay_debug_file_missing_dir_info PROPERTIES LABELS "unit;cli" TIMEOUT 120
    ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "^[^\n]* SYMPOOL WARN cannot open SYMPOOL_DEBUG_FILE '[^']*/no-such-dir/log': No such file or directory; logging to stderr\nrc=0\n[^\n]* SYMPOOL WARN cannot open SYMPOOL_DEBUG_FILE '[^']*/no-such-dir/log': No such file or directory; logging to stderr\nrc=0\n$")
  # A malformed allocator configuration in the environment was warned about ("that entry is
  # ignored, the others apply") where replay sets SYMPOOL_ALLOC_CONF itself and never uses it:
  # the snapshot's settings, --conf, --compare. Still warned about where it is used (a snapshot
  # without allocator_settings, no --conf).
  add_test(NAME cli.replay_env_conf_replaced COMMAND sh -c
    "for a in '' '--conf max_split_size_mb:64' '--compare max_split_size_mb:64' '--capacity 1GiB'; do SYMPOOL_ALLOC_CONF=bogus:1 '$<TARGET_FILE:sympool_cli>' replay '${SMALL}' $a 2>&1 >/dev/null | grep -c 'is malformed'; done; PYTORCH_CUDA_ALLOC_CONF=bogus:1 '$<TARGET_FILE:sympool_cli>' replay '${SMALL}' 2>&1 >/dev/null | grep -c 'is malformed'; SYMPOOL_ALLOC_CONF=bogus:1 '$<TARGET_FILE:sympool_cli>' replay '${CMAKE_CURRENT_SOURCE_DIR}/data/trace-start-frames.json' --capacity 1GiB 2>&1 >/dev/null")
  set_tests_properties(cli.replay_env_conf_replaced PROPERTIES LABELS "unit;cli" TIMEOUT 120
    ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "^0\n0\n0\n0\n0\n[^\n]*SYMPOOL WARN [^\n]*SYMPOOL_ALLOC_CONF='bogus:1' is malformed in part [^\n]*that entry is ignored, the others apply\n$")
  # An option that takes a value, given twice: the last one was taken without a word (two
  # --snapshot outputs, one written; two -o charts, one drawn). Refused, naming both.
  sp_cli_check(NAME replay_snapshot_twice RC 2
    REGEX "sympool replay: --snapshot given twice \\('.*a.pickle', then '.*b.json'\\): give it once"
    ARGS replay ${SMALL} --snapshot ${SP_CLI_OUT}/a.pickle -s ${SP_CLI_OUT}/b.json)
  sp_cli_check(NAME replay_conf_twice RC 2 REGEX "--conf given twice"
    ARGS replay ${SMALL} --conf max_split_size_mb:64 --conf=expandable_segments:True)
  # A capacity whose expandable segments (1.125 x it each) this process's address space cannot
  # hold fails saying so; it was counted as OOMs on a device with all of its memory free.
  sp_cli_check(NAME replay_capacity_beyond_address_space RC 1
    REGEX "sympool replay: sp_malloc\\([0-9]+\\): SP_ERR_SYSTEM: host device 0: cannot reserve [0-9]+ bytes of address space"
    ARGS replay ${SMALL} --capacity 1PiB --conf expandable_segments:True)
  # ... and so does one of exabytes: the host device asked the heap for the reservation's page
  # table (a byte per 2 MiB page: 618 GB, 4.3 TB) before the address space, which
  # AddressSanitizer aborts on ("allocation-size-too-big", "out-of-memory").
  foreach(sp_cap IN ITEMS 1EiB 7EiB)
    sp_cli_check(NAME replay_capacity_${sp_cap}_expandable RC 1
      REGEX "sympool replay: sp_malloc\\([0-9]+\\): SP_ERR_SYSTEM: host device 0: cannot reserve [0-9]+ bytes of address space"
      ARGS replay ${SMALL} --capacity ${sp_cap} --conf expandable_segments:True)
  endforeach()
  # A --compare configuration that was accepted but fails to run (the same reservation) is a
  # failure, exit 1 as with --conf: it exited 2, which says the command line was refused.
  sp_cli_check(NAME replay_compare_run_failure RC 1
    REGEX "sympool replay: configuration 'expandable_segments:True': sp_malloc\\([0-9]+\\): SP_ERR_SYSTEM: host device 0: cannot reserve [0-9]+ bytes of address space"
    ARGS replay ${SMALL} --capacity 1PiB --compare max_split_size_mb:64 expandable_segments:True)
  # --capacity caps the process at the capacity only where a GC threshold is in force: the
  # environment's SYMPOOL_GC_THRESHOLD=0 (off) capped it too and changed the result; a --compare
  # item SYMPOOL_GC_THRESHOLD=0.7 did not, unlike the same value from the environment.
  sp_cli_check(NAME replay_capacity_gc_off RC 0 ENV SYMPOOL_GC_THRESHOLD=0
    REGEX "\"peak_reserved_bytes\":314572800,.*\"ooms\":61,"
    ARGS replay ${SMALL} --capacity 300MiB --json)
  sp_cli_check(NAME replay_capacity_gc_env RC 0 ENV SYMPOOL_GC_THRESHOLD=0.7
    REGEX "\"peak_reserved_bytes\":306184192,.*\"ooms\":41,"
    ARGS replay ${SMALL} --capacity 300MiB --json)
  sp_cli_check(NAME replay_capacity_gc_compare_item RC 0
    REGEX "\"peak_reserved_bytes\":306184192,.*\"ooms\":41,"
    ARGS replay ${SMALL} --capacity 300MiB --json --compare SYMPOOL_GC_THRESHOLD=0.7)
  sp_cli_check(NAME replay_capacity_twice RC 2 REGEX "--capacity given twice"
    ARGS replay ${SMALL} --capacity 1GiB --capacity 2GiB)
  sp_cli_check(NAME replay_repeat_twice RC 2 REGEX "--repeat given twice" ARGS replay ${SMALL} -r 2 -r 3)
  sp_cli_check(NAME plot_output_twice RC 2 REGEX "sympool plot: --output given twice"
    ARGS plot ${SMALL} -o ${SP_CLI_OUT}/twice1.svg -o ${SP_CLI_OUT}/twice2.svg)
  sp_cli_check(NAME plot_device_twice RC 2 REGEX "sympool plot: --device given twice"
    ARGS plot ${SMALL} -d 0 -d 1 -o ${SP_CLI_OUT}/twice3.svg)
  sp_cli_check(NAME summary_device_twice RC 2 REGEX "sympool summary: --device given twice"
    ARGS summary -d 0 --device 0 ${SMALL})
  # A bad --conf or --capacity is refused before the trace is read (it was refused after loading
  # it, a while for a large trace): a trace that does not exist shows the order.
  sp_cli_check(NAME replay_bad_conf_first RC 2
    REGEX "sympool replay: --conf 'no_such_key:1' is not valid: unknown key 'no_such_key'"
    ARGS replay ${SP_CLI_OUT}/no-such-trace.pickle --conf no_such_key:1)
  sp_cli_check(NAME replay_bad_capacity_first RC 2
    REGEX "sympool replay: --capacity: SYMPOOL_HOST_CAPACITY='12parsecs' is malformed"
    ARGS replay ${SP_CLI_OUT}/no-such-trace.pickle --capacity 12parsecs)
  # ... and said once: sympool's own WARN line of the refused option came first, then the
  # command's error (also for a configuration of --compare that sympool refuses).
  sp_cli_check(NAME replay_bad_capacity_one_line RC 2
    REGEX "^sympool replay: --capacity: SYMPOOL_HOST_CAPACITY='0' is out of range[^\n]*\n"
    ARGS replay ${SMALL} --capacity 0)
  sp_cli_check(NAME replay_compare_bad_item_one_line RC 2
    REGEX "^sympool replay: configuration 'SYMPOOL_HOST_FAIL_AFTER=x': SYMPOOL_HOST_FAIL_AFTER='x' is malformed[^\n]*\n"
    ARGS replay ${SMALL} --compare SYMPOOL_HOST_FAIL_AFTER=x)
  sp_cli_check(NAME replay_compare_bad_key_one_line RC 2
    REGEX "^sympool replay: configuration 'no_such_key:1': SYMPOOL_ALLOC_CONF=[^\n]*unknown key 'no_such_key'[^\n]*\n"
    ARGS replay ${SMALL} --compare no_such_key:1)
  # An output in a folder that does not exist is refused before the input is read (the replay
  # or the chart was made in full, then the write failed); exit 1, as when the write fails.
  sp_cli_check(NAME replay_snapshot_no_folder RC 1
    REGEX "sympool replay: --snapshot .*/no-such-dir/x.pickle: its folder .*/no-such-dir does not exist"
    ARGS replay ${SP_CLI_OUT}/no-such-trace.pickle --snapshot ${SP_CLI_OUT}/no-such-dir/x.pickle)
  # ... the folder the path expands to: '%r/x.pickle' is the folder 0 here (rank 0 outside a
  # launcher), which exists, while a folder named '%r' does not.
  add_test(NAME cli.replay_snapshot_folder_expanded COMMAND sh -c
    "rm -rf '${SP_CLI_OUT}/expanded' && mkdir -p '${SP_CLI_OUT}/expanded/0' && '$<TARGET_FILE:sympool_cli>' replay '${SMALL}' --snapshot '${SP_CLI_OUT}/expanded/%r/x.pickle' >/dev/null && ls '${SP_CLI_OUT}/expanded/0'")
  set_tests_properties(cli.replay_snapshot_folder_expanded PROPERTIES LABELS "unit;cli"
    TIMEOUT 120 ENVIRONMENT "SYMPOOL_DEVICE=host" PASS_REGULAR_EXPRESSION "^x.pickle\n$")
  # A frame's line that no int holds is PyTorch's "could not tell" (2^64-1) in the replay's own
  # snapshot: cast, 2^31 came back as 2^64-2^31 and 2^32 as 0. 7 and 2^64-1 keep their value.
  add_test(NAME cli.replay_snapshot_frame_lines COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' replay '${CMAKE_CURRENT_SOURCE_DIR}/data/trace-frame-lines.json' --snapshot '${SP_CLI_OUT}/frame-lines.json' >/dev/null && tr -d ' \\n' < '${SP_CLI_OUT}/frame-lines.json' | grep -o 'line.:[0-9]*' | head -4 | cut -d: -f2 | tr '\\n' ' '")
  set_tests_properties(cli.replay_snapshot_frame_lines PROPERTIES LABELS "unit;cli"
    TIMEOUT 60 ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "(^|[^0-9])18446744073709551615 18446744073709551615 7 18446744073709551615 ")
  # plot -o expands OUT as replay --snapshot does (%h, %p, %r; %% a '%'): it took OUT literally,
  # so one pattern named a per-rank snapshot and a chart in a folder named '%r'.
  add_test(NAME cli.plot_output_expanded COMMAND sh -c
    "rm -rf '${SP_CLI_OUT}/plot-expanded' && mkdir -p '${SP_CLI_OUT}/plot-expanded/0' && '$<TARGET_FILE:sympool_cli>' plot '${SMALL}' -o '${SP_CLI_OUT}/plot-expanded/%r/a%%b-%p.svg' && ls '${SP_CLI_OUT}/plot-expanded/0'")
  set_tests_properties(cli.plot_output_expanded PROPERTIES LABELS "unit;cli"
    TIMEOUT 120 ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "wrote [^\n]*/plot-expanded/0/a%b-[0-9]+\\.svg [^\n]*\na%b-[0-9]+\\.svg\n$")
  sp_cli_check(NAME plot_output_no_folder RC 1
    REGEX "sympool plot: -o .*/no-such-dir/x.svg: its folder .*/no-such-dir does not exist"
    ARGS plot ${SP_CLI_OUT}/no-such-trace.pickle -o ${SP_CLI_OUT}/no-such-dir/x.svg)
  # info: every linked library's version.
  set(SP_INFO_RE "versions:\n  sympool [0-9.]+\n")
  if(SP_HAVE_CUDA)
    string(APPEND SP_INFO_RE "  CUDA runtime [0-9]+\\.[0-9]+ \\(built with [0-9.]+\\)[^\n]*\n")
  else()
    string(APPEND SP_INFO_RE "  CUDA not linked[^\n]*\n")
  endif()
  if(SP_HAVE_NCCL)
    string(APPEND SP_INFO_RE "  NCCL 2\\.[0-9]+\\.[0-9]+ \\(built with [0-9.]+\\)\n")
  else()
    string(APPEND SP_INFO_RE "  NCCL not linked\n")
  endif()
  if(SP_HAVE_MPI)
    string(APPEND SP_INFO_RE "  MPI [0-9]\\.[0-9] standard[^\n]*\n")
  else()
    string(APPEND SP_INFO_RE "  MPI not linked[^\n]*\n")
  endif()
  sp_cli_check(NAME info_versions RC 0 REGEX "${SP_INFO_RE}" ARGS info)
  sp_cli_check(NAME info_extra_arg RC 2 REGEX "unexpected argument 'y'" ARGS info x y)
  # summary: the snapshot's end state and the trace's peaks; "-" where a snapshot cannot tell.
  # This trace is partial: the blocks live at its start (300.1 MiB, 21 of them) are not the end
  # state's minus the trace's changes; the peaks count from the loader's starting state, as
  # plot's do (cli.peaks_agree).
  sp_cli_check(NAME summary RC 0
    REGEX "snapshot trace-small-p4.pickle, device 0.*\\| Requested memory      \\|  300\\.1 MiB \\|  441\\.6 MiB \\|  518\\.8 MiB \\|   89\\.7 MiB \\|.*\\| Reserved memory       \\|  320\\.0 MiB \\|  320\\.0 MiB \\|.*\\| Allocations           \\|         21 \\|         56 \\|         88 \\|         37 \\|"
    ARGS summary ${SMALL})
  sp_cli_check(NAME summary_device RC 0 REGEX "device 0" ARGS summary --device=0 ${SMALL})
  sp_cli_check(NAME summary_no_device RC 1 REGEX "has 1 device; no device 3"
    ARGS summary -d 3 ${SMALL})
  sp_cli_check(NAME summary_two_files RC 2 REGEX "give exactly one snapshot"
    ARGS summary ${SMALL} ${SMALL})
endif()

# ---- plot --------------------------------------------------------------
if(TARGET sympool_cli)
  set(BIG ${SP_CLI_TRACE})
  # A small job reads in MiB, with the peak labels inside the frame and blocks named by where
  # they were allocated (never "event N"); a lane's count is a label of its own right of the lane
  # ("12.50 MiB x128" left of it ran past the picture's edge).
  add_test(NAME cli.plot_small_in_mib COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' plot '${SMALL}' -o '${SP_CLI_OUT}/small.svg' && cat '${SP_CLI_OUT}/small.svg'")
  set_tests_properties(cli.plot_small_in_mib PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION ">450 MiB</text>.*peak requested 441.62 MiB</text>.*4 blocks of 12.50 MiB</text>.*forward transformer.py:22</text>.*>12.50 MiB</text>\n<text [^>]*>x4</text>"
    FAIL_REGULAR_EXPRESSION "GiB</text>;from event [0-9]")
  # A requested peak before the first event (a block live at the start, freed by it): the panel
  # of what is live at the peak counts that block, from before the trace (it counted nothing
  # there, and the whole peak as 0 blocks allocated in the trace).
  # An entry whose time_us lies far past the last one's (times out of order: the time axis is
  # chosen from the first and last alone): its x column, a double past INT_MAX converted to int,
  # was undefined behaviour (UBSan: "outside the range of representable values of type 'int'")
  # and its peak marker was drawn off the chart. It lies at the axis' end now.
  sp_cli_check(NAME plot_time_out_of_order RC 0
    REGEX "wrote [^\n]*time_out_of_order.svg \\(device 0: 4 events"
    ARGS plot ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-plot-time-out-of-order.json -o ${SP_CLI_OUT}/time_out_of_order.svg)
  sp_cli_check(NAME plot_time_out_of_order_two RC 0
    REGEX "wrote [^\n]*time_out_of_order_two.svg \\(2 snapshots"
    ARGS plot ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-plot-time-out-of-order.json ${SMALL} -o ${SP_CLI_OUT}/time_out_of_order_two.svg)
  add_test(NAME cli.plot_peak_at_start COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' plot '${CMAKE_CURRENT_SOURCE_DIR}/data/trace-plot-peak-at-start.json' -o '${SP_CLI_OUT}/peak-at-start.svg' >/dev/null && cat '${SP_CLI_OUT}/peak-at-start.svg'")
  set_tests_properties(cli.plot_peak_at_start PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "4.00 MiB in 1 blocks from before the trace.*0 B in 0 blocks allocated in the trace")
  # plot -d N: the subtitle counts device N's segments (it counted every device's: 4 for 3).
  add_test(NAME cli.plot_device_segments COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' plot '${CMAKE_CURRENT_SOURCE_DIR}/data/trace-two-devices.json' -d 1 -o '${SP_CLI_OUT}/two-devices.svg' >/dev/null && cat '${SP_CLI_OUT}/two-devices.svg'")
  set_tests_properties(cli.plot_device_segments PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "8 events, 3 segments at the end")
  # Several snapshots on one chart: the highest and lowest peak marked.
  sp_cli_check(NAME plot_ranks RC 0
    REGEX "wrote .*ranks.svg \\(3 snapshots; highest peak requested: cs336-2.7b-ctx128-forward-bf16 22.234 GiB, lowest: trace-small-p4 0.431 GiB\\)"
    ARGS plot ${BIG} ${SMALL} ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-small-u64.pickle
         --output=${SP_CLI_OUT}/ranks.svg)
  add_test(NAME cli.plot_ranks_marked COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' plot '${SMALL}' '${BIG}' -o '${SP_CLI_OUT}/ranks2.svg' >/dev/null && cat '${SP_CLI_OUT}/ranks2.svg'")
  set_tests_properties(cli.plot_ranks_marked PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "Memory timeline: 2 ranks.*cs336-2.7b-ctx128-forward-bf16: peak 22.23 GiB \\(max\\).*trace-small-p4: peak 441.62 MiB \\(min\\)")
  # A snapshot of state only (no events on any device) is drawn for the first device holding
  # segments: device 1 of the legacy list, not an empty chart of device 0.
  sp_cli_check(NAME plot_state_only_device RC 0
    REGEX "wrote .*state-only.svg \\(device 1: 0 events, peak requested [0-9.]+ GiB, peak reserved [1-9][0-9.]* GiB\\)"
    ARGS plot ${CMAKE_CURRENT_SOURCE_DIR}/data/real/layoutediting-legacy-list.pickle
         -o ${SP_CLI_OUT}/state-only.svg)
  # A trace whose requested bytes rise above its reserved ones says it is partial; a whole one not.
  sp_cli_check(NAME plot_partial_trace RC 0 REGEX "note: a partial trace.*wrote .*partial.svg"
    ARGS plot ${SMALL} -o ${SP_CLI_OUT}/partial.svg)
  add_test(NAME cli.plot_whole_trace_no_note
    COMMAND $<TARGET_FILE:sympool_cli> plot ${BIG} -o ${SP_CLI_OUT}/whole.svg)
  set_tests_properties(cli.plot_whole_trace_no_note PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "wrote " FAIL_REGULAR_EXPRESSION "partial")
  # A full disk leaves the previous chart whole; a FIFO or directory at OUT is refused at once.
  add_test(NAME cli.plot_output_atomic COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/cli/plot_output.sh
    $<TARGET_FILE:sympool_cli> ${SMALL} ${SP_CLI_OUT}/plot_output)
  set_tests_properties(cli.plot_output_atomic PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "plot output ok")
  # An output naming the input (itself, a link, a hard link) is refused; the input stays whole.
  add_test(NAME cli.output_is_not_the_input COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/cli/no_clobber.sh
    $<TARGET_FILE:sympool_cli> ${SMALL} ${SP_CLI_OUT}/no_clobber)
  set_tests_properties(cli.output_is_not_the_input PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "no clobber ok")
  # Killed (SIGINT, SIGTERM, SIGHUP) while writing a snapshot or chart: no temporary left, the
  # previous file whole, death by the same signal. kill_at.c, preloaded, sends the signal at a
  # fixed point of the write.
  add_library(sp_kill_at MODULE ${CMAKE_CURRENT_SOURCE_DIR}/cli/kill_at.c)
  target_link_libraries(sp_kill_at PRIVATE ${CMAKE_DL_LIBS})
  sp_unit_target(sp_kill_at)
  add_test(NAME cli.killed_while_writing COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/cli/killed_while_writing.sh
    $<TARGET_FILE:sympool_cli> $<TARGET_FILE:sp_kill_at> ${SP_CLI_TRACE} ${SP_CLI_OUT}/killed)
  # TIMEOUT 300 (it overrides ctest --timeout): many CLI runs, slow beside a loaded CI build.
  set_tests_properties(cli.killed_while_writing PROPERTIES LABELS "unit;cli" TIMEOUT 300
    PASS_REGULAR_EXPRESSION "killed while writing ok")
  # "-" is standard input for info, replay, summary and plot: the file's output through a pipe.
  add_test(NAME cli.stdin_dash COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/cli/stdin_dash.sh
    $<TARGET_FILE:sympool_cli> ${SMALL} ${SP_CLI_OUT}/stdin_dash)
  set_tests_properties(cli.stdin_dash PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "stdin dash ok")
  # plot given one pipe twice ("- -" through a pipe, "- /dev/stdin") read it once: the second
  # found it empty ("pickle: empty input at offset 0"). A FIFO given twice is refused before it
  # is opened: its first open waits for a writer, and once that writer is done the second open
  # waited for another forever (here no writer comes: `timeout` ends the wait with 124).
  add_test(NAME cli.plot_stream_twice COMMAND sh -c
    "for a in '- -' '- /dev/stdin'; do cat '${SMALL}' | '$<TARGET_FILE:sympool_cli>' plot $a -o '${SP_CLI_OUT}/stream_twice.svg'; echo \"rc=$?\"; done; f='${SP_CLI_OUT}/plot_fifo_twice'; rm -f \"$f\" && mkfifo \"$f\" && timeout 60 '$<TARGET_FILE:sympool_cli>' plot \"$f\" '${SMALL}' \"$f\" -o '${SP_CLI_OUT}/stream_twice.svg'; echo \"rc=$?\"; rm -f \"$f\"; test -e '${SP_CLI_OUT}/stream_twice.svg' && echo written")
  set_tests_properties(cli.plot_stream_twice PROPERTIES LABELS "unit;cli" TIMEOUT 120
    ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "^sympool plot: /dev/stdin \\(snapshot 1\\) and /dev/stdin \\(snapshot 2\\) are one pipe or FIFO, which is read once: give it once\nrc=2\nsympool plot: /dev/stdin \\(snapshot 1\\) and /dev/stdin \\(snapshot 2\\) are one pipe or FIFO, which is read once: give it once\nrc=2\nsympool plot: [^\n]*plot_fifo_twice \\(snapshot 1\\) and [^\n]*plot_fifo_twice \\(snapshot 3\\) are one pipe or FIFO, which is read once: give it once\nrc=2\n$")
  # Output paths refused up front with their reason; an input over 4 GiB refused from its size.
  add_test(NAME cli.output_paths COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/cli/output_paths.sh
    $<TARGET_FILE:sympool_cli> ${SMALL} ${SP_CLI_OUT}/output_paths)
  set_tests_properties(cli.output_paths PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "output paths ok")
  # SYMPOOL_DEBUG_FILE naming what --snapshot or -o writes, compared after %h/%p expansion and
  # before the file exists: refused (the log lines were appended to the written file).
  add_test(NAME cli.debug_file_output COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/cli/debug_file_output.sh
    $<TARGET_FILE:sympool_cli> ${SMALL} ${SP_CLI_OUT}/debug_file_output)
  set_tests_properties(cli.debug_file_output PROPERTIES LABELS "unit;cli" TIMEOUT 120
    PASS_REGULAR_EXPRESSION "debug file output ok")
  # A JSON snapshot saved with a UTF-8 byte order mark (some editors; the memory viewer's
  # browser drops it) is read, from a file and from a stream: it was "not a pickle (nor a JSON
  # snapshot)".
  sp_cli_check(NAME info_json_bom RC 0 REGEX "format: JSON, snapshot"
    ARGS info ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-gc-tiny-bom.json)
  add_test(NAME cli.summary_json_bom_stream COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' summary /dev/stdin < '${CMAKE_CURRENT_SOURCE_DIR}/data/trace-gc-tiny-bom.json'; echo rc=$?")
  set_tests_properties(cli.summary_json_bom_stream PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "snapshot stdin, device 0.*rc=0")
  # A pickle behind a byte order mark is refused naming the mark, not as "byte 0x80, which is
  # no pickle opcode (a pickle of protocol 2-5 starts with 0x80)".
  add_test(NAME cli.info_pickle_bom COMMAND sh -c
    "(printf '\\357\\273\\277'; cat '${SMALL}') > '${SP_CLI_OUT}/bom.pickle' && '$<TARGET_FILE:sympool_cli>' info '${SP_CLI_OUT}/bom.pickle' 2>&1; echo rc=$?")
  set_tests_properties(cli.info_pickle_bom PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "starts with a UTF-8 byte order mark.*rc=1"
    FAIL_REGULAR_EXPRESSION "byte 0x80, which is no pickle opcode")
  # So is one behind white space, from a file and from a stream alike: it was "it starts with
  # byte 0x80, which is no pickle opcode".
  add_test(NAME cli.info_pickle_white_space COMMAND sh -c
    "(printf ' \\n'; cat '${SMALL}') > '${SP_CLI_OUT}/ws.pickle' && '$<TARGET_FILE:sympool_cli>' info '${SP_CLI_OUT}/ws.pickle' 2>&1; echo rc=$?; cat '${SP_CLI_OUT}/ws.pickle' | '$<TARGET_FILE:sympool_cli>' info /dev/stdin 2>&1; echo rc=$?")
  set_tests_properties(cli.info_pickle_white_space PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "ws.pickle: not a pickle \\(nor a JSON snapshot\\): it starts with white space, which no pickle does, and then byte 0x80 \\(at offset 2\\), which starts no JSON document\nrc=1\n.*stdin: not a pickle \\(nor a JSON snapshot\\): it starts with white space, which no pickle does, and then byte 0x80 \\(at offset 2\\), which starts no JSON document\nrc=1"
    FAIL_REGULAR_EXPRESSION "which is no pickle opcode")
  sp_cli_check(NAME plot_png_refused RC 2 REGEX "writes SVG only, not '.*x.png'"
    ARGS plot ${SMALL} -o ${SP_CLI_OUT}/x.png)
  sp_cli_check(NAME plot_no_output RC 2 REGEX "no -o OUT.svg given" ARGS plot ${SMALL})
  sp_cli_check(NAME plot_bad_device RC 1 REGEX "device 5 not in the snapshot \\(1 device\\)"
    ARGS plot ${SMALL} -d 5 -o ${SP_CLI_OUT}/d5.svg)
  sp_cli_check(NAME plot_not_a_pickle RC 1 REGEX "not a pickle"
    ARGS plot ${PROJECT_SOURCE_DIR}/README.md -o ${SP_CLI_OUT}/readme.svg)
  # The snapshot with 2^64-1 line numbers plots; its frames show no line rather than a bogus one.
  add_test(NAME cli.plot_u64_lines COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' plot '${CMAKE_CURRENT_SOURCE_DIR}/data/trace-small-u64.pickle' -o '${SP_CLI_OUT}/u64.svg' && cat '${SP_CLI_OUT}/u64.svg'")
  set_tests_properties(cli.plot_u64_lines PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "peak requested 441.62 MiB" FAIL_REGULAR_EXPRESSION "18446744073709551615")
  sp_cli_check(NAME summary_u64 RC 0 REGEX "Allocations           \\|         21 \\|"
    ARGS summary ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-small-u64.pickle)
  sp_cli_check(NAME replay_u64 RC 0 REGEX "\"events\":104," ARGS replay --json
    ${CMAKE_CURRENT_SOURCE_DIR}/data/trace-small-u64.pickle)
endif()

# Real traces of other people's runs (tests/data/real/SOURCES.md): the replay rebuilds the starting
# state and replays the user's empty_cache calls.
if(TARGET sympool_cli)
  set(SP_DATA ${CMAKE_CURRENT_SOURCE_DIR}/data)
  # 28 empty_cache calls: replayed (each releases the cached segments: the recorded run's 420
  # segment frees), with the segments where the recorded run had them: its peak to the byte.
  add_test(NAME cli.replay_empty_cache
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/real/sqattn-empty-cache.pickle --json)
  set_tests_properties(cli.replay_empty_cache PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "\"peak_reserved_bytes\":5802819584,\"pytorch_peak_reserved_bytes\":5802819584,.*\"num_device_free\":420,.*\"empty_caches\":28,")
  # State-only snapshots (no trace): the starting state is the snapshot, to the byte.
  add_test(NAME cli.replay_state_only
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/real/attention-state-only.pickle --json)
  set_tests_properties(cli.replay_state_only PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "\"peak_reserved_bytes\":16236150784,\"pytorch_peak_reserved_bytes\":16236150784,")
  add_test(NAME cli.replay_legacy_list
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/real/layoutediting-legacy-list.pickle)
  set_tests_properties(cli.replay_legacy_list PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "settings +defaults \\(the snapshot records none\\).*peak reserved +3.398 GiB +recorded run: 3.398 GiB \\(\\+0.00%\\)")
  # A snapshot without settings replays with the environment's allocator settings where it sets
  # them: the text said "defaults (the snapshot records none)" and --json "conf":"" of a replay
  # that ran under expandable segments (its starting state requested).
  add_test(NAME cli.replay_env_conf_reported COMMAND sh -c
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True '$<TARGET_FILE:sympool_cli>' replay '${SP_DATA}/real/layoutediting-legacy-list.pickle' && SYMPOOL_ALLOC_CONF=expandable_segments:True PYTORCH_ALLOC_CONF=max_split_size_mb:64 '$<TARGET_FILE:sympool_cli>' replay '${SP_DATA}/real/layoutediting-legacy-list.pickle' --json")
  set_tests_properties(cli.replay_env_conf_reported PROPERTIES LABELS "unit;cli" TIMEOUT 60
    ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "settings +the environment's PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True' \\(the snapshot records none\\).*\"conf\":\"expandable_segments:True\",\"settings\":\"expandable_segments:True\",.*\"starting_state\":\"requested\"")
  # ... and the allocator's own variables the environment sets, which win over ALLOC_CONF's
  # keys: SYMPOOL_EXPANDABLE_SEGMENTS=1 replayed under expandable segments (the starting state
  # requested) while the text said "defaults" and --json "settings":"" (--compare too).
  add_test(NAME cli.replay_env_options_reported COMMAND sh -c
    "SYMPOOL_EXPANDABLE_SEGMENTS=1 '$<TARGET_FILE:sympool_cli>' replay '${SP_DATA}/real/layoutediting-legacy-list.pickle' && SYMPOOL_EXPANDABLE_SEGMENTS=1 '$<TARGET_FILE:sympool_cli>' replay '${SP_DATA}/real/layoutediting-legacy-list.pickle' --json --compare '' max_split_size_mb:64")
  set_tests_properties(cli.replay_env_options_reported PROPERTIES LABELS "unit;cli" TIMEOUT 60
    ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "environment +SYMPOOL_EXPANDABLE_SEGMENTS=on \\(each wins over its key in the settings\\).*\"settings\":\"SYMPOOL_EXPANDABLE_SEGMENTS=on\",.*\"starting_state\":\"requested\".*\"settings\":\"max_split_size_mb:64,SYMPOOL_EXPANDABLE_SEGMENTS=on\"")
  # --compare=CONF is the first configuration, as every option takes --opt=value: it was
  # refused ("option '--compare' takes no value"). Both forms give the same two lines.
  add_test(NAME cli.replay_compare_equals_form COMMAND sh -c
    "x=$('$<TARGET_FILE:sympool_cli>' replay '${SMALL}' --compare=expandable_segments:True max_split_size_mb:20 --json) && y=$('$<TARGET_FILE:sympool_cli>' replay '${SMALL}' --compare expandable_segments:True max_split_size_mb:20 --json) && [ \"$(printf '%s' \"$x\" | sed 's/ns_per_event[^,]*//g')\" = \"$(printf '%s' \"$y\" | sed 's/ns_per_event[^,]*//g')\" ] && printf '%s\\n' \"$x\" | grep -c 'conf.:.\\(expandable_segments:True\\|max_split_size_mb:20\\).,'")
  set_tests_properties(cli.replay_compare_equals_form PROPERTIES LABELS "unit;cli" TIMEOUT 60
    ENVIRONMENT "SYMPOOL_DEVICE=host" PASS_REGULAR_EXPRESSION "^2\n$")
  # --capacity with a garbage_collection_threshold caps the process just under the device so
  # that the threshold acts; a per_process_memory_fraction the configuration sets, lower, is the
  # cap (80 MiB of 320: the third 30 MiB request is an OOM): it was replaced, and the replay
  # peaked at 130 MiB with no OOM.
  add_test(NAME cli.replay_gc_keeps_the_confs_fraction
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/trace-gc-tiny.json --json --capacity=320MiB
            --conf=garbage_collection_threshold:0.5,per_process_memory_fraction:0.25)
  set_tests_properties(cli.replay_gc_keeps_the_confs_fraction PROPERTIES LABELS "unit;cli"
    TIMEOUT 60 ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "\"peak_reserved_bytes\":62914560,.*\"ooms\":1,")
  # summary's allocated peaks of a recording made with expandable segments come from a replay by
  # PyTorch's rules (small requests in the small pool's segments), as replay re-enacts it: with
  # ours the large pool peaked at 27.1 MiB and the small pool at 0 B below its 2.1 MiB current.
  add_test(NAME cli.summary_expandable_peaks_by_pytorchs_rules
    COMMAND $<TARGET_FILE:sympool_cli> summary ${SP_DATA}/trace-expandable-pools.json)
  set_tests_properties(cli.summary_expandable_peaks_by_pytorchs_rules PROPERTIES
    LABELS "unit;cli" TIMEOUT 60 ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "Allocated memory +\\| +27.1 MiB \\| +27.1 MiB \\|[^\n]*\n[^\n]*from large pool \\| +25.0 MiB \\| +25.0 MiB \\|[^\n]*\n[^\n]*from small pool \\| +2.1 MiB \\| +2.1 MiB \\|")
  # A free the final state shows pending, with no free_completed after it (the trace ended
  # first), is held to the end: replay freed it at once, the next 10 MiB request reused it, and
  # the peak was a segment short of the recorded 20 MiB (its own snapshot's round trip too).
  add_test(NAME cli.replay_free_held_to_the_end
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/trace-held-to-the-end.json --json)
  set_tests_properties(cli.replay_free_held_to_the_end PROPERTIES LABELS "unit;cli" TIMEOUT 60
    ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "\"peak_reserved_bytes\":20971520,\"pytorch_peak_reserved_bytes\":20971520,.*\"end_reserved_bytes\":20971520,.*\"deferred_frees\":1,")
  # PyTorch counts a block out of its allocations at the free request and out of its requested
  # bytes when the free completes (free_block): a pending block at the start counted as an
  # allocation (peak 3, not 2) and not as requested bytes (26 MiB, not 32), and a held free's
  # requested bytes were taken off at its request (peak 10 MiB, not 20; plot's too).
  add_test(NAME cli.summary_requested_until_the_free_completes COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' summary '${SP_DATA}/trace-pending-at-start.json' && '$<TARGET_FILE:sympool_cli>' summary '${SP_DATA}/trace-held-free.json' && '$<TARGET_FILE:sympool_cli>' info --json '${SP_DATA}/trace-held-free.json' && '$<TARGET_FILE:sympool_cli>' plot '${SP_DATA}/trace-held-free.json' -o '${SP_CLI_OUT}/held-free.svg'")
  set_tests_properties(cli.summary_requested_until_the_free_completes PROPERTIES
    LABELS "unit;cli" TIMEOUT 60 ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "Requested memory +\\| +32.0 MiB \\| +32.0 MiB \\| +40.0 MiB \\| +8.0 MiB \\|.*Allocations +\\| +2 \\| +2 \\| +3 \\| +1 \\|.*Requested memory +\\| +0 B +\\| +20.0 MiB \\|.*\"peak_bytes\": 20971520.*peak requested 0.020 GiB")
  # A --compare configuration that adds items to a recording made with expandable segments asks
  # what sympool's rules would do, as --conf does, from the same starting state (the live blocks
  # requested): it started from PyTorch's recorded pages, 43132125184 bytes against --conf's
  # 42540728320 for the same configuration.
  add_test(NAME cli.replay_compare_item_starts_as_conf_does COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' replay '${SP_DATA}/real/bolong-expandable-recorded.pickle' --json --compare '' expandable_segments:True && '$<TARGET_FILE:sympool_cli>' replay '${SP_DATA}/real/bolong-expandable-recorded.pickle' --json --conf expandable_segments:True")
  set_tests_properties(cli.replay_compare_item_starts_as_conf_does PROPERTIES LABELS "unit;cli"
    TIMEOUT 120 ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "^[^\n]*\"peak_reserved_bytes\":43132125184,[^\n]*\"starting_state\":\"recorded_segments\"[^\n]*\n[^\n]*\"peak_reserved_bytes\":42540728320,[^\n]*\"conf\":\"expandable_segments:True\"[^\n]*\"starting_state\":\"requested\"[^\n]*\n[^\n]*\"peak_reserved_bytes\":42540728320,[^\n]*\"starting_state\":\"requested\"")
  # The mark of a held free's completion shares no bit with the loader's checks: device 1's list
  # holds the same entry dict (the pickle memo) as device 0's, whose analysis marked it, and a
  # mark in the loader's stream bit read as "'stream' is not an integer" there.
  sp_cli_check(NAME info_shared_held_entry RC 0 REGEX "devices: 2 with data"
    ARGS info ${SP_DATA}/memo/trace-shared-held-entry.pickle)
  # The replay's own OOMs (at --capacity) were blamed on the recorded run, which had none.
  add_test(NAME cli.replay_capacity_ooms_are_the_replays
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SMALL} --capacity 100MiB --json)
  set_tests_properties(cli.replay_capacity_ooms_are_the_replays PROPERTIES LABELS "unit;cli"
    TIMEOUT 60 ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "\"recorded_ooms\":0,.*\"differs_because\":\"the replay hit 70 OOMs at the emulated device's capacity, where the recorded run hit 0 "
    FAIL_REGULAR_EXPRESSION "the recorded run hit OOM")
  # A trace recorded with _record_memory_history(skip_actions=["segment_free"]): the 30 MiB
  # segment was released (empty_cache) with no entry for it, so the replay keeps it and reserves
  # 80 MiB where PyTorch had 50; the reason given was only "the allocators chose differently".
  add_test(NAME cli.replay_says_segment_frees_are_missing COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' replay '${SP_DATA}/trace-skip-segment-free.json' --json && '$<TARGET_FILE:sympool_cli>' info '${SP_DATA}/trace-skip-segment-free.json'")
  set_tests_properties(cli.replay_says_segment_frees_are_missing PROPERTIES LABELS "unit;cli"
    TIMEOUT 60 ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "\"peak_reserved_bytes\":83886080,\"pytorch_peak_reserved_bytes\":52428800,.*\"differs_because\":\"segments of at least 0.029 GiB were released with no segment_free or segment_unmap entry.*segments of at least 0.029 GiB released with no segment_free")
  # Recorded with skip_actions=["segment_alloc"]: segment A freed twice with no segment_alloc
  # between. Walked back, PyTorch's reserved bytes count it twice (60 MiB, where the run had 40
  # at most); the reason given was only "an inconsistent trace". replay and info say what is
  # missing, and how much.
  add_test(NAME cli.replay_says_segment_allocs_are_missing COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' replay '${SP_DATA}/trace-skip-segment-alloc.json' --json && '$<TARGET_FILE:sympool_cli>' info '${SP_DATA}/trace-skip-segment-alloc.json'")
  set_tests_properties(cli.replay_says_segment_allocs_are_missing PROPERTIES LABELS "unit;cli"
    TIMEOUT 60 ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "\"differs_because\":\"1 segment_free [(]0.020 GiB[)] of segments freed already, with no segment_alloc since: segment_alloc entries are missing.*\n  1 segment_free [(]0.020 GiB[)] of segments freed already, with no segment_alloc since: segment_alloc entries are missing")
  # Recorded with skip_actions=["alloc"]: a 30 MiB block freed twice in a segment the trace made,
  # no alloc before either free: both read as blocks live before the first entry, and the reason
  # given was only "an inconsistent trace".
  add_test(NAME cli.replay_says_allocs_are_missing COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' replay '${SP_DATA}/trace-skip-alloc.json' --json && '$<TARGET_FILE:sympool_cli>' info '${SP_DATA}/trace-skip-alloc.json' && '$<TARGET_FILE:sympool_cli>' info --json '${SP_DATA}/trace-skip-alloc.json'")
  set_tests_properties(cli.replay_says_allocs_are_missing PROPERTIES LABELS "unit;cli"
    TIMEOUT 60 ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "\"differs_because\":\"2 frees [(]0.059 GiB[)] of blocks no alloc entry made cannot have been live before the first entry.*alloc entries are missing.*\n  2 frees [(]0.059 GiB[)] of blocks no alloc entry made that cannot have been live.*\"missing_entries\": {[^}]*\"allocs\": 2,[^}]*\"alloc_bytes\": 62914560,[^}]*\"segment_allocs\": 0,")
  # With max_split_size recorded, every run of segment frees before a segment allocation was read
  # as a release inside that malloc, so the user's empty_cache (its 20 MiB segment, under the
  # 64 MiB max_split_size that release_available_cached_blocks frees at least) was not replayed:
  # 50 MiB reserved where PyTorch had 30.
  add_test(NAME cli.replay_empty_cache_under_max_split_size COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' replay '${SP_DATA}/trace-split-empty-cache.json' --json && '$<TARGET_FILE:sympool_cli>' info '${SP_DATA}/trace-split-empty-cache.json'")
  set_tests_properties(cli.replay_empty_cache_under_max_split_size PROPERTIES LABELS "unit;cli"
    TIMEOUT 60 ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "\"peak_reserved_bytes\":31457280,\"pytorch_peak_reserved_bytes\":31457280,.*\"empty_caches\":1,.*empty_cache calls: 1. frees held for other streams: 0. releases inside malloc: 0 segment frees")
  # An empty_cache that frees only segments of max_split_size or more, on the stream of the next
  # segment allocation: release_available_cached_blocks frees one segment, or several largest
  # first, each under the request; empty_cache frees them in the pool's order, smallest first
  # (100 MiB, then 120). Read as a release inside malloc it kept both: 470 MiB, not 250.
  add_test(NAME cli.replay_empty_cache_of_oversize_segments
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/trace-split-empty-cache-oversize.json --json)
  set_tests_properties(cli.replay_empty_cache_of_oversize_segments PROPERTIES LABELS "unit;cli"
    TIMEOUT 60 ENVIRONMENT "SYMPOOL_DEVICE=host"
    PASS_REGULAR_EXPRESSION "\"peak_reserved_bytes\":262144000,\"pytorch_peak_reserved_bytes\":262144000,.*\"empty_caches\":1,")
  # What release_available_cached_blocks does free stays a release inside malloc: 120 MiB, then
  # 100, both under the 150 MiB request, before its segment.
  sp_cli_check(NAME info_release_in_malloc_under_max_split_size RC 0
    REGEX "empty_cache calls: 0. frees held for other streams: 0. releases inside malloc: 2 segment frees"
    ARGS info ${SP_DATA}/trace-split-release-in-malloc.json)
  # torch 2.11's own snapshot (bench/gpu/probe.py on an H200): a private MemPool's blocks go to
  # its pool by their segments' segment_pool_id (2.11 writes no pool id on trace entries), the
  # second stream's 1000 bytes to a segment of its own: PyTorch's 44 MiB to the byte.
  add_test(NAME cli.replay_torch_2_11
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/real/torch-2.11-probe.pickle --json)
  set_tests_properties(cli.replay_torch_2_11 PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "\"peak_reserved_bytes\":46137344,\"pytorch_peak_reserved_bytes\":46137344,.*\"num_device_alloc\":4,")
  # --compare starts every configuration from the snapshot's settings: this trace records
  # expandable segments, where the 40 MiB request reuses the two freed 30 MiB blocks' pages, and
  # a configuration's items are added to them. The recorded settings alone re-enact PyTorch's
  # rules (100 MiB: 20 MiB units for 90 MiB of blocks); with an item added sympool's rules map
  # 2 MiB pages (90 MiB).
  add_test(NAME cli.replay_compare_recorded COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' replay '${SP_DATA}/trace-expandable-tiny.json' --json --compare '' garbage_collection_threshold:0.5 2>&1; echo rc=$?")
  set_tests_properties(cli.replay_compare_recorded PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "^\\{[^\n]*\"peak_reserved_bytes\":104857600,[^\n]*\"conf\":\"\",\"settings\":\"expandable_segments:True\"[^\n]*\n\\{[^\n]*\"peak_reserved_bytes\":94371840,[^\n]*\"settings\":\"expandable_segments:True,garbage_collection_threshold:0.5\"[^\n]*\nrc=0")
  # --conf replaces the recorded settings as the base, and the table says which were used.
  add_test(NAME cli.replay_compare_conf_base COMMAND sh -c
    "'$<TARGET_FILE:sympool_cli>' replay '${SP_DATA}/trace-expandable-tiny.json' --conf expandable_segments:False --compare '' 2>&1; echo rc=$?")
  set_tests_properties(cli.replay_compare_conf_base PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "settings: --conf 'expandable_segments:False'.*\n  \\(--conf\\) +0.127 .*rc=0")
  # A small peak (108,275,712 bytes allocated): 1.01 x that is 52 pages of 2 MiB with 0.74 MiB
  # to spare, so expandable segments (defaults) must pack the small and the large blocks into
  # shared pages: 52 pages (109,051,904 bytes); small pages of their own make it 53 (1.0265).
  add_test(NAME cli.replay_small_peak_pages
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/real/eor-nn-small-peak.pickle
            --conf expandable_segments:True --json)
  set_tests_properties(cli.replay_small_peak_pages PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "\"peak_allocated_bytes\":108275712,\"peak_reserved_bytes\":109051904,")
  # A training run's recording (CS336 medium model) that starts mid-run: 664 live blocks, then
  # 4 and 16 MiB blocks packed after odd-sized ones, freed and recycled. With the defaults the
  # blocks of whole pages go on page boundaries: apart from the others while the pool fills
  # (WHOLE), at page boundaries when they grow it later (ALIGN), at the page-aligned end of the
  # cached ranges they are cut from (FIT_END): 7,021,264,896 bytes at the peak (1.0011 x the peak
  # allocated). With ALIGN alone (WHOLE=0, FIT_END=0, and ALIGN_SKIP at half a page, as ALIGN
  # was measured) the starting state's offsets stay with the blocks cut from its ranges:
  # 7,050,625,024 (1.0053; 7,126,122,496 with ALIGN_SKIP's default quarter page); packed after the
  # odd ones as well (SYMPOOL_EXPANDABLE_ALIGN=0) each of the 67 mapped runs at the peak holds
  # about a page of slivers: 7,138,705,408 (1.0179).
  add_test(NAME cli.replay_training_aligned_pages
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/real/wedsonlin-training-aligned-pages.pickle
            --conf expandable_segments:True --json)
  set_tests_properties(cli.replay_training_aligned_pages PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "\"peak_allocated_bytes\":7013335552,\"peak_reserved_bytes\":7021264896,")
  add_test(NAME cli.replay_training_align_only
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/real/wedsonlin-training-aligned-pages.pickle
            --conf expandable_segments:True --json)
  set_tests_properties(cli.replay_training_align_only PROPERTIES LABELS "unit;cli" TIMEOUT 60
    ENVIRONMENT "SYMPOOL_EXPANDABLE_FIT_END=0;SYMPOOL_EXPANDABLE_WHOLE=0;SYMPOOL_EXPANDABLE_ALIGN_SKIP=0.5"
    PASS_REGULAR_EXPRESSION "\"peak_allocated_bytes\":7013335552,\"peak_reserved_bytes\":7050625024,")
  # Replayed with its recorded settings (fixed segments) the training recording keeps PyTorch's
  # 377 starting segments, 1.0297 x the peak allocated before the first event: the replay says
  # that this, not the trace, sets the peak reserved.
  add_test(NAME cli.replay_lower_bound
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/real/wedsonlin-training-aligned-pages.pickle)
  set_tests_properties(cli.replay_lower_bound PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "peak reserved +6.738 GiB[^\n]*\n  lower bound +6.738 GiB reserved \\(1.0297 x the peak allocated\\) before the first event: the starting state's recorded segments")
  # A recording made with expandable segments (PyTorch's rules) that starts with 40.170 GiB
  # mapped for a 39.616 GiB peak allocated (1.0140: freed 20 MiB units PyTorch kept mapped).
  # Without --conf the replay re-enacts the recorded run from those pages; with --conf
  # expandable_segments:True (our rules on) its live blocks are requested, as for a change of
  # segment kind, and the peak is what our rules reserve: 42,540,728,320 bytes (1.0001), not
  # 43,132,125,184 (PyTorch's pages); with PyTorch's rules (PAGE, RECYCLE, BORROW at 0) the
  # recorded pages are kept.
  add_test(NAME cli.replay_expandable_recorded_own
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/real/bolong-expandable-recorded.pickle --json)
  set_tests_properties(cli.replay_expandable_recorded_own PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "\"peak_reserved_bytes\":43132125184,\"pytorch_peak_reserved_bytes\":43132125184,.*\"starting_state\":\"recorded_segments\"")
  add_test(NAME cli.replay_expandable_recorded_conf
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/real/bolong-expandable-recorded.pickle
            --conf expandable_segments:True --json)
  set_tests_properties(cli.replay_expandable_recorded_conf PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "\"peak_allocated_bytes\":42537453568,\"peak_reserved_bytes\":42540728320,.*\"starting_state\":\"requested\"")
  add_test(NAME cli.replay_expandable_recorded_conf_text
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/real/bolong-expandable-recorded.pickle
            --conf expandable_segments:True)
  set_tests_properties(cli.replay_expandable_recorded_conf_text PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "starting state +its live blocks requested under this configuration \\(the recorded segment layout is expandable segments by PyTorch's rules, replayed by ours\\): 294 blocks")
  add_test(NAME cli.replay_expandable_recorded_pytorch_rules
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/real/bolong-expandable-recorded.pickle
            --conf expandable_segments:True --json)
  set_tests_properties(cli.replay_expandable_recorded_pytorch_rules PROPERTIES LABELS "unit;cli" TIMEOUT 60
    ENVIRONMENT "SYMPOOL_EXPANDABLE_PAGE=0;SYMPOOL_EXPANDABLE_RECYCLE=0;SYMPOOL_EXPANDABLE_BORROW=0"
    PASS_REGULAR_EXPRESSION "\"peak_reserved_bytes\":43132125184,\"pytorch_peak_reserved_bytes\":43132125184,.*\"starting_state\":\"recorded_segments\"")
  # A forward pass of a small CS336 model recorded from an empty cache (2304 entries): replayed
  # with its settings (fixed segments) the replay makes PyTorch's 31 segments and its peak.
  add_test(NAME cli.replay_fresh_run_segments
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/real/niu-forward-odd-sizes.pickle --json)
  set_tests_properties(cli.replay_fresh_run_segments PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "\"peak_reserved_bytes\":463470592,\"pytorch_peak_reserved_bytes\":463470592,.*\"num_device_alloc\":31,\"num_device_free\":0,")
  # The same with expandable segments (defaults): 421,527,552 bytes for a 412,652,032-byte peak
  # allocated, 1.0215, over issue 25's 1.01 (PyTorch's expandable rules: higher). Odd sizes (5.127,
  # 6.104, 1.953 MiB) cut from one another's freed ranges leave pieces under a page between live
  # blocks. ALIGN would skip 0.873 MiB before each 5.127 MiB block, activations that live
  # through the peak: ALIGN_SKIP (a quarter page) packs them (with
  # SYMPOOL_EXPANDABLE_ALIGN_SKIP=0.5, half a page, the rule before it: 427,819,008, 1.0368).
  # Pinned so that a change of placement shows here; not yet within 1.01.
  add_test(NAME cli.replay_odd_sizes_expandable
    COMMAND $<TARGET_FILE:sympool_cli> replay ${SP_DATA}/real/niu-forward-odd-sizes.pickle
            --conf expandable_segments:True --json)
  set_tests_properties(cli.replay_odd_sizes_expandable PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "\"peak_allocated_bytes\":412652032,\"peak_reserved_bytes\":421527552,")
  add_test(NAME cli.info_trace
    COMMAND $<TARGET_FILE:sympool_cli> info ${SP_DATA}/real/sqattn-empty-cache.pickle)
  set_tests_properties(cli.info_trace PROPERTIES LABELS "unit;cli" TIMEOUT 60
    PASS_REGULAR_EXPRESSION "format: pickle protocol 4, snapshot with allocator_settings.*segment_alloc 420, segment_free 420.*empty_cache calls: 28.*starting state: 4 segments")
  # The CLI links neither NCCL nor MPI; info gives their versions all the same, and says so where
  # a library by their soname has none (tests/cli/cli_libraries.sh).
  add_library(sp_no_symbols MODULE ${CMAKE_CURRENT_SOURCE_DIR}/cli/no_symbols.c)
  sp_unit_target(sp_no_symbols)
  add_test(NAME cli.libraries_loaded_by_info COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/cli/cli_libraries.sh
    $<TARGET_FILE:sympool_cli> $<TARGET_FILE:sp_no_symbols> "${SP_NCCL_SONAME}" "${SP_MPI_SONAME}"
    ${SP_CLI_OUT}/libraries)
  set_tests_properties(cli.libraries_loaded_by_info PROPERTIES LABELS "unit;cli"
    TIMEOUT 60 PASS_REGULAR_EXPRESSION "cli libraries ok")
  # info --json: the text's facts, field by field, for the library and five snapshots; failures
  # leave stdout empty.
  if(Python3_Interpreter_FOUND)
    add_test(NAME cli.info_json
      COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/cli/info_json.py
              $<TARGET_FILE:sympool_cli> ${SP_DATA})
    set_tests_properties(cli.info_json PROPERTIES LABELS "unit;cli;python" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "info-json: ok")
  endif()
  # summary and plot: the same requested and reserved peaks as the loader's exact ones, on
  # whole, partial and state-only snapshots.
  if(Python3_Interpreter_FOUND)
    add_test(NAME cli.peaks_agree
      COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/cli/peaks_agree.py
              $<TARGET_FILE:sympool_cli> ${SP_DATA} ${SP_CLI_OUT})
    set_tests_properties(cli.peaks_agree PROPERTIES LABELS "unit;cli;python" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "peaks-agree: ok")
    # The replay ends in the recorded segment layout, at the recorded addresses shifted by one
    # constant (sp_x_host_place).
    add_test(NAME cli.replay_layout
      COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/cli/replay_layout.py
              $<TARGET_FILE:sympool_cli> ${SP_DATA} ${SP_CLI_OUT})
    set_tests_properties(cli.replay_layout PROPERTIES LABELS "unit;cli;python" TIMEOUT 120
      PASS_REGULAR_EXPRESSION "replay-layout: ok")
    # A replay's own snapshot against the trace it replayed: the trace's external_annotations
    # and recorded times (annotations), every entry of the allocator's own (segments,
    # completions) its recorded time (times), the starting segments' own stacks (start_frames),
    # a frame's line PyTorch could not tell, 2^64-1, as it is (frame_lines), inactive blocks'
    # requested sizes, the starting state's too (requested), a free recorded with no frames
    # with none, not its allocation's (free_frames), stacks deeper than 256 frames whole
    # (deep_stacks). Each script prints
    # "replay-<name with dashes>: ok".
    foreach(name annotations times start_frames frame_lines requested free_frames deep_stacks)
      string(REPLACE "_" "-" tag "replay-${name}")
      add_test(NAME cli.replay_${name}
        COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/cli/replay_${name}.py
                $<TARGET_FILE:sympool_cli> ${SP_DATA} ${SP_CLI_OUT})
      set_tests_properties(cli.replay_${name} PROPERTIES LABELS "unit;cli;python" TIMEOUT 120
        PASS_REGULAR_EXPRESSION "${tag}: ok")
    endforeach()
  endif()
  add_test(NAME cli.info_trace_missing
    COMMAND $<TARGET_FILE:sympool_cli> info ${SP_DATA}/does-not-exist.pickle)
  set_tests_properties(cli.info_trace_missing PROPERTIES LABELS "unit;cli" TIMEOUT 60 WILL_FAIL TRUE)
endif()
