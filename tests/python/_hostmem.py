"""Host memory for the tests' Python segment allocators: on the host backend device memory is
host memory, so a segment is a page-aligned range of a ctypes buffer."""

import ctypes


def host_segment(bufs, size):
    """A page-aligned host range of size bytes, kept alive in bufs (by its address) until the
    pool frees it (bufs.pop(ptr))."""
    b = ctypes.create_string_buffer(size + 4096)
    a = (ctypes.addressof(b) + 4095) & ~4095
    bufs[a] = b
    return a
