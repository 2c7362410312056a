#!/usr/bin/env python3
"""frag_model.py: an idealized model of fragmentation under expandable segments, to try a
placement rule on recorded traces in a second before writing it in C.

The model: device 0's `alloc` and `free_requested` entries of a PyTorch snapshot (a trace that
starts from an empty cache; frees of blocks it never saw allocated are skipped), every request
rounded up to 512 bytes, one address space (streams and the small and large pools merged), pages
of 2 MiB and ideal recycling: a page is mapped exactly while a live block touches it, so what
stays mapped beyond the live bytes is the pieces under a page beside live blocks. A request no
free range holds grows the top of the address space. It leaves out what the allocator adds
(ALIGN, FIT_END, WHOLE, BORROW, SHARED, the small pool's own pages), so its figures are not
replay's: a way to compare rules, not a prediction.

For each trace and policy it prints peak mapped pages x 2 MiB / peak allocated bytes.

    python3 bench/frag_model.py [--policies best,side,...] TRACE.pickle...

Policies (which free range a request takes, and at which end):
  best          best fit, the range's start (PyTorch's rule)
  side          best fit, the end when that needs fewer new pages (SYMPOOL_EXPANDABLE_SIDE)
  first         the lowest-address range that holds it, its start
  exact-first   an exact fit, else the lowest-address range, then as `side`
  tile          as `side`, but the smallest of the 8 next larger ranges whose leftover is a
                multiple of the request when best fit's is not
  oracle-side   best fit; the end whose live neighbour is freed nearest in time to the request
                (the trace's own free times: clairvoyant), fewer new pages first
  oracle-range  any range and end: the live neighbour freed nearest in time (clairvoyant),
                then the least leftover
  size-range    oracle-range with each request's lifetime guessed as the median lifetime of the
                requests of its size freed so far (an online rule)
  split16       two address spaces, `side` in each: a request goes to the second when blocks of
                its size were freed within 16 events of their allocation more than twice as often
                as they outlived 16 events (an online guess of a temporary), else to the first
  split64       the same with 64 events
  ctx1, ctx2, ctx4  split64, with the guess kept per size and the 1, 2 or 4 sizes requested just
                before it (the place in the program, as far as the sequence of requests tells)

A policy followed by `+mesh` (e.g. `side+mesh`) prints a bound instead: what the pages would be if
partly used pages whose live bytes (at 512-byte grain) do not overlap shared one physical page, as
Mesh (Powers et al., PLDI 2019) does for CPU heaps and CUDA's virtual memory API would allow (one
cuMemCreate handle mapped at several addresses). The pages are packed anew at each moment (first
fit, fullest first), so it is an offline bound: a real allocator would have to copy live blocks
between pages. It is taken at every allocation that leaves the allocated bytes within 1.5% of their
peak, and divided by the peak allocated.
"""

import bisect
import collections
import pickle
import sys

PAGE = 2 << 20
NEVER = 1 << 60


def load(path):
    """(action, recorded address, size) of device 0's allocs and frees, and each alloc's free
    time (index of its free, NEVER when it outlives the trace)."""
    with open(path, "rb") as f:
        snap = pickle.load(f)
    traces = snap.get("device_traces") or [[]]
    ev = []
    for e in traces[0]:
        if e["action"] == "alloc":
            ev.append(("a", e["addr"], (e["size"] + 511) // 512 * 512))
        elif e["action"] == "free_requested":
            ev.append(("f", e["addr"], 0))
    death = [NEVER] * len(ev)
    open_ = {}
    for i, (act, addr, _) in enumerate(ev):
        if act == "a":
            open_[addr] = i
        elif addr in open_:
            death[open_.pop(addr)] = i
    return ev, death


class Space:
    def __init__(self):
        self.free = {}  # start -> size
        self.free_end = {}  # end -> start
        self.live = {}  # start -> size
        self.dies = {}  # start -> free time (index) of a live block
        self.top = 0
        self.pages = collections.Counter()
        self.mapped = self.allocated = self.peak_mapped = self.peak_allocated = 0

    def touch(self, a, n, d):
        for p in range(a // PAGE, (a + n - 1) // PAGE + 1):
            self.pages[p] += d
            if d > 0 and self.pages[p] == 1:
                self.mapped += 1
            elif d < 0 and self.pages[p] == 0:
                del self.pages[p]
                self.mapped -= 1

    def new_pages(self, a, n):
        return sum(1 for p in range(a // PAGE, (a + n - 1) // PAGE + 1) if p not in self.pages)

    def neighbour_dies(self, start, at_end, size):
        """Free time of the live block the request touches: before the range's start, or after
        its end (at_end)."""
        if at_end:
            return self.dies.get(start + size)
        for a, n in self.live.items():
            if a + n == start:
                return self.dies[a]
        return None

    def _unfree(self, a):
        n = self.free.pop(a)
        del self.free_end[a + n]
        return n

    def _add_free(self, a, n):
        if n:
            self.free[a] = n
            self.free_end[a + n] = a

    def malloc(self, n, dies, choose):
        fits = sorted((sz, a) for a, sz in self.free.items() if sz >= n)
        pick = choose(self, n, fits, dies) if fits else None
        if pick is None:
            a = self.free_end.get(self.top, self.top)
            if a != self.top:
                self._unfree(a)
            self.top = a + n
        else:
            start, at_end = pick
            sz = self._unfree(start)
            a = start + sz - n if at_end else start
            self._add_free(start if at_end else start + n, sz - n)
        self.live[a] = n
        self.dies[a] = dies
        self.touch(a, n, 1)
        self.allocated += n
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_mapped = max(self.peak_mapped, self.mapped)
        return a

    def release(self, a):
        n = self.live.pop(a)
        del self.dies[a]
        self.touch(a, n, -1)
        self.allocated -= n
        if a in self.free_end:
            b = self.free_end[a]
            n += self._unfree(b)
            a = b
        if a + n in self.free:
            n += self._unfree(a + n)
        if a + n == self.top:
            self.top = a
        else:
            self._add_free(a, n)


def side_of(s, n, sz, a):
    return s.new_pages(a + sz - n, n) < s.new_pages(a, n)


def best(s, n, fits, dies):
    return fits[0][1], False


def side(s, n, fits, dies):
    sz, a = fits[0]
    return a, side_of(s, n, sz, a)


def first(s, n, fits, dies):
    return min(a for _, a in fits), False


def exact_first(s, n, fits, dies):
    sz, a = fits[0] if fits[0][0] == n else min(fits, key=lambda f: f[1])
    return a, side_of(s, n, sz, a)


def tile(s, n, fits, dies):
    sz, a = fits[0]
    if (sz - n) % n:
        for sz2, a2 in fits[1:9]:
            if (sz2 - n) % n == 0:
                sz, a = sz2, a2
                break
    return a, side_of(s, n, sz, a)


def gap(s, n, sz, a, at_end, dies):
    d = s.neighbour_dies(a, at_end, sz)
    return abs(dies - d) if d is not None else NEVER


def oracle_side(s, n, fits, dies):
    sz, a = fits[0]
    if sz == n:
        return a, False
    ns, ne = s.new_pages(a, n), s.new_pages(a + sz - n, n)
    if ns != ne:
        return a, ne < ns
    return a, gap(s, n, sz, a, True, dies) < gap(s, n, sz, a, False, dies)


def oracle_range(s, n, fits, dies):
    key = lambda f: (gap(s, n, f[0], f[1], f[2], dies), f[0] - n)
    sz, a, at_end = min(((sz, a, e) for sz, a in fits for e in (False, True)), key=key)
    return a, at_end


POLICIES = {
    "best": best,
    "side": side,
    "first": first,
    "exact-first": exact_first,
    "tile": tile,
    "oracle-side": oracle_side,
    "oracle-range": oracle_range,
    "size-range": oracle_range,
    "split16": None,
    "split64": None,
    "ctx1": None,
    "ctx2": None,
    "ctx4": None,
}


def run_split(path, window, context=0):
    """Predicted temporaries in a second address space (see split16); peak of both together.
    The guess is kept per size and the `context` sizes requested before it."""
    ev, death = load(path)
    kept, temp = Space(), Space()
    where = {}
    short, long_ = collections.Counter(), collections.Counter()
    young = collections.deque()  # (alloc index, recorded address, key), oldest first
    before = collections.deque(maxlen=context)  # the sizes requested last
    peak_mapped = peak_allocated = 0
    for i, (act, addr, n) in enumerate(ev):
        while young and i - young[0][0] > window:
            born, a, key = young.popleft()
            if a in where and where[a][2] == born:
                long_[key] += 1  # outlived the window
        if act == "a":
            key = (n,) + tuple(before)
            if context:
                before.append(n)
            s = temp if short[key] > 2 * long_[key] else kept
            where[addr] = (s, s.malloc(n, death[i], side), i, key)
            young.append((i, addr, key))
        elif addr in where:
            s, a, born, key = where.pop(addr)
            if i - born <= window:
                short[key] += 1
            s.release(a)
        peak_mapped = max(peak_mapped, kept.mapped + temp.mapped)
        peak_allocated = max(peak_allocated, kept.allocated + temp.allocated)
    return peak_mapped * PAGE / peak_allocated if peak_allocated else float("nan")


GRAIN = 512
FULL_PAGE = (1 << (PAGE // GRAIN)) - 1


def meshed_pages(s):
    """Physical pages if partly used pages with disjoint live grains shared one (first fit,
    fullest first); whole pages are their own."""
    used = collections.defaultdict(int)  # page -> bit mask of its live 512-byte grains
    for a, n in s.live.items():
        for p in range(a // PAGE, (a + n - 1) // PAGE + 1):
            lo = max(a, p * PAGE) - p * PAGE
            hi = min(a + n, (p + 1) * PAGE) - p * PAGE
            used[p] |= ((1 << ((hi - lo + GRAIN - 1) // GRAIN)) - 1) << (lo // GRAIN)
    whole = sum(1 for m in used.values() if m == FULL_PAGE)
    shared = []
    for m in sorted((m for m in used.values() if m != FULL_PAGE), key=lambda m: -bin(m).count("1")):
        for i, b in enumerate(shared):
            if b & m == 0:
                shared[i] = b | m
                break
        else:
            shared.append(m)
    return whole + len(shared)


def run_mesh(path, policy):
    ev, death = load(path)
    passes = []
    for _ in range(2):  # the first pass finds the peak allocated, the second measures near it
        s, where, worst = Space(), {}, 0
        for i, (act, addr, n) in enumerate(ev):
            if act == "a":
                where[addr] = s.malloc(n, death[i], POLICIES[policy])
                if passes and s.allocated >= 0.985 * passes[0]:
                    worst = max(worst, meshed_pages(s))
            elif addr in where:
                s.release(where.pop(addr))
        passes.append(s.peak_allocated)
    return worst * PAGE / passes[0] if passes[0] else float("nan")


def run(path, policy):
    if policy.endswith("+mesh"):
        return run_mesh(path, policy[: -len("+mesh")])
    if policy.startswith("split"):
        return run_split(path, int(policy[5:]))
    if policy.startswith("ctx"):
        return run_split(path, 64, int(policy[3:]))
    ev, death = load(path)
    s = Space()
    where = {}
    lifetimes = collections.defaultdict(list)  # size -> sorted lifetimes seen
    for i, (act, addr, n) in enumerate(ev):
        if act == "a":
            dies = death[i]
            if policy == "size-range":
                seen = lifetimes[n]
                dies = i + (seen[len(seen) // 2] if seen else NEVER)
            where[addr] = (s.malloc(n, dies, POLICIES[policy]), i, n)
        elif addr in where:
            a, born, n = where.pop(addr)
            bisect.insort(lifetimes[n], i - born)
            s.release(a)
    return s.peak_mapped * PAGE / s.peak_allocated if s.peak_allocated else float("nan")


def main():
    args = sys.argv[1:]
    policies = ["best", "side"]
    if len(args) >= 2 and args[0] == "--policies":
        policies = args[1].split(",")
        args = args[2:]
    if not args or any(p.removesuffix("+mesh") not in POLICIES for p in policies):
        sys.exit(__doc__)
    print("trace " + " ".join(policies))
    for path in args:
        print(path.rsplit("/", 1)[-1], " ".join("%.4f" % run(path, p) for p in policies))


if __name__ == "__main__":
    main()
