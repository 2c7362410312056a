/*
 * cli_temp.c: the `sympool` command removes the atomic writer's temporary file when it is killed.
 * A snapshot or chart is written to NAME.tmp.XXXXXX and renamed over NAME at the end; Ctrl-C,
 * SIGTERM (a batch system's time limit), SIGHUP (the terminal closed) and the like in between
 * used to leave that temporary behind (the target itself is never touched).
 *
 * The library only reports where its temporaries are (sp_x_temp_set_fn): it runs inside users'
 * processes and installs no handler. This process does: the handler unlinks the temporaries in
 * flight, kept in static buffers, then restores the default action and raises the signal again,
 * so the shell still sees "killed by SIGTERM". Only async-signal-safe calls run in it (unlink,
 * sigaction, raise, sigprocmask). The signals are blocked from before a temporary is created
 * until its name is recorded, and from before it is renamed or unlinked until its name is
 * dropped: a signal arriving in between waits, then finds the record matching the file system
 * (never a file created unseen, never a renamed file's name). The CLI is single-threaded.
 */
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli.h"

/* The signals whose default action ends the process and that come from outside while a file is
 * written; SIGXFSZ and SIGXCPU from the kernel's limits. */
static const int k_signals[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT, SIGPIPE,   SIGALRM,
                                SIGUSR1, SIGUSR2, SIGXCPU, SIGXFSZ, SIGVTALRM, SIGPROF};

#define CLI_TEMPS 4 /* temporaries open at once (the CLI writes one file at a time) */
static char g_temp[CLI_TEMPS][PATH_MAX];        /* their names; valid while g_used */
static volatile sig_atomic_t g_used[CLI_TEMPS]; /* slot in use; changed with signals blocked */
static sigset_t g_handled;                      /* the signals this file handles */
static sigset_t g_saved;                        /* the mask before a BEGIN, restored at its END */

static void on_signal(int sig) {
    for (int i = 0; i < CLI_TEMPS; i++)
        if (g_used[i])
            (void)unlink(g_temp[i]);
    /* Die by the same signal: default action, raised again, and unblocked (it is blocked while
     * its handler runs) so that it takes effect here. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    (void)sigaction(sig, &sa, NULL);
    (void)raise(sig);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    (void)sigprocmask(SIG_UNBLOCK, &one, NULL);
}

static void on_temp(int event, const char *path, void *arg) {
    (void)arg;
    if (event == SP_X_TEMP_CREATE_BEGIN || event == SP_X_TEMP_REMOVE_BEGIN) {
        (void)sigprocmask(SIG_BLOCK, &g_handled, &g_saved);
        return;
    }
    if (event == SP_X_TEMP_CREATE_END && path != NULL && strlen(path) < PATH_MAX) {
        for (int i = 0; i < CLI_TEMPS; i++)
            if (!g_used[i]) {
                memcpy(g_temp[i], path, strlen(path) + 1);
                g_used[i] = 1;
                break;
            }
    } else if (event == SP_X_TEMP_REMOVE_END && path != NULL) {
        for (int i = 0; i < CLI_TEMPS; i++)
            if (g_used[i] && strcmp(g_temp[i], path) == 0) {
                g_used[i] = 0;
                break;
            }
    }
    (void)sigprocmask(SIG_SETMASK, &g_saved, NULL);
}

void cli_temp_cleanup_install(void) {
    sigemptyset(&g_handled);
    for (size_t i = 0; i < sizeof k_signals / sizeof k_signals[0]; i++) {
        struct sigaction old;
        /* A signal the caller ignores (nohup's SIGHUP, `trap '' XFSZ`) stays ignored: a handler
         * would turn it into a death. */
        if (sigaction(k_signals[i], NULL, &old) != 0 || old.sa_handler == SIG_IGN)
            continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigfillset(&sa.sa_mask); /* one handler at a time: the second signal waits, then kills */
        if (sigaction(k_signals[i], &sa, NULL) == 0)
            sigaddset(&g_handled, k_signals[i]);
    }
    sp_x_temp_set_fn(on_temp, NULL);
}
