/*
 * size_format.c: the one place a byte count becomes text for people. Three forms, because two
 * must match PyTorch to the character where users compare our output with theirs:
 *   SP_SIZE_PYTORCH  PyTorch's format_size (CUDACachingAllocator's OOM message): "1024 bytes",
 *                    then KiB, MiB or GiB with two decimals, each up to and including 1024 of
 *                    it ("1024.00 MiB" is 1 GiB), GiB the largest unit;
 *   SP_SIZE_CELL     memory_summary's 10-character cell: "   512 B  " below 1 KiB, else one
 *                    decimal in the largest binary unit that keeps the number below 1024
 *                    (up to PiB), negative values (freed amounts) kept;
 *   SP_SIZE_HUMAN    reports and the CLI: "512 B", else two decimals in the largest binary unit
 *                    that keeps the number below 1024 (up to EiB).
 * Sizes are doubles so that means and sizes near 2^64 format without overflow.
 */
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "sympool/experimental.h"

/* The C locale, made once (newlocale) and kept for the process. */
static locale_t g_c_locale;
static pthread_once_t g_c_once = PTHREAD_ONCE_INIT;

static void make_c_locale(void) {
    g_c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
}

static locale_t c_locale(void) {
    (void)pthread_once(&g_c_once, make_c_locale);
    return g_c_locale;
}

void *sp__c_numeric_begin(void) {
    locale_t c = c_locale();
    return c ? (void *)uselocale(c) : NULL; /* uselocale: the thread's locale before */
}

void sp__c_numeric_end(void *old) {
    if (old)
        (void)uselocale((locale_t)old);
}

double sp__strtod_c(const char *s, char **end) {
    locale_t c = c_locale();
    return c ? strtod_l(s, end, c) : strtod(s, end);
}

static const char *const k_units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};

/* Each unit up to and including 1024 of it, as PyTorch compares (size <= 1024: "1024 bytes"). */
static void pytorch(double v, char *buf, size_t cap) {
    if (v <= 1024.0)
        snprintf(buf, cap, "%.0f bytes", v);
    else if (v <= 1048576.0)
        snprintf(buf, cap, "%.2f KiB", v / 1024.0);
    else if (v <= 1073741824.0)
        snprintf(buf, cap, "%.2f MiB", v / 1048576.0);
    else
        snprintf(buf, cap, "%.2f GiB", v / 1073741824.0);
}

static void cell(double v, char *buf, size_t cap) {
    double mag = v < 0 ? -v : v;
    if (mag < 1024.0) {
        snprintf(buf, cap, "%6.0f B  ", v);
        return;
    }
    double x = v / 1024.0;
    int u = 1;
    for (; u < 5 && (x >= 1023.95 || x <= -1023.95); u++)
        x /= 1024.0;
    snprintf(buf, cap, "%6.1f %s", x, k_units[u]);
}

static void human(double v, char *buf, size_t cap) {
    int u = 0;
    /* The next unit once the number would print as 1024 (or more) of this one: bytes are shown
     * without decimals, the units above with two. */
    while (u < 6 && fabs(v) >= (u == 0 ? 1023.5 : 1023.995)) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, cap, u == 0 ? "%.0f %s" : "%.2f %s", v, k_units[u]);
}

const char *sp__size_format(double bytes, sp_size_style_t style, char *buf, size_t cap) {
    if (!buf || cap == 0)
        return "";
    void *old = sp__c_numeric_begin();
    switch (style) {
    case SP_SIZE_PYTORCH:
        pytorch(bytes, buf, cap);
        break;
    case SP_SIZE_CELL:
        cell(bytes, buf, cap);
        break;
    default:
        human(bytes, buf, cap);
        break;
    }
    sp__c_numeric_end(old);
    return buf;
}

SP_EXPORT const char *sp_x_size_format(double bytes, char *buf, size_t cap) {
    return sp__size_format(bytes, SP_SIZE_HUMAN, buf, cap);
}

static void shortest(double v, char *buf, size_t cap) {
    char e[40];
    int digits = 1; /* significant digits; 17 always read back */
    for (; digits < 17; digits++) {
        snprintf(e, sizeof e, "%.*e", digits - 1, v);
        if (strtod(e, NULL) == v)
            break;
    }
    snprintf(e, sizeof e, "%.*e", digits - 1, v);
    /* %g turns to an exponent once the exponent reaches the precision: 60 would be "6e+01".
     * Enough digits for the integer part keep it "60" (trailing zeros are dropped). */
    int exp10 = atoi(strchr(e, 'e') + 1);
    if (exp10 >= digits && exp10 < 17)
        digits = exp10 + 1;
    snprintf(buf, cap, "%.*g", digits, v);
}

const char *sp__double_format(double v, char *buf, size_t cap) {
    if (cap == 0)
        return buf;
    void *old = sp__c_numeric_begin();
    if (!isfinite(v))
        snprintf(buf, cap, "%g", v);
    else
        shortest(v, buf, cap);
    sp__c_numeric_end(old);
    return buf;
}
