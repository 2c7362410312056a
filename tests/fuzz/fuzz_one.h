/*
 * fuzz_one.h: what the fuzzer does with one input, shared by the libFuzzer targets
 * (fuzz_main.c) and the regression test that replays the reproducers (test_fuzz_repro.cc).
 */
#ifndef SP_TESTS_FUZZ_ONE_H
#define SP_TESTS_FUZZ_ONE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Read data[0..size) as a snapshot: a pickle, or (json) a JSON snapshot translated to one, then
 * load it as a trace, as every CLI command does. Returns 1 if it loaded, 0 if it was refused;
 * anything else (a crash, a sanitizer report, a hang) is a defect. */
int sp_fuzz_one(const uint8_t *data, size_t size, int json);

#ifdef __cplusplus
}
#endif

#endif /* SP_TESTS_FUZZ_ONE_H */
