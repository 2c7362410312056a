/*
 * fuzz_one.c: one fuzz input through the snapshot readers (tools/pickle_read.c,
 * core/json_read.c) and the trace loader every CLI command starts with (tools/trace.c).
 * The limits are smaller than the CLI's so that one input stays fast; the code paths are the
 * same.
 */
#include "tests/fuzz/fuzz_one.h"

#include <stdlib.h>
#include <string.h>

#include "sympool/experimental.h"
#include "tools/pickle_read.h"
#include "tools/trace.h"

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
    free(pickle);
    return loaded;
}
