"""record_memory_history with PyTorch's meanings, Python frames, snapshots."""

import json
import pickle

import pytest


def _alloc_here(sp, n):
    return sp.malloc(n)  # the frame the trace must name


def test_records_python_frames(sp):
    sp.record_memory_history()
    p = _alloc_here(sp, 7000)
    snap = sp.snapshot()
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc" and e["size"] == 7000]
    assert allocs, snap["device_traces"][0]
    names = [f["name"] for f in allocs[-1]["frames"]]
    assert names[0] == "_alloc_here"  # innermost first, sympool's own frames left out
    assert "test_records_python_frames" in names
    assert allocs[-1]["frames"][0]["filename"].endswith("test_history.py")
    sp.free(p)
    frees = [e for e in sp.snapshot()["device_traces"][0] if e["action"].startswith("free")]
    assert frees and frees[-1]["frames"]  # context "all": a stack at each free too


def test_frames_keep_a_file_name_python_holds_with_lone_surrogates(sp):
    # A file name with bytes that are not UTF-8 is a str with lone surrogates in Python
    # ('surrogateescape'); the snapshot holds that str (it held '?' for each).
    name = "odd\udcff\udc80.py"
    code = compile("def alloc(sp, n):\n    return sp.malloc(n)\n", name, "exec")
    scope = {}
    exec(code, scope)
    sp.record_memory_history()
    p = scope["alloc"](sp, 7100)
    snap = sp.snapshot()
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc" and e["size"] == 7100]
    assert allocs and allocs[-1]["frames"][0]["filename"] == name, allocs
    sp.free(p)


def test_context_none_records_no_frames(sp):
    sp.record_memory_history(context=None)
    p = sp.malloc(9000)
    ev = [e for e in sp.snapshot()["device_traces"][0] if e["action"] == "alloc"]
    assert ev and not ev[-1].get("frames")
    sp.free(p)


def test_max_entries_and_stop(sp):
    sp.record_memory_history(max_entries=3)
    ps = [sp.malloc(512) for _ in range(10)]
    for p in ps:
        sp.free(p)
    trace = sp.snapshot()["device_traces"][0]
    assert len(trace) <= 4  # 3 entries (+ this snapshot's marker)
    sp.record_memory_history(enabled=None)
    assert sp.snapshot()["device_traces"][0] == []


def test_max_entries_zero_keeps_one_entry_as_torch(sp):
    # torch's ring keeps max(1, max_entries) entries; the C API's 0 (no bound) must not leak in.
    sp.record_memory_history(max_entries=0)
    ps = [sp.malloc(512) for _ in range(10)]
    for p in ps:
        sp.free(p)
    actions = [e["action"] for e in sp.snapshot()["device_traces"][0]]
    assert 1 <= len(actions) <= 2, actions  # 1 entry (+ this snapshot's marker)
    sp.record_memory_history(enabled=None)


def test_state_keeps_live_block_stacks(sp):
    sp.record_memory_history(enabled="state", context="state")
    p = _alloc_here(sp, 11000)
    snap = sp.snapshot()
    blocks = [b for s in snap["segments"] for b in s["blocks"] if b.get("requested_size") == 11000]
    assert blocks and blocks[0]["frames"][0]["name"] == "_alloc_here"
    sp.free(p)


def test_c_stacks(sp):
    sp.record_memory_history(stacks="all")
    p = _alloc_here(sp, 13000)
    ev = [e for e in sp.snapshot()["device_traces"][0] if e.get("size") == 13000]
    frames = ev[-1]["frames"]
    assert frames[0]["name"] == "_alloc_here"
    assert len(frames) > 3  # C frames follow the Python ones
    sp.free(p)


def test_dump_snapshot_pickle_and_json(sp, tmp_path):
    sp.record_memory_history()
    p = sp.malloc(4096)
    sp.dump_snapshot(tmp_path / "s.pickle")
    sp.dump_snapshot(str(tmp_path / "s.json"))
    with open(tmp_path / "s.pickle", "rb") as f:
        a = pickle.load(f)
    with open(tmp_path / "s.json") as f:
        b = json.load(f)
    assert set(a) == set(b) >= {"segments", "device_traces", "allocator_settings"}
    sp.free(p)


@pytest.mark.parametrize("kw,exc", [
    (dict(enabled="yes"), ValueError),
    (dict(context="some"), ValueError),
    (dict(stacks="cpp"), ValueError),
    (dict(max_entries=-1), ValueError),
    (dict(max_entries="10"), TypeError),
])
def test_bad_history_arguments(sp, kw, exc):
    with pytest.raises(exc):
        sp.record_memory_history(**kw)


@pytest.mark.parametrize("call", [
    lambda sp, v: sp.record_memory_history("all", global_record_annotations=v),
    lambda sp, v: sp._record_memory_history("all", global_record_annotations=v),
    lambda sp, v: sp._record_memory_history("all", compile_context=v),
    lambda sp, v: sp._record_memory_history(True, record_context=v),
    lambda sp, v: sp._record_memory_history(True, trace_alloc_record_context=v),
    lambda sp, v: sp._record_memory_history(True, record_context_cpp=v),
    lambda sp, v: sp._record_memory_history(True, compile_context=v),
    lambda sp, v: sp._record_memory_history(True, global_record_annotations=v),
])
@pytest.mark.parametrize("value", ["no", [], 0])
def test_history_flags_are_bools_and_a_refused_one_starts_nothing(sp, call, value):
    # torch binds these as C++ bools (pybind11 refuses a str or a list); clear_history is checked
    # here already. "no" was taken as True (every thread's annotations, C frames...) and
    # recording started; the refusal must come before anything changes.
    sp.record_memory_history(None)
    with pytest.raises(TypeError):
        call(sp, value)
    sp.free(sp.malloc(4096))
    assert sp.snapshot()["device_traces"][0] == []


def _actions(sp):
    return [e["action"] for e in sp.snapshot()["device_traces"][0]]


def test_skip_actions_from_an_iterator_are_skipped(sp):
    # A generator was walked by the type check and then joined empty: every action recorded.
    sp.record_memory_history("all", skip_actions=(a for a in ["alloc", "free_requested"]))
    sp.free(sp.malloc(4096))
    actions = _actions(sp)
    assert "free_completed" in actions
    assert "alloc" not in actions and "free_requested" not in actions


def test_refused_skip_actions_with_clear_history_clear_nothing(sp):
    # clear_history stopped recording (clearing it) before the library refused the unknown name:
    # a call that raised had dropped the history and left recording off.
    sp.record_memory_history("all")
    sp.free(sp.malloc(4096))
    before = _actions(sp)
    assert "alloc" in before
    with pytest.raises(ValueError, match="not an action"):
        sp.record_memory_history("all", clear_history=True, skip_actions=["alloc", "nosuch"])
    assert _actions(sp)[:len(before)] == before
    n = _actions(sp).count("alloc")
    sp.free(sp.malloc(4096))  # still recording
    assert _actions(sp).count("alloc") == n + 1
    # A good call still clears: only what comes after it is kept.
    sp.record_memory_history("all", clear_history=True, skip_actions=["free_requested"])
    sp.free(sp.malloc(4096))
    assert "free_requested" not in _actions(sp) and _actions(sp).count("alloc") == 1


def test_clear_history_never_stops_recording(sp):
    # clear_history turned recording off and on again (OFF clears): another thread's allocations
    # in between kept no stack and no trace entry (369 of 20,001 live blocks without frames in a
    # thread race). torch's clear_history empties the trace while it records. Every call the
    # package makes into the library is watched here: none may turn recording off.
    from sympool import _lib
    lib = _lib.lib()
    real = lib.sp_record_memory_history
    seen = []

    def watch(p):
        seen.append(p.enabled)
        return real(p)

    sp.record_memory_history("all")
    sp.free(sp.malloc(4096))
    keep = sp.malloc(4096)
    lib.sp_record_memory_history = watch
    try:
        sp.record_memory_history("all", clear_history=True)
    finally:
        lib.sp_record_memory_history = real
    assert seen and 0 not in seen, seen  # 0: SP_HISTORY_OFF
    assert _actions(sp) == []  # cleared
    sp.free(sp.malloc(4096))
    try:  # the snapshots that read the actions add their own "snapshot" entries
        assert [a for a in _actions(sp) if a != "snapshot"] == [
            "alloc", "free_requested", "free_completed"]
        live = [b for s in sp.memory_snapshot() for b in s["blocks"]
                if b["state"] == "active_allocated"]
        assert live and all(b["frames"] for b in live)  # the live block kept its stack
    finally:
        sp.free(keep)


def test_bad_snapshot_path(sp):
    with pytest.raises(TypeError):
        sp.dump_snapshot(5)
    with pytest.raises(ValueError):
        sp.dump_snapshot("")
    with pytest.raises(sp.SympoolError) as e:
        sp.dump_snapshot("/nonexistent-dir/x.pickle")
    assert e.value.status == "SP_ERR_SYSTEM"


def test_frames_from_another_python_thread(sp):
    import threading
    sp.record_memory_history()
    out = []

    def worker_alloc():
        out.append(sp.malloc(15000))

    t = threading.Thread(target=worker_alloc)
    t.start()
    t.join()
    ev = [e for e in sp.snapshot()["device_traces"][0] if e.get("size") == 15000]
    assert ev[-1]["frames"][0]["name"] == "worker_alloc"
    sp.free(out[0])


def test_memory_metadata_keeps_nul_and_odd_characters(sp, tmp_path):
    # torch.cuda.memory._set_memory_metadata takes any str (pybind11 hands its std::string over
    # whole, NULs included) and its pickle and _get_memory_metadata give it back unchanged.
    text = 'a\0b "q" \\ \udcff end\0'
    try:
        sp._set_memory_metadata(text)
        assert sp._get_memory_metadata() == text
        sp._record_memory_history("all", context=None)
        sp.free(sp.malloc(1000))
        trace = sp._snapshot()["device_traces"][0]
        assert trace and all(e["user_metadata"] == text for e in trace), trace
        sp.dump_snapshot(str(tmp_path / "m.json"))
        with open(tmp_path / "m.json", encoding="utf-8", errors="surrogatepass") as f:
            trace = json.load(f)["device_traces"][0]
        assert any(e["user_metadata"] == text for e in trace), trace
    finally:
        sp._set_memory_metadata("")


def test_c_stacks_start_at_the_caller(sp):
    # sympool's own frames before the caller's are dropped (pool/history.c): with the library a
    # shared object, also when its entry point left no frame (sp_free and sp_malloc end in a
    # tail call to a helper, which showed as the first C frame of every alloc and free).
    sp.record_memory_history(stacks="all")
    p = _alloc_here(sp, 13001)
    sp.free(p)
    ev = [e for e in sp.snapshot()["device_traces"][0] if e.get("size") == 13001]
    assert {e["action"] for e in ev} >= {"alloc", "free_requested", "free_completed"}, ev
    for e in ev:
        c = [f for f in e["frames"] if f["line"] == 0]  # the C frames, after the Python ones
        assert c, e
        assert "libsympool" not in c[0]["filename"], (e["action"], c[:3])


@pytest.mark.parametrize("name", ["a%%b", "a%pb", "a%rb", "a%hb", "a%"])
def test_snapshot_with_a_percent_in_the_temporary_directory(sp, tmp_path, monkeypatch, name):
    # _snapshot() writes through a folder in the temporary directory; a '%' there is part of its
    # name, not a pattern for the library to expand (it wrote to "a%b" or "a<pid>b" instead).
    import tempfile
    d = tmp_path / name
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    p = sp.malloc(4096)
    try:
        assert any(s["total_size"] > 0 for s in sp._snapshot()["segments"])
    finally:
        sp.free(p)


def test_record_memory_history_legacy_bool_form(sp):
    # torch.cuda.memory._record_memory_history(True, ...) is _record_memory_history_legacy
    # (record_context=True, trace_alloc_max_entries=1, trace_alloc_record_context=False, device,
    # record_context_cpp=False, ...): one trace entry, stacks on live blocks only, no C frames.
    # It was taken as "all": every entry kept, stacks on them, and a positional second argument
    # was refused as a context.
    try:
        sp._record_memory_history(True)
        ps = [_alloc_here(sp, 5000 + i) for i in range(3)]
        snap = sp._snapshot()
        trace = snap["device_traces"][0]
        assert len(trace) == 1 and "frames" not in trace[0], trace
        live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
        assert live and all(b["frames"] and b["frames"][0]["name"] == "_alloc_here" for b in live)
        for p in ps:
            sp.free(p)
        sp._record_memory_history(True, True, 100, True)  # positional, as torch takes them
        sp.free(_alloc_here(sp, 7001))
        ev = [e for e in sp._snapshot()["device_traces"][0] if e["size"] == 7001]
        assert {e["action"] for e in ev} >= {"alloc", "free_requested", "free_completed"}, ev
        alloc = [e for e in ev if e["action"] == "alloc"][0]
        assert alloc["frames"][0]["name"] == "_alloc_here"
        assert all(f["line"] > 0 for f in alloc["frames"]), alloc  # Python frames only
        sp._record_memory_history(False)
        assert sp._snapshot()["device_traces"][0] == []
    finally:
        sp._record_memory_history(None)


def test_record_function_scopes_are_external_annotations(sp):
    # torch.profiler.record_function's user scopes, as torch's snapshots list them: stage, name,
    # device, time_us (the trace entries' clock), oldest first; nothing while recording is off.
    with sp.record_function("before"):
        pass
    sp._record_memory_history("all")
    with sp.record_function("Optimizer.step"):
        p = sp.malloc(4096)
    snap = sp._snapshot()
    ann = snap["external_annotations"]
    assert [(a["stage"], a["name"], a["device"]) for a in ann] == [
        ("START", "Optimizer.step", 0), ("END", "Optimizer.step", 0)]
    assert all(list(a) == ["stage", "name", "device", "time_us"] for a in ann)
    alloc = [e for e in snap["device_traces"][0] if e["action"] == "alloc" and e["size"] == 4096]
    assert ann[0]["time_us"] <= alloc[-1]["time_us"] <= ann[1]["time_us"]
    sp.free(p)
    sp._record_memory_history(None)  # off clears them, as torch's recordHistory does
    assert sp._snapshot()["external_annotations"] == []


def test_record_function_entered_twice_records_balanced_pairs(sp):
    # One object entered twice before it is left (a reused scope object, a recursive function
    # under one decorator object's with): each enter's START has its END. A single flag recorded
    # START, START, END: the outer scope never ended. Leaving it again records no stray END.
    sp._record_memory_history("all")
    scope = sp.record_function("layer")
    with scope:
        with scope:
            pass
    scope.__exit__(None, None, None)
    ann = sp._snapshot()["external_annotations"]
    assert [(a["stage"], a["name"]) for a in ann] == [
        ("START", "layer"), ("START", "layer"), ("END", "layer"), ("END", "layer")]
    sp._record_memory_history(None)  # clears them
    # Entered before recording began, then again while recording: only the inner scope's pair
    # (the outer START was never recorded, so neither is its END).
    outer = sp.record_function("outer")
    outer.__enter__()
    sp._record_memory_history("all")
    with outer:
        pass
    outer.__exit__(None, None, None)
    ann = sp._snapshot()["external_annotations"]
    assert [(a["stage"], a["name"]) for a in ann] == [("START", "outer"), ("END", "outer")]
    sp._record_memory_history(None)


def test_record_function_shared_by_threads_ends_each_threads_own_scope(sp):
    # One object entered on two threads at once (a module-level scope object): each thread's
    # exit ends that thread's scope. The enters were one list for all threads, so the recording
    # thread's exit took the other thread's (unrecorded) entry and recorded no END, and the other
    # thread, not recorded, recorded the END when it left.
    import threading

    sp._record_memory_history("all")  # this thread's scopes only
    scope = sp.record_function("shared")
    scope.__enter__()
    inside, leave = threading.Event(), threading.Event()

    def run():
        with scope:
            inside.set()
            leave.wait()

    t = threading.Thread(target=run)
    t.start()
    inside.wait()
    try:
        scope.__exit__(None, None, None)
        ann = sp._snapshot()["external_annotations"]
        assert [(a["stage"], a["name"]) for a in ann] == [("START", "shared"), ("END", "shared")]
    finally:
        leave.set()
        t.join()
    ann = sp._snapshot()["external_annotations"]
    assert [(a["stage"], a["name"]) for a in ann] == [("START", "shared"), ("END", "shared")]
    sp._record_memory_history(None)


def test_global_record_annotations_says_which_threads_scopes_count(sp):
    import threading

    def scope_on_another_thread():
        def run():
            with sp.record_function("worker"):
                pass
        t = threading.Thread(target=run)
        t.start()
        t.join()

    # False (torch's default: a thread-local callback): only the thread that turned it on
    sp._record_memory_history("all")
    scope_on_another_thread()
    with sp.record_function("main"):
        pass
    assert [a["name"] for a in sp._snapshot()["external_annotations"]] == ["main", "main"]
    sp._record_memory_history(None)
    sp._record_memory_history("all", global_record_annotations=True)
    scope_on_another_thread()
    assert [a["name"] for a in sp._snapshot()["external_annotations"]] == ["worker", "worker"]


def test_annotations_bounded_by_max_entries_and_decorator(sp):
    sp._record_memory_history("all", max_entries=3)

    @sp.record_function("step")
    def step(i):
        return i

    assert [step(i) for i in range(3)] == [0, 1, 2]
    ann = sp._snapshot()["external_annotations"]
    assert [a["stage"] for a in ann] == ["END", "START", "END"]  # the newest 3 of 6
    with pytest.raises(TypeError):
        sp.record_function(3)
    with pytest.raises(sp.InvalidArgumentError):
        sp.history._record_annotation("START", "x", device=sp.device_count())


def test_history_turned_on_and_off_by_two_threads_at_once_keeps_its_hook(sp):
    # The frames hook, the library's recording and the annotations changed in three steps: an
    # "on" and a None from two threads could interleave so that recording stayed on without
    # the hook (its trace entries without frames until the next "on"; 8 runs in 300).
    import threading
    for i in range(200):
        sp.record_memory_history(None)
        gate = threading.Barrier(2)

        def turn(enabled):
            gate.wait()
            sp.record_memory_history(enabled)

        threads = [threading.Thread(target=turn, args=(e,)) for e in ("all", None)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        p = sp.malloc(4096)
        try:
            allocs = [e for e in sp._snapshot()["device_traces"][0] if e["action"] == "alloc"]
            if allocs:  # recording is on: the entry has the caller's frames
                assert allocs[-1]["frames"], f"round {i}: recording on without the frames hook"
        finally:
            sp.free(p)
    sp.record_memory_history(None)


def test_reload_keeps_the_annotation_scope_of_recording_in_progress(sp):
    # importlib.reload (Jupyter's autoreload) ran the module's state again: the scope of the
    # record_function annotations went back to "off" while history was still on, and no scope
    # opened after it was recorded. The module's other state was already kept.
    import importlib
    import sympool.history as h
    sp.record_memory_history("all")
    try:
        importlib.reload(h)
        with sp.record_function("after-reload"):
            pass
        names = [a.get("name") for a in sp._snapshot().get("external_annotations", [])]
        assert "after-reload" in names, names
    finally:
        sp.record_memory_history(None)


def test_dump_snapshot_takes_torchs_augment_flag(sp, tmp_path):
    out = tmp_path / "s.pickle"
    sp._dump_snapshot(str(out), False)
    assert out.stat().st_size > 0
    sp._dump_snapshot(str(out), augment_with_fx_traces=True)
    with pytest.raises(TypeError):
        sp._dump_snapshot(str(out), "yes")
