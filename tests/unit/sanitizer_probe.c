/* One deliberate defect of each kind the sanitized builds exist to report, each in a process of
 * its own: proof that the compiler and runtime a sanitized build uses still catch them. A
 * sanitizer that reports nothing (a wrong flag, a runtime not loaded, another compiler) would
 * turn every sanitized test into a plain one that passes.
 * usage: sanitizer_probe race|overflow|undefined; the sanitizer reports the defect (its test looks
 * for the report), and the program dies there or ends with "sanitizer-probe: not caught". */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int racy_counter; /* written by two threads with nothing ordering them */

static void *bump(void *arg) {
    (void)arg;
    for (int i = 0; i < 1000; i++)
        racy_counter++;
    return NULL;
}

static int race(void) {
    pthread_t a, b;
    if (pthread_create(&a, NULL, bump, NULL) != 0 || pthread_create(&b, NULL, bump, NULL) != 0)
        return 2;
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    return racy_counter > 0 ? 0 : 1;
}

/* Volatile, pointer and bytes: a block that never escapes, or a read whose value cannot matter,
 * may be elided by the optimizer at -O1, and the bad read with it. */
static volatile char *volatile probe_block;

static int overflow(void) {
    volatile size_t past_end = 16;
    probe_block = malloc(16);
    if (probe_block == NULL)
        return 2;
    int byte = probe_block[past_end];
    free((void *)probe_block);
    return byte;
}

static int undefined(int argc) {
    volatile int big = INT_MAX;
    int sum = big + argc; /* signed overflow: argc >= 2 here */
    return sum == 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: sanitizer_probe race|overflow|undefined\n");
        return 2;
    }
    int rc;
    if (strcmp(argv[1], "race") == 0)
        rc = race();
    else if (strcmp(argv[1], "overflow") == 0)
        rc = overflow();
    else if (strcmp(argv[1], "undefined") == 0)
        rc = undefined(argc);
    else {
        fprintf(stderr, "sanitizer_probe: unknown defect '%s'\n", argv[1]);
        return 2;
    }
    printf("sanitizer-probe: not caught (%d)\n", rc);
    return 0;
}
