#!/usr/bin/env python3
"""train_ddp_style.py: data-parallel training the way DistributedDataParallel does it, with the
gradient buckets in a sympool symmetric MemPool and averaged with sympool's allreduce.

    mpirun -np 2 python3 examples/python/train_ddp_style.py            # one process per GPU
    mpirun -np 2 python3 examples/python/train_ddp_style.py --steps 20 --bucket-mb 25

With torch and a GPU: sympool becomes PyTorch's CUDA allocator (sympool.torch.enable()), a small
MLP trains on each rank's own batch, and after each backward pass the gradients are copied into
their bucket, each bucket is averaged across ranks (op="avg", on the current stream), and the
optimizer steps on the averaged gradients, so every rank keeps the same weights.

Without torch (or without a GPU) the same loop runs on sympool's host backend: parameters and
buckets are host memory reached through ctypes, the "backward pass" writes a gradient that
depends on the rank, and the check is exact: every bucket must hold the mean over ranks.

The world comes from mpi4py's COMM_WORLD when mpi4py is installed, else from World.init()
(sympool initializes MPI itself).

At the end, rank 0 prints sympool's statistics table across ranks (World.stats_report).
"""

import argparse
import ctypes
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def import_sympool():
    """The installed package; else, from a clone that is built but not installed, the clone's
    package and build/libsympool.so."""
    try:
        import sympool
        sympool.library_path()
        return sympool
    except ImportError:
        for name in [n for n in list(sys.modules) if n == "sympool" or n.startswith("sympool.")]:
            del sys.modules[name]
    root = os.path.abspath(os.path.join(HERE, "..", ".."))
    sys.path.insert(0, os.path.join(root, "python"))
    lib = os.path.join(root, "build", "libsympool.so")
    if "SYMPOOL_LIBRARY" not in os.environ and os.path.exists(lib):
        os.environ["SYMPOOL_LIBRARY"] = lib
    import sympool
    return sympool


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--bucket-mb", type=float, default=1.0, help="DDP's bucket_cap_mb")
    ap.add_argument("--mode", choices=("auto", "torch", "host"), default="auto",
                    help="torch: PyTorch on GPUs; host: no torch, sympool's host backend")
    ap.add_argument("--report", choices=("table", "json", "prometheus"), default="table")
    return ap.parse_args()


def want_torch(mode):
    if mode == "host":
        return False
    if mode == "auto" and os.environ.get("SYMPOOL_DEVICE") == "host":
        # sympool is told to run its host backend: PyTorch cannot use its memory as CUDA memory.
        return False
    try:
        import torch
        ok = torch.cuda.is_available()
    except ImportError:
        ok = False
    if mode == "torch" and not ok:
        sys.exit("train_ddp_style: --mode torch needs torch with a CUDA GPU")
    return ok


def make_buckets(sizes, cap_bytes, elem=4):
    """DDP's bucketing: parameters in reverse order (the order backward produces gradients),
    a new bucket when the next one would pass the cap. Returns [[(param index, offset), ...]]
    and each bucket's element count."""
    buckets, counts, cur, n = [], [], [], 0
    for i in reversed(range(len(sizes))):
        if cur and (n + sizes[i]) * elem > cap_bytes:
            buckets.append(cur)
            counts.append(n)
            cur, n = [], 0
        cur.append((i, n))
        n += sizes[i]
    buckets.append(cur)
    counts.append(n)
    return buckets, counts


# ---- host backend: parameters and gradients through ctypes ---------------------------------

def floats(addr, n):
    return memoryview((ctypes.c_float * n).from_address(addr)).cast("B").cast("f")


def run_host(sympool, world, pool, args):
    layers = [(64, 128), (128, 128), (128, 10)]
    sizes = [a * b + b for a, b in layers]  # weight + bias, flattened
    params = [sympool.malloc(n * 4, world.device) for n in sizes]
    for p, n in zip(params, sizes):
        ctypes.memset(p, 0, n * 4)
    buckets, counts = make_buckets(sizes, int(args.bucket_mb * (1 << 20)))
    bufs = [pool.malloc(n * 4) for n in counts]  # collective: same sizes on every rank
    lr, mean = 0.1, (world.size + 1) / 2.0
    for step in range(args.steps):
        for bucket, buf, count in zip(buckets, bufs, counts):
            g = floats(buf, count)
            for i, off in bucket:  # "backward": gradient of parameter i on this rank
                for k in range(sizes[i]):
                    g[off + k] = (world.rank + 1) * (1 + (k % 7)) * 0.5
            world.allreduce(buf, buf, count, dtype="float32", op="avg")
            for i, off in bucket:
                w = floats(params[i], sizes[i])
                for k in range(sizes[i]):
                    expect = mean * (1 + (k % 7)) * 0.5
                    if abs(g[off + k] - expect) > 1e-5:
                        raise SystemExit(f"rank {world.rank}: step {step} bucket value "
                                         f"{g[off + k]} != mean {expect}")
                    w[k] -= lr * g[off + k]
    # Every rank must hold the same weights: compare checksums across ranks.
    chk = sympool.malloc(16, world.device)
    both = floats(chk, 4)
    total = sum(sum(floats(p, n)) for p, n in zip(params, sizes))
    both[0] = both[1] = total
    world.allreduce(chk, chk, 1, dtype="float32", op="min")
    lo = both[0]
    both[0] = total
    world.allreduce(chk, chk, 1, dtype="float32", op="max")
    if lo != both[0]:
        raise SystemExit(f"rank {world.rank}: weights differ across ranks ({lo} vs {both[0]})")
    for p in params + bufs + [chk]:
        sympool.free(p)
    return (f"{len(buckets)} bucket(s) of {counts} floats; "
            f"weights checksum {total:.3f} on every rank")


# ---- GPUs with torch ----------------------------------------------------------------------

class _CudaArray:
    """A float32 view of a sympool device buffer that torch.as_tensor wraps without copying."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False),
                                         "version": 2}


def run_torch(sympool, world, pool, args):
    import torch
    torch.cuda.set_device(world.device)
    torch.manual_seed(0)  # same initial weights on every rank, as DDP's broadcast would give
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10)).cuda()
    params = list(model.parameters())
    sizes = [p.numel() for p in params]
    buckets, counts = make_buckets(sizes, int(args.bucket_mb * (1 << 20)))
    bufs = [pool.malloc(n * 4) for n in counts]
    flat = [torch.as_tensor(_CudaArray(b, n), device=f"cuda:{world.device}")
            for b, n in zip(bufs, counts)]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator(device="cuda").manual_seed(1234 + world.rank)  # each rank's own data
    for step in range(args.steps):
        x = torch.randn(64, 512, device="cuda", generator=gen)
        y = torch.randint(0, 10, (64,), device="cuda", generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        stream = torch.cuda.current_stream().cuda_stream
        for bucket, buf, f, count in zip(buckets, bufs, flat, counts):
            for i, off in bucket:
                f[off:off + sizes[i]].copy_(params[i].grad.reshape(-1))
            world.allreduce(buf, buf, count, dtype="float32", op="avg", stream=stream)
            for i, off in bucket:
                params[i].grad.copy_(f[off:off + sizes[i]].view_as(params[i]))
        opt.step()
    torch.cuda.synchronize()
    total = torch.tensor([sum(float(p.double().sum()) for p in params)], device="cuda")
    chk = pool.malloc(8)
    t = torch.as_tensor(_CudaArray(chk, 2), device="cuda")
    t[0] = t[1] = total[0]
    world.allreduce(chk, chk, 1, dtype="float32", op="min", stream=stream)
    torch.cuda.synchronize()
    if float(t[0]) != float(t[1]):
        raise SystemExit(f"rank {world.rank}: weights differ across ranks")
    del flat, t
    for b in bufs + [chk]:
        sympool.free(b)
    return (f"{len(buckets)} bucket(s), last loss {float(loss):.4f}, "
            f"weights checksum {float(total[0]):.4f} on every rank")


def main():
    args = parse()
    use_torch = want_torch(args.mode)
    if not use_torch:
        os.environ.setdefault("SYMPOOL_DEVICE", "host")  # before the library starts
    sympool = import_sympool()
    if use_torch:
        import sympool.torch
        sympool.torch.enable()  # before anything touches CUDA: every tensor comes from sympool
    try:
        from mpi4py import MPI
        world = sympool.World(MPI.COMM_WORLD)
    except ImportError:  # no mpi4py: sympool initializes (and finalizes) MPI itself
        world = sympool.World.init()
    pool = sympool.MemPool(symmetric=True, world=world, name="grad_buckets")
    what = (run_torch if use_torch else run_host)(sympool, world, pool, args)
    if world.rank == 0:
        print(f"train_ddp_style: {world.size} ranks, {args.steps} steps on the "
              f"{sympool.backend()} backend ({'torch' if use_torch else 'ctypes'}): {what}",
              flush=True)
    world.stats_report(args.report)  # collective; rank 0 prints
    pool.destroy()
    world.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
