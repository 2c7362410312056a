/*
 * json_read.h: JSON memory snapshots for the CLI, read by translation into a pickle (so the
 * restricted pickle reader's checks and values apply to both forms).
 */
#ifndef SP_TOOLS_JSON_READ_H
#define SP_TOOLS_JSON_READ_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Translate text[0..len) into pickle bytes (caller frees *pickle_p). On failure returns false
 * with "json: <what> at offset N" in err. */
bool json_to_pickle(const char *text, size_t len, char **pickle_p, size_t *len_p, char *err,
                    size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* SP_TOOLS_JSON_READ_H */
