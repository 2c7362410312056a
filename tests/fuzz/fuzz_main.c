/*
 * fuzz_main.c: the libFuzzer entry point; SP_FUZZ_JSON selects the JSON reader (tests/fuzz/run.sh
 * builds one target for each).
 */
#include "tests/fuzz/fuzz_one.h"

#ifndef SP_FUZZ_JSON
#define SP_FUZZ_JSON 0
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)sp_fuzz_one(data, size, SP_FUZZ_JSON);
    return 0;
}
