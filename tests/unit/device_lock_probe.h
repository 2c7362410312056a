/* device_lock_probe.h: see device_lock_probe.c. */
#ifndef SP_DEVICE_LOCK_PROBE_H
#define SP_DEVICE_LOCK_PROBE_H
#ifdef __cplusplus
extern "C" {
#endif
/* Take and give back device `device`'s allocator lock (sympool initialized, device valid), and
 * how many threads wait for it (in the lock's slow path). */
void sp_probe_device_lock(int device);
void sp_probe_device_unlock(int device);
int sp_probe_device_lock_waiting(int device);
#ifdef __cplusplus
}
#endif
#endif
