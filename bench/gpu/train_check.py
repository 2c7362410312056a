#!/usr/bin/env python3
"""train_check.py MODE --out FILE: a small transformer's training loop (forward, backward,
AdamW step) on the GPU with one allocator, in a process of its own:

  native     PyTorch's own caching allocator (the reference)
  pluggable  sympool for the whole process (CUDAPluggableAllocator + change_current_allocator,
             with record_stream and empty_cache wired)
  mempool    sympool behind torch.cuda.MemPool(allocator) around the loop (PyTorch's allocator
             elsewhere)

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
    ctx = None
    if mode in ("pluggable", "mempool"):
        path = common.library()
        os.environ["SYMPOOL_DEVICE"] = "cuda"
        import _sympool_common as spcommon
        lib = common.load(path)
        allocator = spcommon.pluggable_allocator(torch, path, lib)
        if mode == "pluggable":
            torch.cuda.memory.change_current_allocator(allocator)
        else:
            pool = torch.cuda.MemPool(allocator.allocator())
            ctx = torch.cuda.use_mem_pool(pool)
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (STEPS, BATCH, SEQ + 1), generator=gen)
    losses = []
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
    result = {"mode": mode, "steps": STEPS, "losses": losses, "param_checksum": checksum,
              "ms_per_step": 1e3 * elapsed / STEPS}
    if mode == "native":
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    else:
        result["sympool_peak_reserved_bytes"] = lib.sp_max_memory_reserved(0)
        result["sympool_backend"] = lib.sp_backend_name().decode()
        if mode == "mempool":
            result["torch_peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    common.write(result)


if __name__ == "__main__":
    main()
