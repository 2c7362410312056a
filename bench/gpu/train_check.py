#!/usr/bin/env python3
"""train_check.py MODE --out FILE: a small transformer's training loop (forward, backward,
AdamW step) on the GPU with one allocator, in a process of its own:

  native     PyTorch's own caching allocator (the reference)
  pluggable  sympool for the whole process (sympool.torch.enable(): change_current_allocator
             through its C++ shim, record_stream, empty_cache and memory fraction wired)
  mempool    sympool behind torch.cuda.MemPool around the loop (sympool.torch.mem_pool(), its
             non-caching segment entry points; PyTorch's allocator elsewhere); the pool is
             destroyed before the allocator

Deterministic algorithms and a fixed seed: the losses and the final parameters must match the
native run (gpu-check.sh compares the JSON files). Records the losses, a parameter checksum,
time per step and the allocator's peak reserved bytes."""

import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "python"))
import common  # noqa: E402

STEPS, BATCH, SEQ, VOCAB, DMODEL = 30, 16, 128, 2048, 256


def build(torch):
    nn = torch.nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, DMODEL)
            self.pos = nn.Parameter(torch.zeros(SEQ, DMODEL))
            layer = nn.TransformerEncoderLayer(DMODEL, 4, 4 * DMODEL, dropout=0.0,
                                               batch_first=True, norm_first=True)
            self.body = nn.TransformerEncoder(layer, 4)
            self.head = nn.Linear(DMODEL, VOCAB)

        def forward(self, x):
            mask = nn.Transformer.generate_square_subsequent_mask(SEQ, device=x.device)
            h = self.body(self.emb(x) + self.pos, mask=mask, is_causal=True)
            return self.head(h)

    return Model()


def main():
    mode = sys.argv[1]
    import torch

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    lib = None
    pool = None
    if mode in ("pluggable", "mempool"):
        path = common.library()
        os.environ["SYMPOOL_DEVICE"] = "cuda"
        os.environ["SYMPOOL_LIBRARY"] = path
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                        "python"))
        import sympool.torch as spt
        lib = common.load(path)
        # What a user runs: enable() (its C++ shim turns an OOM into torch.OutOfMemoryError) and
        # mem_pool() (sympool's non-caching segment entry points behind torch.cuda.MemPool).
        if mode == "pluggable":
            spt.enable()
        else:
            pool = spt.mem_pool()
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (STEPS, BATCH, SEQ + 1), generator=gen)
    losses = []
    ctx = torch.cuda.use_mem_pool(pool) if pool is not None else None
    if ctx is not None:
        ctx.__enter__()
    try:
        model = build(torch).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for step in range(STEPS):
            batch = data[step].to(dev)
            logits = model(batch[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                                     batch[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss))
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        checksum = float(sum(p.double().sum() for p in model.parameters()))
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    # The pool must not outlive its allocator (PyTorch before pytorch#171962 crashes at exit when
    # it does): drop every tensor from it, then the pool, while the allocator and the library are
    # still alive; the pool's segments go back through sympool's segment free here, not at exit.
    del model, opt, batch, logits, loss
    if pool is not None:
        del ctx, pool
        import gc
        gc.collect()
        torch.cuda.empty_cache()
    result = {"mode": mode, "steps": STEPS, "losses": losses, "param_checksum": checksum,
              "ms_per_step": 1e3 * elapsed / STEPS}
    if mode == "native":
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    elif mode == "pluggable":
        result["sympool_peak_reserved_bytes"] = lib.sp_max_memory_reserved(0)
        result["sympool_backend"] = lib.sp_backend_name().decode()
    else:
        # sympool only hands PyTorch its segments here: the reserved bytes are PyTorch's.
        result["sympool_backend"] = lib.sp_backend_name().decode()
        result["torch_peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        result["torch_reserved_after_pool_destroyed"] = torch.cuda.memory_reserved()
    common.write(result)


if __name__ == "__main__":
    main()
