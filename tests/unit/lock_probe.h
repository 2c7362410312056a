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
int sp_probe_lock_sleepers(void *l);      /* threads counted asleep */
int sp_probe_lock_sleepers_word(void *l); /* the count and the wake flag */
void sp_probe_wake(void *l); /* frees the lock and wakes one sleeper, whatever its state */
/* frees the lock without looking for sleepers: the wake an unlock misses in the store-buffer
 * window (core_lock.h) */
void sp_probe_release_silently(void *l);
void sp_probe_fork_child(void *l);  /* sp__lock_fork_child */
int sp_probe_lock_waiting(void *l); /* threads in sp__lock_slow */
/* The bias: a fresh start (sp__lock_bias_end, then sp__lock_bias_begin in the calling thread:
 * 1 if that thread owns the bias now), biasing a lock nobody holds, and what it shows. */
int sp_probe_bias_begin(void);
void sp_probe_bias_nobody(void *l); /* biased, owned by nobody yet */
void sp_probe_bias(void *l);        /* biased, owned by the calling thread */
int sp_probe_lock_in(void *l);
int sp_probe_bias_gone(void);
/* Re-biasing: the owner's record names the lock (inside), the process has re-biased a lock, the
 * streak's length, the re-bias owner's record, and a re-biased entry made with a record read
 * earlier (a thread stopped between its look at the owner and its store). */
int sp_probe_lock_rebiased_in(void *l);
int sp_probe_rebias_era(void);
int sp_probe_lock_streak(void);
void *sp_probe_lock_rec_owner(void *l);
int sp_probe_enter_rebiased_as(void *l, void *rec);
/* The streak after a revocation whose barrier took ns (sp__lock_streak_follow), and pinning it
 * (sp_probe_bias_begin pins it at SP_LOCK_STREAK; 0 lets it follow again). */
int sp_probe_streak_after_barrier(long ns);
void sp_probe_streak_pin(int takes);
/* sp__lock_unless(l, stop) with one process-wide stop flag (the fork handler's take) */
void sp_probe_unless_stop(int on);
int sp_probe_lock_unless(void *l);
#ifdef __cplusplus
}
#endif
#endif
