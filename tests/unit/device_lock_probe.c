/*
 * device_lock_probe.c: a device's allocator lock for a test that stops another thread's call at
 * it (the call waits there while the test changes what the call will find under the lock).
 * pool/allocator.h is C11 (atomics), which C++ cannot include: the unit test calls this.
 */
#include "tests/unit/device_lock_probe.h"

#include "pool/allocator.h"

void sp_probe_device_lock(int device) {
    sp__lock(&sp__g.devs[device].lock);
}

void sp_probe_device_unlock(int device) {
    sp__unlock(&sp__g.devs[device].lock);
}

int sp_probe_device_lock_waiting(int device) {
    return atomic_load_explicit(&sp__g.devs[device].lock.waiting, memory_order_acquire);
}
