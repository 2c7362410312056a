/*
 * torch.h: private to pool/torch.c and its white-box tests.
 */
#ifndef SP_POOL_TORCH_H
#define SP_POOL_TORCH_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Tests only: let the PyTorch entry points serve the host backend, so that their routing, stream
 * and record-stream logic can be tested without a GPU. Never set by the library itself: PyTorch
 * would use host memory as device memory. */
void sp__torch_allow_host(bool allow);
/* Tests: segments from sp_torch_segment_malloc not yet freed. */
long sp__torch_live_segments(void);
/* sp_shutdown, before the backend's fini: memory_released says that the fini gives back every
 * allocation still live (the host backend unmaps them), sp_torch_segment_malloc's segments
 * included. Their entries then go: the next session may hand out their addresses again (its own
 * segments, a new PyTorch segment), and a late sp_torch_segment_free of an old segment would free
 * that. CUDA's fini frees nothing: a segment stays allocated and listed, so a free after the next
 * sp_init still gives it back. */
void sp__torch_session_end(bool memory_released);
/* fork.c's prepare and release: the segment registry's lock (a leaf), so that a child forked
 * while another thread is inside the segment entry points does not inherit it held. */
void sp__torch_fork_lock(void);
void sp__torch_fork_unlock(void);

#ifdef __cplusplus
}
#endif

#endif /* SP_POOL_TORCH_H */
