/*
 * options.c: the table of SYMPOOL_* variables, generated from the one list SP_OPTION_LIST in
 * core.h (name, kind, default, checks, the ALLOC_CONF key it shadows, description), and the
 * parsers behind it: text to a typed opt_value_t, and back to text for printing. No state and
 * no logging: config.c keeps the values in force, reads them on first use and says what is wrong.
 */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/options.h"

#define MiB (1ll << 20)

static const char *const device_choices[] = {"auto", "cuda", "host", NULL};
static const char *const level_choices[] = {"NONE", "VERSION", "WARN", "INFO", "TRACE", NULL};
static const char *const registrar_choices[] = {"auto", "nccl", "mpi", NULL};
static const char *const report_choices[] = {"none",       "table",     "json",
                                             "prometheus", "table_all", NULL};

/* ---- checks ----------------------------------------------------------------------------- */

/* Keeps what a lenient ALLOC_CONF parse says, once per distinct text. */
static void note(void *arg, bool bad, sp_status_t status, const char *why) {
    opt_notes_t *n = arg;
    (void)status;
    if (n == NULL || n->n == OPT_NOTES_MAX)
        return;
    for (int k = 0; k < n->n; k++)
        if (n->bad[k] == bad && strcmp(n->text[k], why) == 0)
            return;
    n->bad[n->n] = bad;
    snprintf(n->text[n->n], sizeof n->text[n->n], "%s", why);
    n->n++;
}

static bool check_subsys(opt_value_t *v, bool lenient, opt_notes_t *notes, char *why,
                         size_t why_len) {
    (void)lenient, (void)notes; /* only ALLOC_CONF parses leniently */
    unsigned mask;
    if (!sp__log_parse_mask(v->s, &mask)) {
        snprintf(why, why_len,
                 "want a comma list of INIT,POOL,DEVICE,SYM,BOOT,COLL,ENV,API,HISTORY,ALL, "
                 "optionally after ^");
        return false;
    }
    v->i = mask;
    return true;
}

static bool check_alloc_conf(opt_value_t *v, bool lenient, opt_notes_t *notes, char *why,
                             size_t why_len) {
    sp__alloc_conf_defaults(&v->conf);
    v->conf_keys = 0;
    v->roundup[0] = '\0';
    return sp__alloc_conf_parse_ex(v->s, &v->conf, &v->conf_keys, v->roundup, sizeof v->roundup,
                                   lenient, note, notes, why, why_len) == SP_SUCCESS;
}

static bool check_roundup(opt_value_t *v, bool lenient, opt_notes_t *notes, char *why,
                          size_t why_len) {
    (void)lenient, (void)notes; /* only ALLOC_CONF parses leniently */
    sp__alloc_conf_defaults(&v->conf);
    return v->s[0] == '\0' || sp__roundup_parse(v->s, v->conf.roundup_divisions, why, why_len);
}

static bool check_split(opt_value_t *v, bool lenient, opt_notes_t *notes, char *why,
                        size_t why_len) {
    (void)lenient, (void)notes; /* only ALLOC_CONF parses leniently */
    if (v->i != 0 && v->i < 20 * MiB) {
        snprintf(why, why_len,
                 "want 0 (unlimited) or at least 20MiB, like PyTorch's max_split_size_mb");
        return false;
    }
    return true;
}

static bool check_min20m(opt_value_t *v, bool lenient, opt_notes_t *notes, char *why,
                         size_t why_len) {
    (void)lenient, (void)notes; /* only ALLOC_CONF parses leniently */
    if (v->i < 20 * MiB) {
        snprintf(why, why_len, "want at least 20MiB, like PyTorch's max_non_split_rounding_mb");
        return false;
    }
    return true;
}

static bool check_large_seg(opt_value_t *v, bool lenient, opt_notes_t *notes, char *why,
                            size_t why_len) {
    (void)lenient, (void)notes; /* only ALLOC_CONF parses leniently */
    if (v->i < (int64_t)SP_LARGE_SEGMENT_MIN)
        snprintf(why, why_len, "want at least 10MiB (it serves every request of up to 10 MiB)");
    else if (v->i > (int64_t)SP_LARGE_SEGMENT_MAX)
        snprintf(why, why_len, "want at most 1TiB");
    else if (v->i % (int64_t)SP_LARGE_SEGMENT_STEP != 0)
        snprintf(why, why_len, "want a multiple of 2MiB");
    else
        return true;
    return false;
}

static bool check_exp_page(opt_value_t *v, bool lenient, opt_notes_t *notes, char *why,
                           size_t why_len) {
    (void)lenient, (void)notes; /* only ALLOC_CONF parses leniently */
    if (v->i > (int64_t)SP_EXPANDABLE_PAGE_MAX) {
        snprintf(why, why_len, "want 0 (PyTorch's 20 MiB) or at most 1GiB");
        return false;
    }
    return true;
}

static bool check_positive(opt_value_t *v, bool lenient, opt_notes_t *notes, char *why,
                           size_t why_len) {
    (void)lenient, (void)notes; /* only ALLOC_CONF parses leniently */
    if (v->i <= 0) {
        snprintf(why, why_len, "want more than 0");
        return false;
    }
    return true;
}

static bool check_align_skip(opt_value_t *v, bool lenient, opt_notes_t *notes, char *why,
                             size_t why_len) {
    (void)lenient, (void)notes; /* only ALLOC_CONF parses leniently */
    if (!(v->d >= 0.0 && v->d <= 0.5)) {
        snprintf(why, why_len, "want a fraction of a page in [0, 0.5]");
        return false;
    }
    return true;
}

static bool check_gc(opt_value_t *v, bool lenient, opt_notes_t *notes, char *why, size_t why_len) {
    (void)lenient, (void)notes; /* only ALLOC_CONF parses leniently */
    if (!(v->d >= 0.0 && v->d < 1.0)) {
        snprintf(why, why_len, "want a fraction in [0, 1); 0 turns it off");
        return false;
    }
    return true;
}

static bool check_devices(opt_value_t *v, bool lenient, opt_notes_t *notes, char *why,
                          size_t why_len) {
    (void)lenient, (void)notes; /* only ALLOC_CONF parses leniently */
    if (v->i < 1 || v->i > 64) {
        snprintf(why, why_len, "want 1 to 64 emulated devices");
        return false;
    }
    return true;
}

static bool check_nonneg(opt_value_t *v, bool lenient, opt_notes_t *notes, char *why,
                         size_t why_len) {
    (void)lenient, (void)notes; /* only ALLOC_CONF parses leniently */
    if (v->i < 0) {
        snprintf(why, why_len, "want 0 (never) or a positive count");
        return false;
    }
    return true;
}

/* 0 and inf both mean "wait forever" (a user's "no timeout"); a finite deadline is capped at one
 * year so that converting it to nanoseconds past the epoch can never overflow. */
#define SYM_TIMEOUT_MAX 31536000.0
static bool check_timeout(opt_value_t *v, bool lenient, opt_notes_t *notes, char *why,
                          size_t why_len) {
    (void)lenient, (void)notes; /* only ALLOC_CONF parses leniently */
    bool forever = v->d == 0.0 || (isinf(v->d) && v->d > 0.0);
    /* Below a nanosecond a deadline is not representable (the clock counts nanoseconds). */
    if (forever || (v->d >= 1e-9 && v->d <= SYM_TIMEOUT_MAX))
        return true;
    snprintf(why, why_len, "want 0 or inf (no deadline) or seconds in [1e-9, 31536000]");
    return false;
}

/* ---- the table ---------------------------------------------------------------------------- */

#define SP_OPT_DEF_(name, kind, def, choices, check, conf_key, desc)                               \
    [SP_OPT_##name] = {"SYMPOOL_" #name, K_##kind, def, choices, check, conf_key, desc},
const opt_def_t sp__opt_defs[SP_OPT_COUNT] = {SP_OPTION_LIST(SP_OPT_DEF_)};
#undef SP_OPT_DEF_

/* ---- parsers ------------------------------------------------------------------------------ */

bool sp__parse_bool(const char *text, bool *value_p) {
    static const char *const yes[] = {"1", "on", "yes", "true"};
    static const char *const no[] = {"0", "off", "no", "false"};
    if (text == NULL)
        return false;
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(text, yes[i]) == 0) {
            *value_p = true;
            return true;
        }
        if (strcasecmp(text, no[i]) == 0) {
            *value_p = false;
            return true;
        }
    }
    return false;
}

bool sp__parse_size(const char *text, size_t *bytes_p) {
    if (text == NULL)
        return false;
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    if (!isdigit((unsigned char)*p)) /* rejects "", "-1", "+1", ".5", "abc" */
        return false;
    uint64_t whole = 0;
    bool big = false; /* well-formed so far but too large: judged after the syntax */
    for (; isdigit((unsigned char)*p); p++) {
        uint64_t digit = (uint64_t)(*p - '0');
        if (whole > (UINT64_MAX - digit) / 10)
            big = true;
        else
            whole = whole * 10 + digit;
    }
    uint64_t frac = 0, denom = 1; /* the fraction as frac/denom, up to 9 digits kept */
    bool past = false; /* a digit other than 0 after those 9: still a fraction of a byte */
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return false;
        for (; isdigit((unsigned char)*p); p++)
            if (denom < 1000000000ull) {
                frac = frac * 10 + (uint64_t)(*p - '0');
                denom *= 10;
            } else {
                past = past || *p != '0';
            }
    }
    while (isspace((unsigned char)*p))
        p++;
    int shift = 0;
    switch (toupper((unsigned char)*p)) {
    case 'K':
        shift = 10;
        p++;
        break;
    case 'M':
        shift = 20;
        p++;
        break;
    case 'G':
        shift = 30;
        p++;
        break;
    case 'T':
        shift = 40;
        p++;
        break;
    case 'P': /* what sympool's own summaries print for the largest sizes, read back */
        shift = 50;
        p++;
        break;
    case 'E':
        shift = 60;
        p++;
        break;
    default:
        break;
    }
    if (shift != 0 && (*p == 'i' || *p == 'I'))
        p++;
    if (*p == 'B' || *p == 'b')
        p++;
    while (isspace((unsigned char)*p))
        p++;
    if (*p != '\0')
        return false;
    if (shift == 0 && (frac != 0 || past))
        return false; /* a fraction of a byte ("1.5", "1.0000000001") */
    uint64_t mult = 1ull << shift;
    if (big || whole > UINT64_MAX / mult) {
        errno = ERANGE; /* a size, but not one a size_t holds: callers say "out of range" */
        return false;
    }
    uint64_t bytes = whole * mult;
    /* frac/denom * mult < mult <= 2^60 and frac < 10^9, so frac * mult fits in 64 bits... when
     * mult <= 2^34; above that, divide first (frac * (mult / denom) < mult, and
     * frac * (mult % denom) < 10^18). */
    uint64_t extra = mult <= (1ull << 34) ? frac * mult / denom
                                          : frac * (mult / denom) + frac * (mult % denom) / denom;
    if (bytes > UINT64_MAX - extra || bytes + extra > (uint64_t)SIZE_MAX) {
        errno = ERANGE;
        return false;
    }
    *bytes_p = (size_t)(bytes + extra);
    return true;
}

static bool parse_long(const char *text, int64_t *v_p) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    int err = errno;
    if (end == text)
        return false;
    while (isspace((unsigned char)*end))
        end++;
    if (*end != '\0' || err != 0) {
        errno = *end != '\0' ? 0 : err; /* ERANGE only for a whole number too large */
        return false;
    }
    *v_p = v;
    return true;
}

static bool parse_double(const char *text, double *v_p) {
    /* strtod also reads C's hexadecimal forms (0x10 is 16); whole numbers and sizes are decimal
     * only, so a decimal option of ours is too: one syntax for every number a user writes. (One
     * that shadows an ALLOC_CONF key reads as the key does: sp__conf_number.) */
    if (strpbrk(text, "xX") != NULL)
        return false;
    char *end;
    errno = 0;
    double v = sp__strtod_c(text, &end);
    /* "inf" is a value (each option's check decides whether it accepts it); an overflowing
     * literal such as 1e999 (ERANGE) and NaN are not. An underflowing one (1e-320: ERANGE with a
     * tiny result) is a well-formed number; its option's check judges its range. */
    if (end == text || isnan(v) || (errno != 0 && !(errno == ERANGE && fabs(v) <= DBL_MIN)))
        return false;
    while (isspace((unsigned char)*end))
        end++;
    if (*end != '\0')
        return false;
    *v_p = v;
    return true;
}

bool sp__opt_parse(sp_option_t o, const char *text, bool lenient, opt_notes_t *notes,
                   opt_value_t *out, char *why, size_t why_len) {
    const opt_def_t *d = &sp__opt_defs[o];
    opt_value_t v;
    memset(&v, 0, sizeof v);
    bool ok = true;
    bool b = false;
    size_t sz = 0;
    if (strlen(text) >= sizeof v.s) {
        snprintf(why, why_len, "longer than %zu characters", sizeof v.s - 1);
        return false;
    }
    switch (d->kind) {
    case K_BOOL:
        ok = sp__parse_bool(text, &b);
        v.i = b;
        if (!ok)
            snprintf(why, why_len, "want 1/0, on/off, yes/no or true/false");
        break;
    case K_LONG:
        errno = 0;
        ok = parse_long(text, &v.i);
        if (!ok && errno == ERANGE)
            snprintf(why, why_len, "%swant a whole number that fits 64 bits", SP_OPT_OUT_OF_RANGE);
        else if (!ok)
            snprintf(why, why_len, "want a whole number");
        break;
    case K_DOUBLE:
        /* One that shadows an ALLOC_CONF key (SYMPOOL_GC_THRESHOLD) is the same setting, read
         * by the key's rule: it refused the hexadecimal forms the key takes, as PyTorch does. */
        ok =
            d->conf_key != 0 ? sp__conf_number(text, strlen(text), &v.d) : parse_double(text, &v.d);
        if (!ok)
            snprintf(why, why_len, "want a number");
        break;
    case K_SIZE:
        errno = 0;
        ok = sp__parse_size(text, &sz) && sz <= (size_t)INT64_MAX;
        v.i = (int64_t)sz;
        if (!ok && (errno == ERANGE || sz > (size_t)INT64_MAX))
            snprintf(why, why_len, "%swant less than 8EiB", SP_OPT_OUT_OF_RANGE);
        else if (!ok)
            snprintf(why, why_len, "want a size such as 512, 64KiB, 1.5G or 80GiB");
        break;
    case K_ENUM:
        ok = false;
        for (int k = 0; d->choices[k] != NULL; k++) {
            if (strcasecmp(text, d->choices[k]) == 0) {
                v.i = k;
                snprintf(v.s, sizeof v.s, "%s", d->choices[k]);
                ok = true;
                break;
            }
        }
        if (!ok) {
            size_t n = (size_t)snprintf(why, why_len, "want one of");
            for (int k = 0; d->choices[k] != NULL && n < why_len; k++)
                n += (size_t)snprintf(why + n, why_len - n, "%s%s", k ? "|" : " ", d->choices[k]);
        }
        break;
    case K_STRING:
        snprintf(v.s, sizeof v.s, "%s", text);
        break;
    }
    if (ok && d->kind != K_ENUM && d->kind != K_STRING)
        snprintf(v.s, sizeof v.s, "%s", text);
    if (ok && d->check != NULL) {
        ok = d->check(&v, lenient, notes, why, why_len);
        /* A number that parsed but is outside the option's range is not "malformed": say so
         * (config.c words the warning after this prefix). */
        if (!ok && (d->kind == K_LONG || d->kind == K_DOUBLE || d->kind == K_SIZE)) {
            char range[256];
            snprintf(range, sizeof range, "%s", why);
            snprintf(why, why_len, "%s%s", SP_OPT_OUT_OF_RANGE, range);
        }
    }
    if (ok)
        *out = v;
    return ok;
}

/* ---- printing ----------------------------------------------------------------------------- */

void sp__opt_format(sp_option_t o, const opt_value_t *v, char *out, size_t cap) {
    static const char *const units[] = {"", "KiB", "MiB", "GiB", "TiB"};
    switch (sp__opt_defs[o].kind) {
    case K_BOOL:
        snprintf(out, cap, "%s", v->i ? "on" : "off");
        break;
    case K_LONG:
        snprintf(out, cap, "%lld", (long long)v->i);
        break;
    case K_DOUBLE:
        sp__double_format(v->d, out, cap); /* reads back as v->d ("%g" showed 0.9999999 as 1) */
        break;
    case K_SIZE: {
        uint64_t n = (uint64_t)v->i;
        int u = 0;
        while (u < 4 && n != 0 && n % 1024 == 0) {
            n /= 1024;
            u++;
        }
        snprintf(out, cap, "%llu%s", (unsigned long long)n, units[u]);
        break;
    }
    default:
        snprintf(out, cap, "\"%s\"", v->s);
        break;
    }
}
