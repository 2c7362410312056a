"""_summary: memory_summary's table formatted from memory_stats, for libraries without
sp_memory_summary. Same rows and columns as torch.cuda.memory_summary's short form."""

_ROWS = [  # (title, stats prefix, is bytes)
    ("Allocated memory", "allocated_bytes", True),
    ("Active memory", "active_bytes", True),
    ("Requested memory", "requested_bytes", True),
    ("GPU reserved memory", "reserved_bytes", True),
    ("Non-releasable memory", "inactive_split_bytes", True),
    ("Allocations", "allocation", False),
    ("Active allocs", "active", False),
    ("GPU reserved segments", "segment", False),
    ("Non-releasable allocs", "inactive_split", False),
]
_WIDTH = 75


def _bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:6d} {unit:<3}" if unit == "B" else f"{n:6.0f} {unit:<3}"
        n /= 1024
    return str(n)


def _line(cells):
    return "|" + "|".join(cells) + "|"


def format_summary(stats, device, backend):
    rule, heavy = "|" + "-" * _WIDTH + "|", "|" + "=" * _WIDTH + "|"
    g = stats.get
    out = [heavy, "|" + f"sympool memory summary, device ID {device} ({backend})".center(_WIDTH)
           + "|", rule,
           _line([f" OOMs: {g('num_ooms', 0)}".ljust(37),
                  f" device malloc retries: {g('num_alloc_retries', 0)}".ljust(37)]),
           heavy,
           _line([" Metric".ljust(27), " Cur Usage ", " Peak Usage", " Tot Alloc ",
                  " Tot Freed "]), rule]
    for title, prefix, is_bytes in _ROWS:
        for pool, label in (("all", title), ("large_pool", "      from large pool"),
                            ("small_pool", "      from small pool")):
            vals = [g(f"{prefix}.{pool}.{m}", 0) for m in ("current", "peak", "allocated", "freed")]
            fmt = _bytes if is_bytes else (lambda n: f"{n:10d}")
            out.append(_line([f" {label}".ljust(27)[:27]] + [f" {fmt(v):>10}" for v in vals]))
        out.append(rule)
    out.append(_line([" Oversize allocations".ljust(27)] +
                     [f" {g('oversize_allocations.' + m, 0):>10d}"
                      for m in ("current", "peak", "allocated", "freed")]))
    out.append(_line([" Oversize GPU segments".ljust(27)] +
                     [f" {g('oversize_segments.' + m, 0):>10d}"
                      for m in ("current", "peak", "allocated", "freed")]))
    out.append(heavy)
    return "\n".join(out) + "\n"
