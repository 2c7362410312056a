/* expandable_probe.h: the C probe of the expandable segments' unmapped lists
 * (expandable_probe.c). */
#ifndef SP_TEST_EXPANDABLE_PROBE_H
#define SP_TEST_EXPANDABLE_PROBE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Check every block pool of `device`'s pools: its unmapped list holds exactly the unmapped blocks
 * of its segments, in strictly increasing (stream, address) order, with consistent links (the
 * order find_room's lowest-address rule walks). Returns the blocks on the lists, or -1 with what
 * is wrong in msg. The caller holds no lock and runs no other thread. */
long sp_test_exp_check_unmapped(int device, char *msg, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
