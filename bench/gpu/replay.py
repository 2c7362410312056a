#!/usr/bin/env python3
"""replay.py ALLOCATOR TRACE --out FILE: replay a PyTorch memory snapshot's trace on the GPU
through one allocator, in a process of its own:

  torch    PyTorch's caching allocator: the raw_alloc / raw_delete bindings behind
           torch.cuda.caching_allocator_alloc / _delete (without its per-call device context),
           each recorded stream mapped to a torch.cuda.Stream of its own (0 = the default stream)
  sympool  sympool's cuda backend: sp_malloc / sp_free through ctypes, each recorded stream
           mapped to an sp_stream_create stream

Both replay the same requests in the same order: every `alloc` and every `free_requested` of
the trace (frees of blocks allocated before recording began are skipped on both sides), and
both go through Python per call, so time per operation includes the same interpreter cost.
Reports the peak reserved bytes and nanoseconds per operation."""

import os
import pickle
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def events(path):
    with open(path, "rb") as f:
        snap = pickle.load(f)
    traces = snap.get("device_traces", []) if isinstance(snap, dict) else []
    out = []
    for dev, trace in enumerate(traces):
        for e in trace:
            if e.get("action") in ("alloc", "free_requested"):
                out.append((e["action"], dev, e["addr"], e["size"], e.get("stream", 0)))
    return out


def replay_torch(evts):
    import torch

    # torch.cuda.caching_allocator_alloc enters `with torch.cuda.device(dev)` on every call (a
    # device switch and back, in Python), which sympool's side does not pay: call the binding
    # behind it directly, with the device set once and the streams resolved to handles up front,
    # so both sides time one ctypes-or-binding call per operation.
    raw_alloc = torch._C._cuda_cudaCachingAllocator_raw_alloc
    raw_delete = torch._C._cuda_cudaCachingAllocator_raw_delete
    devs = sorted({e[1] for e in evts})
    if len(devs) > 1:
        sys.exit(f"replay.py: the trace uses devices {devs}; the torch side replays one device")
    dev = devs[0] if devs else 0
    torch.cuda.set_device(dev)
    streams, live = {}, {}
    for _, _, _, _, stream in evts:
        if stream not in streams:
            streams[stream] = (torch.cuda.default_stream(dev) if stream == 0
                               else torch.cuda.Stream(device=dev))
    handles = {k: v.cuda_stream for k, v in streams.items()}
    ops = 0
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for action, _, addr, size, stream in evts:
        if action == "alloc":
            live[addr] = raw_alloc(size, handles[stream])
        else:
            p = live.pop(addr, None)
            if p is None:
                continue
            raw_delete(p)
        ops += 1
    t1 = time.perf_counter_ns()
    for p in live.values():
        raw_delete(p)
    return {"peak_reserved_bytes": torch.cuda.max_memory_reserved(), "ops": ops,
            "ns_per_op": (t1 - t0) / max(ops, 1)}


def replay_sympool(evts):
    import ctypes

    os.environ["SYMPOOL_DEVICE"] = "cuda"
    lib = common.load(common.library())
    streams, live = {}, {}
    ops = 0
    out = ctypes.c_void_p()
    # The torch side starts timing with its CUDA context made and its streams created: do the same
    # here (sp_init, every stream up front, one malloc+free that sets the device up, then the cache
    # emptied and the peaks reset), so neither side's time holds one-time setup.
    if lib.sp_init() != 0:
        sys.exit(f"sp_init: {lib.sp_last_error().decode()}")
    for _, dev, _, _, stream in evts:
        if stream not in streams:
            s = ctypes.c_void_p()
            if stream != 0 and lib.sp_stream_create(dev, ctypes.byref(s)) != 0:
                sys.exit(f"sp_stream_create: {lib.sp_last_error().decode()}")
            streams[stream] = s.value if stream != 0 else None
    for dev in sorted({e[1] for e in evts}):
        if lib.sp_malloc(512, dev, None, ctypes.byref(out)) != 0:
            sys.exit(f"sp_malloc(512): {lib.sp_last_error().decode()}")
        lib.sp_free(out.value)
    lib.sp_empty_cache()
    for dev in sorted({e[1] for e in evts}):
        lib.sp_reset_peak_memory_stats(dev)
    t0 = time.perf_counter_ns()
    for action, dev, addr, size, stream in evts:
        if action == "alloc":
            if lib.sp_malloc(size, dev, streams[stream], ctypes.byref(out)) != 0:
                sys.exit(f"sp_malloc({size}): {lib.sp_last_error().decode()}")
            live[addr] = out.value
        else:
            p = live.pop(addr, None)
            if p is None:
                continue
            lib.sp_free(p)
        ops += 1
    t1 = time.perf_counter_ns()
    for p in live.values():
        lib.sp_free(p)
    return {"peak_reserved_bytes": lib.sp_max_memory_reserved(0), "ops": ops,
            "ns_per_op": (t1 - t0) / max(ops, 1), "backend": lib.sp_backend_name().decode()}


def main():
    which, trace = sys.argv[1], sys.argv[2]
    evts = events(trace)
    res = replay_torch(evts) if which == "torch" else replay_sympool(evts)
    res.update({"allocator": which, "trace": os.path.basename(trace), "events": len(evts)})
    common.write(res)


if __name__ == "__main__":
    main()
