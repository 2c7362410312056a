/* gap_array_probe.h: the C probe of core/gap_array.h (gap_array_probe.c). */
#ifndef SP_TEST_GAP_ARRAY_PROBE_H
#define SP_TEST_GAP_ARRAY_PROBE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An empty array's upper(5), lower(5), upper(UINT64_MAX) and n after drop_zero_vals. */
void sp_test_gap_probe_empty(uint32_t out[4]);

#ifdef __cplusplus
}
#endif

#endif
