/*
 * experimental.c: sympool/experimental.h's option and log services for tools/ and bench/, thin
 * wrappers over core's internal calls (so those folders include no private header). Unstable by
 * contract. The symmetric counters live in symmetric/sym_experimental.c; a build without MPI
 * has no symmetric pools and answers zeros here.
 */
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "core/core_emit.h"
#include "core/options.h"
#include "sympool/experimental.h"

SP_EXPORT sp_status_t sp_x_option_set(const char *name, const char *value) {
    SP_ARG_CHECK(name != NULL, SP_SUB_ENV, "sp_x_option_set: name is NULL");
    for (int o = 0; o < SP_OPT_COUNT; o++)
        if (strcmp(sp__option_name((sp_option_t)o), name) == 0)
            return sp__option_set((sp_option_t)o, value);
    return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_ENV,
                     "sp_x_option_set: %s is not a SYMPOOL_* option (sympool info lists them)",
                     name);
}

SP_EXPORT bool sp_x_option_check(const char *name, const char *value, char *why, size_t why_len) {
    char reason[256] = "";
    int o = 0;
    while (o < SP_OPT_COUNT && (name == NULL || strcmp(sp__option_name((sp_option_t)o), name) != 0))
        o++;
    opt_value_t v;
    bool ok = o < SP_OPT_COUNT && value != NULL &&
              sp__opt_parse((sp_option_t)o, value, false, NULL, &v, reason, sizeof reason);
    if (ok || why == NULL || why_len == 0)
        return ok;
    size_t n = strlen(SP_OPT_OUT_OF_RANGE);
    bool range = strncmp(reason, SP_OPT_OUT_OF_RANGE, n) == 0;
    /* The words sp_x_option_set's error has for the same value. */
    if (o == SP_OPT_COUNT)
        snprintf(why, why_len, "%s is not a SYMPOOL_* option (sympool info lists them)",
                 name ? name : "(null)");
    else if (value == NULL)
        snprintf(why, why_len, "%s: the value is NULL", name);
    else
        snprintf(why, why_len, "%s='%s' is %s: %s", name, value,
                 range ? "out of range" : "malformed", range ? reason + n : reason);
    return false;
}

SP_EXPORT bool sp_x_alloc_conf_check(const char *text, char *why, size_t why_len) {
    char reason[512];
    sp_alloc_conf_t conf;
    sp__alloc_conf_defaults(&conf);
    bool ok = sp__alloc_conf_parse_ex(text, &conf, NULL, NULL, 0, false, NULL, NULL, reason,
                                      sizeof reason) == SP_SUCCESS;
    if (!ok && why != NULL && why_len > 0)
        snprintf(why, why_len, "%s", reason);
    return ok;
}

SP_EXPORT void sp_x_options_print(FILE *f) {
    sp__options_print(f);
}

SP_EXPORT bool sp_x_option_info(int index, sp_x_option_info_t *info) {
    static const char *const kinds[] = {"bool", "long", "double", "size", "enum", "string"};
    if (info == NULL || index < 0 || index >= SP_OPT_COUNT)
        return false;
    sp_option_t o = (sp_option_t)index;
    const opt_def_t *d = &sp__opt_defs[o];
    opt_value_t cur, def;
    sp_option_source_t src;
    sp__option_values(o, &cur, &def, &src);
    memset(info, 0, sizeof *info);
    info->name = d->name;
    info->kind = kinds[d->kind];
    info->source = sp__option_source_name(src);
    info->description = d->desc;
    const opt_value_t *v[2] = {&cur, &def};
    char *text[2] = {info->value, info->default_value};
    int64_t *i[2] = {&info->value_int, &info->default_int};
    double *x[2] = {&info->value_double, &info->default_double};
    for (int k = 0; k < 2; k++) {
        *i[k] = v[k]->i;
        *x[k] = v[k]->d;
        /* Strings as they are: the table's quotes are for reading, not part of the value. */
        if (d->kind == K_ENUM || d->kind == K_STRING)
            snprintf(text[k], sizeof info->value, "%s", v[k]->s);
        else
            sp__opt_format(o, v[k], text[k], sizeof info->value);
    }
    return true;
}

/* The user's function behind the log hook (set and cleared with the hook itself). */
static sp_x_log_fn x_fn;
static void *x_arg;

static void trampoline(sp_log_level_t level, const char *line, void *arg) {
    (void)arg;
    x_fn((int)level, line, x_arg);
}

SP_EXPORT void sp_x_log_set_fn(sp_x_log_fn fn, void *arg) {
    sp__log_set_fn(NULL, NULL); /* no line reaches the trampoline while x_fn changes */
    x_fn = fn;
    x_arg = arg;
    if (fn != NULL)
        sp__log_set_fn(trampoline, NULL);
}

#ifndef SP_HAVE_MPI
SP_EXPORT void sp_x_symmetric_counters(int device, sp_x_symmetric_counters_t *counters_p) {
    (void)device;
    if (counters_p != NULL)
        memset(counters_p, 0, sizeof *counters_p);
}
#endif

SP_EXPORT bool sp_x_path_expand(const char *pattern, char *out, size_t cap) {
    if (pattern == NULL || out == NULL || cap == 0)
        return false;
    /* -1: as the log's own expansion (log.c), a %r before the rank is known is no file */
    return sp__path_expand(pattern, -1, out, cap) == SP_EXPAND_OK;
}

SP_EXPORT bool sp_x_path_names(const char *pattern, const char *path) {
    return pattern != NULL && path != NULL && pattern[0] != '\0' &&
           sp__log_pattern_names(pattern, path);
}

SP_EXPORT bool sp_x_log_cannot_open(const char *path, const char *why) {
    return path != NULL && why != NULL && sp__log_cannot_open(path, why);
}

SP_EXPORT sp_status_t sp_x_file_write_atomic(const char *path, const void *buf, size_t len) {
    SP_ARG_CHECK(path != NULL && path[0] != '\0', SP_SUB_HISTORY,
                 "sp_x_file_write_atomic: path is NULL or empty");
    SP_ARG_CHECK(buf != NULL || len == 0, SP_SUB_HISTORY, "sp_x_file_write_atomic: buf is NULL");
    return sp__file_write_atomic(path, buf, len);
}

SP_EXPORT void sp_x_temp_set_fn(sp_x_temp_fn fn, void *arg) {
    sp__file_temp_set_fn(fn, arg);
}
