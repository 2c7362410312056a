"""world: the MPI world over mpi4py, collectives on sympool memory, stats across ranks.

World(comm) wraps sp_world_from_comm on an mpi4py communicator (COMM_WORLD by default; the caller
keeps owning MPI); World.init() lets sympool initialize MPI (and finalize it in finalize()).
Every method here is collective over the world, like the C calls under it. A rank whose Python
arguments are wrong still joins the call with an argument the library refuses, so that every rank
gets an error instead of the others waiting for it; that rank then raises its own ValueError or
TypeError.
"""

import ctypes
import io
import sys
import threading

from . import _lib
from ._array import DTYPES, ITEMSIZE, describe, dtype_name
from ._lib import as_device, as_int, as_size, as_stream, bad_value, check, lib, stats_keys

OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}  # sp_redop_t
FORMATS = {"table": 0, "json": 1, "prometheus": 2, "table_all": 3}  # sp_report_format_t
_BAD_DTYPE = 1 << 20  # out of range: the library refuses it on this rank, and so on every rank
_NONE = object()  # _collective's op / root of a call that has none (None is a caller's bad value)


def _mpi():
    """mpi4py's MPI module, or an ImportError that says what needs it."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError(f"sympool.World(comm) needs mpi4py ({e}): install it (python3 -m pip "
                          "install mpi4py, or the system's python3-mpi4py), or use "
                          "sympool.World.init(), which initializes MPI itself") from None
    return MPI


def _need(name):
    if not _lib.has(name):
        raise _lib.SympoolError("SP_ERR_NOT_SUPPORTED",
                                f"{name}: this libsympool.so was built without MPI")


def _op(op):
    """"sum" (any case), mpi4py's MPI.SUM/PROD/MIN/MAX, or torch.distributed's ReduceOp.SUM/
    PRODUCT/MIN/MAX/AVG -> sp_redop_t."""
    if isinstance(op, str):
        name = op.lower()
    elif type(op).__module__.startswith("mpi4py") and type(op).__name__ == "Op":
        from mpi4py import MPI
        names = ((MPI.SUM, "sum"), (MPI.PROD, "prod"), (MPI.MIN, "min"), (MPI.MAX, "max"))
        name = next((n for o, n in names if op == o), None)  # Op is not hashable
        if name is None:
            raise bad_value(f"op {op!r}: only MPI.SUM, MPI.PROD, MPI.MIN and MPI.MAX reduce here")
    elif "ReduceOp" in type(op).__name__ or "RedOpType" in type(op).__name__:
        name = str(op).rsplit(".", 1)[-1].lower()
        name = {"product": "prod"}.get(name, name)
    else:
        raise TypeError(f"op must be a str such as 'sum' or an mpi4py.MPI.Op, not "
                        f"{type(op).__name__}")
    if name not in OPS:
        raise bad_value(f"op {op!r} is not one of {', '.join(OPS)}")
    return OPS[name]


def _comm_handle(comm):
    """(ctypes type, value) of comm's MPI_Comm handle as mpi4py sees it."""
    MPI = _mpi()
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py.MPI.Comm, not {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise bad_value("comm is MPI.COMM_NULL")
    # mpi4py 3 has MPI._handleof; mpi4py 4 also has Comm.handle.
    handle = MPI._handleof(comm) if hasattr(MPI, "_handleof") else comm.handle
    # Open MPI's MPI_Comm is a pointer, MPICH's an int: the handle's size tells which.
    ctype = ctypes.c_void_p if MPI._sizeof(MPI.Comm) == ctypes.sizeof(ctypes.c_void_p) \
        else ctypes.c_int
    return ctype, handle


class World(_lib.Handle):
    """The MPI world: rank, size, local rank and the device this rank uses. Not picklable nor
    copyable (a copy would finalize the world a second time)."""

    def __init__(self, comm=None, *, _handle=None):
        self._pools = []  # symmetric pools made on this world (released by finalize)
        self._handle = None
        self._lock = threading.RLock()  # finalize() runs once
        if _handle is not None:
            self._handle = _handle
            return
        _need("sp_world_from_comm")
        if comm is None:
            comm = _mpi().COMM_WORLD
        ctype, value = _comm_handle(comm)
        fn = lib().sp_world_from_comm
        fn.restype, fn.argtypes = ctypes.c_int, [ctype, ctypes.POINTER(ctypes.c_void_p)]
        w = ctypes.c_void_p()
        check(fn(value, ctypes.byref(w)))
        self._handle = w.value
        self._comm = comm

    @classmethod
    def init(cls):
        """sp_world_init: sympool initializes MPI itself if nobody did (and finalize() then
        finalizes it, unless a rank missed its deadline: MPI_Finalize would wait for that rank;
        a failed init leaves MPI initialized too)."""
        _need("sp_world_init")
        w = ctypes.c_void_p()
        check(lib().sp_world_init(None, None, ctypes.byref(w)))
        return cls(_handle=w.value)

    def _check_open(self):
        if self._handle is None:
            raise _lib.SympoolError("SP_ERR_INVALID_USAGE", "this World was finalized")
        return self._handle

    @property
    def rank(self):
        return int(lib().sp_world_rank(self._check_open()))

    @property
    def size(self):
        return int(lib().sp_world_size(self._check_open()))

    @property
    def local_rank(self):
        return int(lib().sp_world_local_rank(self._check_open()))

    @property
    def device(self):
        return int(lib().sp_world_device(self._check_open()))

    @property
    def local_size(self):
        """Ranks on this rank's node."""
        return int(lib().sp_world_local_size(self._check_open()))

    @property
    def node_count(self):
        """Nodes the world spans (MPI's shared-memory groups, numbered by their lowest rank)."""
        return int(lib().sp_world_node_count(self._check_open()))

    def node(self, rank=None):
        """The node of `rank` (this rank by default)."""
        h = self._check_open()
        r = self.rank if rank is None else as_int(rank, "rank")
        # Checked here, before the C int it becomes: 2**32 would be cut to rank 0.
        n = int(lib().sp_world_node(h, r)) if 0 <= r < self.size else -1
        if n < 0:
            raise bad_value(f"rank {r} is outside the world (0..{self.size - 1})")
        return n

    def node_name(self, node=None):
        """The host name of `node` (this rank's node by default)."""
        h = self._check_open()
        k = self.node() if node is None else as_int(node, "node")
        name = lib().sp_world_node_name(h, k) if 0 <= k < self.node_count else None
        if name is None:
            raise bad_value(f"node {k} is outside 0..{self.node_count - 1}")
        return name.decode()

    def finalize(self):
        """Collective: free the world (and its symmetric pools); finalizes MPI only if
        World.init initialized it."""
        if self._handle is None:
            return
        with self._lock:  # two threads finalizing one world: the second does nothing
            if self._handle is None:
                return
            status = lib().sp_world_finalize(self._handle)
            # A failed finalize frees the world too (a peer late or gone, a broken world, MPI
            # finalized first) unless it refused before touching it: the handle is then stale,
            # and a new World may get its address. A live world answers a size of at least 1.
            if status == 0 or lib().sp_world_size(self._handle) == 0:
                for pool in self._pools:
                    pool._released()  # released with the world
                self._pools = []
                self._handle = None
            check(status)

    def create_symmetric_pool(self, params, pool):
        """Collective: sp_symmetric_mempool_create with params (an _lib.MemPoolParams); returns
        the handle. pool (the Python MemPool) is released by finalize(). MemPool(symmetric=True,
        world=...) calls this."""
        h = self._check_open()
        _need("sp_symmetric_mempool_create")
        handle = ctypes.c_void_p()
        check(lib().sp_symmetric_mempool_create(h, ctypes.byref(params), ctypes.byref(handle)))
        self._pools.append(pool)
        return handle.value

    def _join_refused_create(self):
        """Join a symmetric create this rank refused by itself (MemPool's checks): the library
        refuses a NULL pool_p on this rank and, through the call's agreement, on every rank."""
        if self._handle is not None and _lib.has("sp_symmetric_mempool_create"):
            lib().sp_symmetric_mempool_create(self._handle, None, None)

    def destroy_symmetric_pool(self, handle, pool):
        """Collective: sp_symmetric_mempool_destroy; forget pool."""
        check(lib().sp_symmetric_mempool_destroy(handle))
        if pool in self._pools:
            self._pools.remove(pool)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finalize()

    def __repr__(self):
        if self._handle is None:
            return "<sympool.World finalized>"
        return (f"<sympool.World rank={self.rank} size={self.size} "
                f"local_rank={self.local_rank} device={self.device}>")

    # ---- collectives ------------------------------------------------------------------------

    def _collective(self, name, send, recv, count, dtype, count_from, op=_NONE, root=_NONE,
                    stream=None):
        """Convert the arguments; on a bad one, join the call with an out-of-range dtype (every
        rank fails) and raise the local error after. count_from: "send" or "recv", the buffer
        whose size gives count when count is None."""
        h = self._check_open()
        _need(name)
        try:
            # send is written only in place (recv None); recv always is.
            sp, s_count, s_dtype = describe(send, "send", writable=recv is None)
            if recv is None:
                rp, r_count, r_dtype = sp, s_count, s_dtype  # in place
            else:
                rp, r_count, r_dtype = describe(recv, "recv")
            if root is not _NONE:
                r = as_int(root, "root")
                if not 0 <= r < self.size:
                    raise bad_value(f"root {r} is not a rank of this world (size {self.size})")
            # A broadcast reads send on its root only (the library ignores it elsewhere, where it
            # may be None): off the root, recv alone bounds the call and gives its count.
            send_unread = root is not _NONE and r != self.rank and recv is not None
            if send_unread:
                count_from = "recv"
            dt = dtype_name((s_dtype or r_dtype or "float32") if dtype is None else dtype)
            isz = ITEMSIZE[dt]
            # The bytes each object holds (None for a bare address): a count or dtype given
            # with an object must fit in it. The library checks only the sympool allocation,
            # which may be larger than the object (a view, a tensor in a bigger block): the
            # collective would write past the object into its neighbours.
            s_bytes = None if s_count is None else s_count * ITEMSIZE[s_dtype]
            r_bytes = None if r_count is None else r_count * ITEMSIZE[r_dtype]
            if count is None:
                held = s_bytes if count_from == "send" else r_bytes
                if held is None:
                    raise TypeError(f"count is needed: the {count_from} buffer is an address")
                if held % isz:
                    raise bad_value(f"the {count_from} buffer's {held} bytes are not a whole "
                                    f"number of {dt} elements")
                count = held // isz  # as mpi4py infers it from [buf, datatype]
            n = as_size(count, "count")
            if s_bytes is not None or r_bytes is not None:
                k = self.size
                need = {"sp_allgather": (n, n * k), "sp_reduce_scatter": (n * k, n)}.get(name,
                                                                                           (n, n))
                for what, held, elems in (("send", s_bytes, need[0]), ("recv", r_bytes, need[1])):
                    if what == "send" and send_unread:
                        continue
                    if held is not None and elems * isz > held:
                        raise bad_value(f"{what} buffer holds {held} bytes; {name[3:]} of {n} x "
                                        f"{dt} needs {elems * isz} there")
            args = [sp, rp, n, DTYPES[dt]]
            if op is not _NONE:
                args.append(_op(op))
            if root is not _NONE:
                args.append(r)
            args.append(as_stream(stream))
        except Exception as e:  # any: a destroyed Stream is a SympoolError, a buffer object's
            # description may raise anything; this rank must join the call all the same
            poison = [None, None, 1, _BAD_DTYPE] + ([0] if op is not _NONE else []) + \
                     ([0] if root is not _NONE else []) + [None]
            getattr(lib(), name)(h, *poison)
            raise e
        check(getattr(lib(), name)(h, *args))

    # Buffers: sympool memory of this rank's device, as an int address or an object that
    # describes itself (a torch or CuPy tensor, anything with __cuda_array_interface__, __dlpack__
    # or the buffer protocol); count and dtype then default to the object's. recv=None: in place.
    # A read-only object (memoryview.toreadonly(), __cuda_array_interface__ data (ptr, True)) is
    # taken where the call only reads it (send, with a recv) and refused where it writes.
    # op: "sum", "prod", "min", "max", "avg", or mpi4py's MPI.SUM-style ops.

    def allreduce(self, send, recv=None, count=None, dtype=None, op="sum", stream=None):
        """Reduce count elements of every rank's send into every rank's recv."""
        self._collective("sp_allreduce", send, recv, count, dtype, "send", op=op, stream=stream)

    def allgather(self, send, recv, send_count=None, dtype=None, stream=None):
        """Gather send_count elements of every rank's send into recv, in rank order."""
        self._collective("sp_allgather", send, recv, send_count, dtype, "send", stream=stream)

    def reduce_scatter(self, send, recv, recv_count=None, dtype=None, op="sum", stream=None):
        """Reduce send across ranks; rank r gets the r-th block of recv_count elements."""
        self._collective("sp_reduce_scatter", send, recv, recv_count, dtype, "recv", op=op,
                         stream=stream)

    def broadcast(self, send, recv=None, count=None, dtype=None, root=0, stream=None):
        """Root's send to every rank's recv. Off the root send is not read (it may be None):
        recv gives the count there, and recv=None makes send the recv (in place)."""
        self._collective("sp_broadcast", send, recv, count, dtype, "send", root=root,
                         stream=stream)

    # ---- statistics across ranks ------------------------------------------------------------

    def stats_aggregate(self, device=None):
        """Every stats key across ranks: key -> {"min", "max", "sum", "min_rank", "max_rank"}
        (the lowest rank holding the min and the max): the memory_stats keys, then
        "device.used_bytes" and "device.untracked_bytes" (device memory in use by anyone, and
        the part sympool did not reserve). device: the world's device by default."""
        h = self._check_open()
        _need("sp_stats_aggregate")
        try:
            d = self.device if device is None else as_device(device)
        except (TypeError, ValueError) as e:
            lib().sp_stats_aggregate(h, -1, ctypes.byref(_lib.StatsSummary()))
            raise e
        s = _lib.StatsSummary()
        check(lib().sp_stats_aggregate(h, d, ctypes.byref(s)))
        L = lib()
        keys = [L.sp_stats_summary_key(i).decode() for i in range(L.sp_stats_summary_count())]
        return {k: {"min": s.min[i], "max": s.max[i], "sum": s.sum[i],
                    "min_rank": s.min_rank[i], "max_rank": s.max_rank[i]}
                for i, k in enumerate(keys)}

    def stats_report(self, format="table", file=None, device=None):
        """Aggregate the stats and write the report on rank 0 to file (sys.stdout by default):
        "table" for people, "json" (one object), "prometheus" (text exposition). Other ranks
        write nothing. "table_all" lists every key. Returns the text on rank 0, None elsewhere."""
        h = self._check_open()
        _need("sp_stats_report")
        try:
            if not isinstance(format, str):
                raise TypeError(f"format must be a str, not {type(format).__name__}")
            if format not in FORMATS:
                raise bad_value(f"format {format!r} is not one of {', '.join(FORMATS)}")
            if file is not None and not callable(getattr(file, "write", None)):
                raise TypeError("file must have a write() method (a text file)")
            d = self.device if device is None else as_device(device)
        except (TypeError, ValueError) as e:
            lib().sp_stats_report(h, -1, None, 0)
            raise e
        text = _report_text(h, d, FORMATS[format])
        if text is None:
            return None
        out = sys.stdout if file is None else file
        if _binary(out):
            out.write(text.encode())
        else:
            out.write(text)
        if hasattr(out, "flush"):
            out.flush()
        return text


def _binary(out):
    """Whether out takes bytes: a binary stream (io.BytesIO and gzip.GzipFile have no str .mode:
    none at all, an int), or a file-like object whose .mode says "b"."""
    if isinstance(out, io.TextIOBase):
        return False
    if isinstance(out, (io.RawIOBase, io.BufferedIOBase)):
        return True
    mode = getattr(out, "mode", None)
    return isinstance(mode, str) and "b" in mode


def _libc():
    c = ctypes.CDLL(None)
    c.open_memstream.restype = ctypes.c_void_p
    c.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
    c.fclose.argtypes = [ctypes.c_void_p]
    c.free.argtypes = [ctypes.c_void_p]
    return c


def _report_text(h, device, fmt):
    """sp_stats_report into memory (open_memstream), so Python writes it where the caller asked,
    in order with the rest of Python's output. None on ranks other than 0."""
    libc = _libc()
    buf, size = ctypes.c_void_p(), ctypes.c_size_t()
    fp = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not fp:
        raise _lib.SympoolError("SP_ERR_SYSTEM", "open_memstream failed")
    try:
        status = lib().sp_stats_report(h, device, fp, fmt)
        err = _lib.last_error() if status else ""
    finally:
        libc.fclose(fp)
    try:
        text = ctypes.string_at(buf.value, size.value).decode(errors="replace") if buf.value else ""
    finally:
        libc.free(buf)
    if status:
        name = _lib.status_name(status)
        raise _lib._ERROR_CLASSES.get(name, _lib.SympoolError)(name, err)
    return text if lib().sp_world_rank(h) == 0 else None
