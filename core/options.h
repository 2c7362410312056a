/*
 * options.h: private to core/: the SYMPOOL_* option table (generated from SP_OPTION_LIST in
 * core.h) and its parsers, which options.c implements; config.c keeps the values in force.
 */
#ifndef SP_CORE_OPTIONS_H
#define SP_CORE_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

#define OPT_TEXT_MAX 512 /* longest string value kept (ALLOC_CONF's conf_text is 512 too) */

typedef enum { K_BOOL, K_LONG, K_DOUBLE, K_SIZE, K_ENUM, K_STRING } opt_kind_t;

/* A parsed value, typed: nothing is parsed from text twice. */
typedef struct {
    int64_t i;                  /* bool, long, size, enum index, DEBUG_SUBSYS mask */
    double d;                   /* double options */
    char s[OPT_TEXT_MAX];       /* string value, or the enum's canonical name */
    sp_alloc_conf_t conf;       /* ALLOC_CONF: the parsed keys; ROUNDUP: its divisions table */
    unsigned conf_keys;         /* ALLOC_CONF: the SP_CONF_KEY_* it set */
    char roundup[OPT_TEXT_MAX]; /* ALLOC_CONF: its roundup_power2_divisions text, for display */
} opt_value_t;

/* What parsing a value had to say besides yes or no: the bad entries a lenient ALLOC_CONF parse
 * skipped (bad) and the CUDA-only keys it ignores (!bad). Duplicates are kept once. */
#define OPT_NOTES_MAX 8
typedef struct {
    int n;                         /* notes kept */
    bool bad[OPT_NOTES_MAX];       /* a skipped entry (WARN) or an ignored key (INFO) */
    char text[OPT_NOTES_MAX][256]; /* what to log */
} opt_notes_t;

/* Extra validation for one option; false with why filled on failure. lenient: the value comes
 * from the environment, where a partly bad ALLOC_CONF keeps its good keys; notes may be NULL. */
typedef bool (*opt_check_t)(opt_value_t *v, bool lenient, opt_notes_t *notes, char *why,
                            size_t why_len);

typedef struct {
    const char *name;           /* full variable name */
    opt_kind_t kind;            /* how the text parses */
    const char *def;            /* default, as text parsed like the variable */
    const char *const *choices; /* K_ENUM: NULL-terminated names, index = value */
    opt_check_t check;          /* range / syntax check, or NULL */
    unsigned conf_key;          /* the SYMPOOL_ALLOC_CONF key it also comes from, 0 = none */
    const char *desc;           /* one line for SYMPOOL_INFO=1 */
} opt_def_t;

/* The table, in sp_option_t order. */
extern const opt_def_t sp__opt_defs[SP_OPT_COUNT];

/* Parse text for option o into *out; false with why filled when malformed (out unchanged). */
/* The prefix of sp__opt_parse's `why` when a number parsed but its option's check refused it. */
#define SP_OPT_OUT_OF_RANGE "out of range: "
bool sp__opt_parse(sp_option_t o, const char *text, bool lenient, opt_notes_t *notes,
                   opt_value_t *out, char *why, size_t why_len);

/* The value as a user would write it: sizes in the largest exact binary unit. */
void sp__opt_format(sp_option_t o, const opt_value_t *v, char *out, size_t cap);

/* config.c: the value in force of option o, its default (parsed from the table) and where the
 * value came from, read together under the table's lock (`sympool info`, both forms). */
void sp__option_values(sp_option_t o, opt_value_t *cur, opt_value_t *def, sp_option_source_t *src);
/* "default", "env", "ALLOC_CONF", "api", "PYTORCH_ALLOC_CONF" or "PYTORCH_CUDA_ALLOC_CONF", as
 * `sympool info` shows. */
const char *sp__option_source_name(sp_option_source_t s);

/* A number as PyTorch reads an ALLOC_CONF key's with std::stod (garbage_collection_threshold,
 * per_process_memory_fraction), and as the SYMPOOL_* variable that sets the same thing
 * (SYMPOOL_GC_THRESHOLD) reads it too, so that the two spellings of one setting take the same
 * values: strtod's forms, C's hexadecimal ones included ("0x0.8" is 0.5), blanks around them; a
 * finite value strtod reads without ERANGE (std::stod throws on an overflow or an underflow such
 * as 1e-320). Stricter than std::stod in one way: text after the number ("0.5abc", which
 * std::stod reads as 0.5) is refused, not ignored. The first len bytes of text. */
bool sp__conf_number(const char *text, size_t len, double *v_p);

/* One roundup_power2_divisions value ("N" or "[64:8,256:4,>:1]", blanks around it) as the
 * ALLOC_CONF key reads it, onto table (all 16 intervals) on success; the reason in why on
 * failure, table unchanged. Only that value: SYMPOOL_ROUNDUP_POWER2_DIVISIONS read its text as
 * "roundup_power2_divisions:TEXT", a whole ALLOC_CONF, so a comma in it started other keys
 * ("4,max_split_size_mb:64"), which were then dropped without a word. */
bool sp__roundup_parse(const char *text, uint32_t table[16], char *why, size_t why_len);

#endif /* SP_CORE_OPTIONS_H */
