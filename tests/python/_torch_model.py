"""A reference model of PyTorch's DeviceCachingAllocator (c10/cuda/CUDACachingAllocator.cpp), for
test_parity_model.py: where the next block goes, given the same calls, and the figures that
follow. Written from the allocator's rules as PyTorch states them, not from sympool's code:

- round_size, with roundup_power2_divisions (c10/core/AllocatorConfig.cpp: the interval index is
  floor(log2(size)) - 20, clamped to [0, 15]);
- get_free_block: best fit by (stream, size, address), the two max_split_size rules, and with
  expandable segments the preference for the block whose unmapped tail makes it smaller;
- should_split (512 B rest in the small pool or with expandable segments; more than 1 MiB, and
  only under max_split_size, in the large one) and alloc_found_block (the block takes the low
  part);
- free_block's merges with free neighbours (not ones waiting for events), record_stream's events
  completing when the stream that used the block is synchronized;
- malloc's miss path: garbage_collect_cached_blocks (with a fraction and a threshold), alloc_block
  refused past the fraction (its alloc_size: 2 MiB, 20 MiB or the size rounded to 2 MiB, with
  expandable segments too), release_available_cached_blocks (with max_split_size), then
  release_cached_blocks and a retry (num_alloc_retries), else OOM (num_ooms);
- expandable segments: find_expandable_block, map_block (whole pages), unmap_block (whole pages
  inside free blocks) and release_blocks at empty_cache;
- MemPools routed to (use_mem_pool): block pools of their own, counted in the device's stats;
  garbage collection looks at the default pool's large blocks only, and release_cached_blocks
  (empty_cache, the OOM retry) leaves a live pool's cache alone (its use_count is not 0);
  no_split pools never split; try_mempool_fallback lends a use_on_oom pool's free block to a
  default-pool request the device refused, before any release.

Streams are small ints (0 = the default stream); the caller maps them to its own.
"""

import bisect
from collections import defaultdict

MB = 1 << 20
SMALL_SIZE = MB             # kSmallSize
SMALL_BUFFER = 2 * MB       # kSmallBuffer
LARGE_BUFFER = 20 * MB      # kLargeBuffer
MIN_LARGE_ALLOC = 10 * MB   # kMinLargeAlloc
ROUND_LARGE = 2 * MB        # kRoundLarge
NO_LIMIT = (1 << 64) - 1


class Config:
    def __init__(self, max_split_mb=0, divisions=None, gc=0.0, allowed=None, expandable=False):
        self.mss = max_split_mb * MB if max_split_mb else NO_LIMIT
        self.mnsr = 20 * MB  # max_non_split_rounding_mb's default
        self.divisions = divisions or [0] * 16
        self.gc = gc
        self.allowed = allowed  # bytes the fraction allows, or None
        self.expandable = expandable


def _next_division(n, d):
    if n & (n - 1) == 0:
        return n
    floor = 1 << (n.bit_length() - 1)
    step = floor >> (d.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = n & ~(step - 1)
    return n if low == n else low + step


def round_size(cfg, n):
    if n < 512:
        return 512
    d = cfg.divisions[max(0, min(n.bit_length() - 1 - 20, 15))]
    if d > 1 and n > 512 * d:
        return _next_division(n, d)
    return 512 * ((n + 511) // 512)


def allocation_size(size):
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


class Block:
    __slots__ = ("ptr", "size", "stream", "small", "seg", "mapped", "allocated", "requested",
                 "events", "uses", "prev", "next", "gc_base", "pool")

    def __init__(self, ptr, size, stream, small, seg, mapped=True, pool=0):
        self.ptr, self.size, self.stream, self.small, self.seg = ptr, size, stream, small, seg
        self.pool = pool  # 0: the default pool; n: the n-th MemPool (a PrivatePool)
        self.mapped = mapped
        self.allocated = False
        self.requested = 0
        self.events = 0
        self.uses = set()
        self.prev = self.next = None
        self.gc_base = 0


class Segment:
    def __init__(self, base, size, page=None):
        self.base, self.size, self.page = base, size, page  # page: expandable segments only


class Model:
    def __init__(self, cfg, use_on_oom=(), no_split=()):
        self.cfg = cfg
        self.use_on_oom = set(use_on_oom)  # MemPools (by number) that lend on OOM
        self.no_split = {pi: True for pi in no_split}
        # per block pool, keyed (pool, small): mapped free blocks (stream, size, ptr, id, b) and
        # expandable segments' unmapped ranges (stream, ptr, id, b)
        self.cached = defaultdict(list)
        self.unmapped = defaultdict(list)
        self.live = {}                         # ptr -> allocated block
        self.segments = {}                     # fixed segments: base -> Segment
        self.pending = []                      # [block, [(stream, sequence), ...]]
        self.recorded, self.completed = {}, {}
        self.reserved = 0
        self.retries = self.ooms = 0
        self.lookups = defaultdict(int)        # get_free_blocks_call_count, per block pool

    # -- the sets
    def _ins(self, b):
        b.gc_base = self.lookups[b.pool, b.small]
        bisect.insort(self.cached[b.pool, b.small], (b.stream, b.size, b.ptr, id(b), b))

    def _rm(self, b):
        lst = self.cached[b.pool, b.small]
        i = bisect.bisect_left(lst, (b.stream, b.size, b.ptr, id(b)))
        assert lst[i][4] is b
        del lst[i]

    def _uins(self, b):
        bisect.insort(self.unmapped[b.pool, b.small], (b.stream, b.ptr, id(b), b))

    def _urm(self, b):
        lst = self.unmapped[b.pool, b.small]
        i = bisect.bisect_left(lst, (b.stream, b.ptr, id(b)))
        assert lst[i][3] is b
        del lst[i]

    @staticmethod
    def _link_after(new, b):
        new.prev, new.next = b, b.next
        if b.next:
            b.next.prev = new
        b.next = new

    @staticmethod
    def _link_before(new, b):
        new.prev, new.next = b.prev, b
        if b.prev:
            b.prev.next = new
        b.prev = new

    def _merge(self, dst, src):
        if src is None or src.allocated or src.events or src.mapped != dst.mapped:
            return
        if dst.prev is src:
            dst.ptr, dst.prev = src.ptr, src.prev
            if src.prev:
                src.prev.next = dst
        else:
            dst.next = src.next
            if src.next:
                src.next.prev = dst
        dst.size += src.size
        (self._rm if src.mapped else self._urm)(src)

    @property
    def gc_on(self):
        return self.cfg.allowed is not None and self.cfg.gc > 0

    # -- lookups
    def _get_free_block(self, size, stream, small, pool):
        if self.gc_on:
            self.lookups[pool, small] += 1
        lst = self.cached[pool, small]
        i = bisect.bisect_left(lst, (stream, size, 0, 0))
        if i == len(lst) or lst[i][0] != stream:
            return None
        if self.cfg.expandable:
            def reach(b):
                return b.size + (b.next.size if b.next and not b.next.mapped else 0)
            j = i + 1
            while j < len(lst) and lst[j][0] == stream and reach(lst[j][4]) < reach(lst[i][4]):
                i, j = j, j + 1
        b = lst[i][4]
        mss, mnsr = self.cfg.mss, self.cfg.mnsr
        if size < mss and b.size >= mss:
            return None
        if size >= mss and b.size >= size + mnsr:
            return None
        self._rm(b)
        return b

    def _should_split(self, b, size):
        if self.no_split.get(b.pool):
            return False
        rest = b.size - size
        if b.small or self.cfg.expandable:
            return rest >= 512
        return size < self.cfg.mss and rest > SMALL_SIZE

    # -- growth
    def _fits_fraction(self, alloc_size):
        return self.cfg.allowed is None or self.reserved + alloc_size <= self.cfg.allowed

    def _map(self, b, size):
        seg = b.seg
        off = b.ptr - seg.base
        end = -(-(off + size) // seg.page) * seg.page
        n = end - off
        self._urm(b)
        b.mapped = True
        if n < b.size:
            rest = Block(b.ptr + n, b.size - n, b.stream, b.small, seg, False, b.pool)
            self._link_after(rest, b)
            self._uins(rest)
            b.size = n
        self._merge(b, b.prev)
        self._merge(b, b.next)
        self._ins(b)
        self.reserved += n

    def _grow_expandable(self, size, stream, small, pool, new_segment):
        def takeable(b):
            return b is not None and not b.allocated and b.events == 0

        def room(b):
            n = 0
            while n < size and takeable(b):
                n, b = n + b.size, b.next
            return n >= size

        cand = None
        for t in self.unmapped[pool, small]:
            if t[0] != stream:
                continue
            c = t[3].prev if takeable(t[3].prev) else t[3]
            if room(c):
                cand = c
                break
        if cand is None:
            base = new_segment()
            seg = Segment(base, 1 << 50, SMALL_BUFFER if small else LARGE_BUFFER)
            cand = Block(base, seg.size, stream, small, seg, False, pool)
            self._uins(cand)
        if not cand.mapped:
            self._map(cand, min(cand.size, size))
        while cand.size < size:
            nxt = cand.next
            self._map(nxt, min(size - cand.size, nxt.size))
            cand = nxt
        self._rm(cand)
        return cand

    def _release_segment(self, b):
        self._rm(b)
        del self.segments[b.ptr]
        self.reserved -= b.size

    def _gc(self):
        thresh = int(self.cfg.gc * self.cfg.allowed)
        if self.reserved <= thresh:
            return
        target = self.reserved - thresh
        # the default pool's large blocks only
        cands = [t[4] for t in self.cached[0, False] if not t[4].prev and not t[4].next
                 and not self.cfg.expandable]
        if not cands:
            return

        def age(b):
            return self.lookups[0, False] - b.gc_base

        total_age, n, done, freed = sum(age(b) for b in cands), len(cands), 0, True
        while done < target and freed and n > 0:
            threshold = total_age / n
            freed = False
            for b in list(cands):
                if age(b) >= threshold:
                    freed = True
                    done += b.size
                    total_age -= age(b)
                    n -= 1
                    cands.remove(b)
                    self._release_segment(b)

    def _release_available(self, size, stream, small, pool):
        mss = self.cfg.mss
        if mss == NO_LIMIT or self.cfg.expandable:
            return False
        key = max(size, mss)
        lst = self.cached[pool, small]
        i = bisect.bisect_left(lst, (stream, key, 0, 0))
        if i < len(lst) and lst[i][0] == stream:
            self._release_segment(lst[i][4])
            return True
        if i == 0:
            return False
        released, i = 0, i - 1
        while released < key and lst[i][1] >= mss and lst[i][0] == stream:
            b, first = lst[i][4], i == 0
            self._release_segment(b)
            released += b.size
            if first:
                break
            i -= 1
        return released >= key

    def _unmap(self, b):
        seg = b.seg
        off = b.ptr - seg.base
        lo = -(-off // seg.page) * seg.page
        hi = (off + b.size) // seg.page * seg.page
        if hi <= lo:
            return
        self._rm(b)
        if lo > off:
            before = Block(b.ptr, lo - off, b.stream, b.small, seg, True, b.pool)
            self._link_before(before, b)
            self._ins(before)
        if off + b.size > hi:
            after = Block(seg.base + hi, off + b.size - hi, b.stream, b.small, seg, True, b.pool)
            self._link_after(after, b)
            self._ins(after)
        b.ptr, b.size, b.mapped = seg.base + lo, hi - lo, False
        self._merge(b, b.prev)
        self._merge(b, b.next)
        self._uins(b)
        self.reserved -= hi - lo

    def empty_cache(self):
        """release_cached_blocks({0,0}): events first, then the default pool's large blocks, then
        its small ones. A live MemPool's (use_count > 0) are kept."""
        self.process_events(wait=True)
        for small in (False, True):
            blocks = [t[4] for t in self.cached[0, small]]
            for b in blocks:
                if b.seg.page is not None:
                    self._unmap(b)
                    if not b.prev and not b.next:
                        self._urm(b)  # the whole address range goes
                elif not b.prev and not b.next:
                    self._release_segment(b)

    # -- the calls
    def process_events(self, wait=False):
        keep = []
        for b, evs in self.pending:
            evs = [] if wait else [e for e in evs if self.completed.get(e[0], 0) < e[1]]
            if evs:
                keep.append([b, evs])
            else:
                b.events = 0
                self._free_block(b)
        self.pending = keep

    def malloc(self, orig, stream, call, pool=0):
        """Expects what PyTorch's malloc does, in the default pool or a MemPool routed to (pool
        n); call() makes the real allocation (it raises on OOM). Returns the address, or None
        after an expected OOM."""
        self.process_events()
        size = round_size(self.cfg, orig)
        small = size <= SMALL_SIZE
        got = []

        def new_segment():
            got.append(call())  # a new segment: the block starts at its base
            return got[0]

        b = self._get_free_block(size, stream, small, pool)
        if b is None:
            alloc_size = allocation_size(size)
            if self.gc_on:
                self._gc()
            ok = self._fits_fraction(alloc_size)
            if not ok and pool == 0 and not self.cfg.expandable:
                # try_mempool_fallback: a free block of a use_on_oom pool, in the pools' order,
                # for a request of the default pool only (an expandable pool's blocks are
                # passed over: the search runs with expandable segments inactive)
                for pi in sorted(self.use_on_oom):
                    b = self._get_free_block(size, stream, small, pi)
                    if b is not None:
                        break
        if b is None:
            if not ok and self._release_available(size, stream, small, pool):
                ok = self._fits_fraction(alloc_size)
            if not ok:
                self.empty_cache()
                self.retries += 1
                ok = self._fits_fraction(alloc_size)
            if not ok:
                self.ooms += 1
                return None
            if self.cfg.expandable:
                b = self._grow_expandable(size, stream, small, pool, new_segment)
            else:
                base = new_segment()
                for s in self.segments.values():
                    assert not s.base <= base < s.base + s.size, "a new segment was expected"
                self.segments[base] = Segment(base, alloc_size)
                self.reserved += alloc_size
                b = Block(base, alloc_size, stream, small, self.segments[base], True, pool)
        if self._should_split(b, size):
            rest = Block(b.ptr + size, b.size - size, stream, small, b.seg, True, b.pool)
            self._link_after(rest, b)
            b.size = size
            self._ins(rest)
        b.allocated, b.requested = True, orig
        self.live[b.ptr] = b
        ptr = got[0] if got else call()
        assert ptr == b.ptr, ("placement", hex(ptr), hex(b.ptr), orig, size, stream)
        return ptr

    def record_stream(self, ptr, stream):
        b = self.live[ptr]
        if stream != b.stream:
            b.uses.add(stream)

    def synchronize(self, stream):
        self.completed[stream] = self.recorded.get(stream, 0)

    def free(self, ptr):
        b = self.live.pop(ptr)
        b.allocated = False
        if b.uses:
            evs = []
            for s in sorted(b.uses):
                self.recorded[s] = self.recorded.get(s, 0) + 1
                evs.append((s, self.recorded[s]))
            b.uses, b.events = set(), len(evs)
            self.pending.append([b, evs])
        else:
            self._free_block(b)

    def _free_block(self, b):
        self._merge(b, b.prev)
        self._merge(b, b.next)
        self._ins(b)

    def stats(self):
        """The figures memory_stats must show (keys as PyTorch names them)."""
        live = list(self.live.values())
        waiting = [b for b, _ in self.pending]
        exp = self.cfg.expandable
        split = [t[4] for lst in self.cached.values() for t in lst
                 if (t[4].prev or t[4].next) and t[4].seg.page is None]
        return {
            "reserved_bytes.all.current": self.reserved,
            "segment.all.current": 0 if exp else len(self.segments),
            "allocated_bytes.all.current": sum(b.size for b in live),
            "allocation.all.current": len(live),
            "active_bytes.all.current": sum(b.size for b in live + waiting),
            "requested_bytes.all.current": sum(b.requested for b in live + waiting),
            "inactive_split.all.current": len(split),
            "inactive_split_bytes.all.current": sum(b.size for b in split),
            "oversize_allocations.current": sum(1 for b in live if b.size >= self.cfg.mss),
            "oversize_segments.current": sum(1 for s in self.segments.values()
                                             if s.size >= self.cfg.mss),
            "num_alloc_retries": self.retries,
            "num_ooms": self.ooms,
        }


def drive(sp, cfg, seed, steps, mempools=()):
    """Random calls on three streams, to sympool and to the model, a third of the allocations
    routed to one of the MemPools made from `mempools` ((use_on_oom, no_split) each), if any;
    after every call, the model's figures must be memory_stats'. Returns how many OOMs and
    retries the run saw."""
    import random
    rng = random.Random(seed)
    streams = [None, sp.Stream(), sp.Stream()]
    pools = [None] + [sp.MemPool(use_on_oom=u, no_split=n) for u, n in mempools]
    sp.empty_cache()
    sp.reset_accumulated_memory_stats()
    m = Model(cfg, [i + 1 for i, f in enumerate(mempools) if f[0]],
              [i + 1 for i, f in enumerate(mempools) if f[1]])
    live = []
    try:
        for step in range(steps):
            r = rng.random()
            if r < 0.5 or not live:
                c = rng.random()
                n = (rng.randint(1, MB) if c < 0.5 else rng.randint(MB + 1, 10 * MB) if c < 0.8
                     else rng.randint(10 * MB, 60 * MB))
                si = rng.randrange(3)
                pi = rng.randrange(1, len(pools)) if mempools and rng.random() < 1 / 3 else 0

                def call():
                    if not pi:
                        return sp.malloc(n, stream=streams[si])
                    with sp.use_mem_pool(pools[pi]):
                        return sp.malloc(n, stream=streams[si])

                try:
                    p = m.malloc(n, si, call, pi)
                except sp.OutOfMemoryError:
                    raise AssertionError(("an OOM the model did not expect", seed, step, n))
                if p is None:  # the model's OOM: sympool's must come too
                    try:
                        live.append(call())
                    except sp.OutOfMemoryError:
                        pass
                    else:
                        raise AssertionError(("an OOM was expected", seed, step, n))
                else:
                    live.append(p)
            elif r < 0.9:
                p = live.pop(rng.randrange(len(live)))
                sp.free(p)
                m.free(p)
            elif r < 0.95:
                p, si = rng.choice(live), rng.randrange(1, 3)
                sp.record_stream(p, streams[si])
                m.record_stream(p, si)
            elif r < 0.98:
                si = rng.randrange(1, 3)
                streams[si].synchronize()
                m.synchronize(si)
            else:
                sp.empty_cache()
                m.empty_cache()
            st = sp.memory_stats()
            want = m.stats()
            got = {k: st[k] for k in want}
            assert got == want, (seed, step, {k: (got[k], want[k]) for k in want
                                              if got[k] != want[k]})
        return m.ooms, m.retries
    finally:
        for p in live:
            sp.free(p)
        for s in streams[1:]:
            s.synchronize()
            s.destroy()
        for pool in pools[1:]:
            pool.destroy()
        sp.empty_cache()
