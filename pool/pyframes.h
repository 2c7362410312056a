/*
 * pyframes.h: the Python frames hook's keyed form (pyframes.c), for history.c's capture.
 */
#ifndef SP_POOL_PYFRAMES_H
#define SP_POOL_PYFRAMES_H

#include <stddef.h>
#include <stdint.h>

#include "sympool/history.h"

#ifdef __cplusplus
extern "C" {
#endif

/* sp_history_python_frames, also writing each frame's key to keys[i] (keys may be NULL): a
 * number that stands for the frame's name, file name and line and for no other, never reused in
 * the process, or 0 for a frame read without the frame cache. Two frames with one nonzero key
 * read the same; frames that read the same may have different keys. */
size_t sp__python_frames_keyed(sp_history_frame_t *frames, uint64_t *keys, size_t max_frames,
                               void *arg);

#ifdef __cplusplus
}
#endif

#endif /* SP_POOL_PYFRAMES_H */
