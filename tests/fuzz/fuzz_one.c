/*
 * fuzz_one.c: one fuzz input through the snapshot readers (tools/pickle_read.c,
 * core/json_read.c) and the trace loader every CLI command starts with (tools/trace.c), a
 * pickle through its loader without stacks too (the reader's record hook).
 * The limits are smaller than the CLI's so that one input stays fast; the code paths are the
 * same.
 */
#include "tests/fuzz/fuzz_one.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sympool/experimental.h"
#include "tools/pickle_read.h"
#include "tools/trace.h"

/* The loader without stacks (`sympool info`, `sympool replay`), whose reader hands the trace
 * entries and the final state's blocks and segments over to trace.c as it parses them: it reads
 * a file, so the input goes to an in-memory one (one per process, rewritten per input). */
static void load_records(const void *buf, size_t size) {
    static int fd = -1;
    if (fd < 0)
        fd = memfd_create("sp_fuzz", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, 0) != 0 || (size > 0 && pwrite(fd, buf, size, 0) != (ssize_t)size))
        return;
    char path[64], err[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    tr_trace_t t;
    (void)tr_load_opts(path, false, &t, err, sizeof err);
    tr_free(&t);
}

int sp_fuzz_one(const uint8_t *data, size_t size, int json) {
    char err[256];
    char *pickle = NULL;
    size_t plen = 0;
    const void *buf = data;
    if (json) {
        if (!sp_x_json_to_pickle((const char *)data, size, &pickle, &plen, err, sizeof err))
            return 0;
        buf = pickle;
        size = plen;
    }
    pk_limits_t lim;
    pk_limits_default(&lim);
    lim.max_memo = 1 << 16;
    lim.max_values = 1 << 18;
    lim.max_str = 1 << 20;
    pk_doc_t *doc = NULL;
    int loaded = 0;
    if (pk_parse(buf, size, &lim, &doc, err, sizeof err)) {
        tr_trace_t t;
        memset(&t, 0, sizeof t);
        loaded = tr_from_doc(doc, &t, err, sizeof err); /* owns doc from here */
        tr_free(&t);
    }
    if (!json)
        load_records(data, size);
    free(pickle);
    return loaded;
}
