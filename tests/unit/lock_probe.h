/* lock_probe.h: see lock_probe.c. */
#ifndef SP_LOCK_PROBE_H
#define SP_LOCK_PROBE_H
#ifdef __cplusplus
extern "C" {
#endif
int sp_probe_alone(void);
void *sp_probe_lock_new(void);
void sp_probe_lock(void *l);
void sp_probe_unlock(void *l);
int sp_probe_lock_word(void *l);
void sp_probe_wake(void *l); /* frees the lock and wakes one sleeper, whatever its state */
#ifdef __cplusplus
}
#endif
#endif
