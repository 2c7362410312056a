/*
 * pickle_text.c: the arguments of pickle's text opcodes, decoded (see pickle_text.h). Each
 * function reads s[0..n) once, front to back, and writes at most what its header says into the
 * caller's buffer; nothing is allocated, nothing is global. The values are pickle.load's: its C
 * unpickler reads INT with strtol (base 0, then Python's int() past a C long), LONG and PUT/GET
 * with Python's int(), FLOAT with Python's own strtod, STRING with the bytes-literal escapes and
 * UNICODE with the raw-unicode-escape codec. Where those accept more than a pickler writes, this
 * file refuses it rather than read a value of its own.
 */
#include "tools/pickle_text.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool say(char *why, size_t whylen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool say(char *why, size_t whylen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (why != NULL && whylen > 0)
        vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
    return false;
}

static bool is_digit(unsigned char c) {
    return c >= '0' && c <= '9';
}

static int hex_value(unsigned char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* 32-bit limbs that hold PK_TEXT_MAX_DIGITS decimal digits (10^4300 < 2^14285). */
#define MAX_LIMBS ((PK_TEXT_MAX_DIGITS * 3322 / 1000) / 32 + 2)

/* The width in bytes of the LONG1 encoding (pickle's encode_long: the fewest bytes of two's
 * complement) of the integer whose magnitude is the nd decimal digits d (at most
 * PK_TEXT_MAX_DIGITS), negative if neg: its magnitude m, or m - 1 when negative, has b bits,
 * and takes b / 8 + 1 bytes with its sign bit. Schoolbook, nine digits at a time. */
static uint64_t long1_width(const unsigned char *d, size_t nd, bool neg) {
    uint32_t limb[MAX_LIMBS];
    size_t nl = 0;
    for (size_t i = 0; i < nd;) {
        size_t k = i == 0 && nd % 9 != 0 ? nd % 9 : 9;
        uint32_t chunk = 0, mul = 1;
        for (size_t j = 0; j < k; j++) {
            chunk = chunk * 10 + (uint32_t)(d[i + j] - '0');
            mul *= 10;
        }
        uint64_t carry = chunk;
        for (size_t l = 0; l < nl; l++) {
            uint64_t t = (uint64_t)limb[l] * mul + carry;
            limb[l] = (uint32_t)t;
            carry = t >> 32;
        }
        if (carry != 0 && nl < MAX_LIMBS)
            limb[nl++] = (uint32_t)carry;
        i += k;
    }
    if (neg) /* m - 1 (m > 0 here: the caller sorts the small numbers itself) */
        for (size_t l = 0; l < nl && limb[l]-- == 0; l++)
            ;
    while (nl > 0 && limb[nl - 1] == 0)
        nl--;
    uint64_t bits =
        nl == 0 ? 0 : (uint64_t)(nl - 1) * 32 + 32 - (uint64_t)__builtin_clz(limb[nl - 1]);
    return bits / 8 + 1;
}

/* A value of magnitude mag (sign neg) sorted as le_long sorts a LONG1's. */
static void sort_int(uint64_t mag, bool neg, const unsigned char *d, size_t nd, pk_value_t *out) {
    memset(out, 0, sizeof(*out));
    if (!neg && mag < ((uint64_t)1 << 63)) {
        out->type = PK_INT;
        out->u.i = (int64_t)mag;
    } else if (!neg) {
        out->type = PK_UINT;
        out->u.u = mag;
    } else if (mag <= ((uint64_t)1 << 63)) {
        out->type = PK_INT;
        out->u.i = mag == ((uint64_t)1 << 63) ? INT64_MIN : -(int64_t)mag;
    } else {
        out->type = PK_BIGINT;
        out->u.bits = long1_width(d, nd, true);
    }
}

bool pk_text_int(const unsigned char *s, size_t n, bool is_long, pk_value_t *out, char *why,
                 size_t whylen) {
    const size_t line = n; /* INT of two characters and value 0 or 1 is a bool */
    if (is_long && n > 0 && s[n - 1] == 'L')
        n--; /* LONG's 'L', which pickle.load does not require */
    if (n == 0)
        return say(why, whylen, "is empty");
    size_t i = 0;
    bool neg = false;
    if (s[0] == '-' || s[0] == '+') {
        neg = s[0] == '-';
        i++;
    }
    if (i == n)
        return say(why, whylen, "has no digits");
    for (size_t k = i; k < n; k++)
        if (!is_digit(s[k]))
            return say(why, whylen,
                       "is not a decimal integer (digits after an optional sign%s; no pickler "
                       "writes other forms)",
                       is_long ? ", then an optional L" : "");
    const unsigned char *d = s + i;
    size_t nd = n - i;
    size_t z = 0; /* leading zeros */
    while (z < nd && d[z] == '0')
        z++;
    if (z > 0 && z < nd) {
        /* A 0 before other digits: pickle.load's int() refuses it for LONG; for INT, strtol of
         * base 0 reads octal, and we read what it reads, or refuse what it refuses. */
        if (is_long)
            return say(why, whylen, "has a leading 0 (pickle.load refuses it)");
        uint64_t v = 0;
        for (size_t k = 0; k < nd; k++) {
            if (d[k] > '7')
                return say(why, whylen,
                           "has a leading 0, which makes it octal, and a digit 8 or 9 "
                           "(pickle.load refuses it)");
            if (v > (((uint64_t)1 << 63) >> 3))
                return say(why, whylen,
                           "is octal (a leading 0) and past the range of a C long (pickle.load "
                           "refuses it)");
            v = v * 8 + (uint64_t)(d[k] - '0');
        }
        if (v > ((uint64_t)1 << 63) - (neg ? 0 : 1))
            return say(why, whylen,
                       "is octal (a leading 0) and past the range of a C long (pickle.load "
                       "refuses it)");
        sort_int(v, neg, d, nd, out);
    } else {
        if (nd > PK_TEXT_MAX_DIGITS)
            return say(why, whylen,
                       "has %zu digits (pickle.load refuses more than %d: "
                       "sys.int_info.default_max_str_digits)",
                       nd, PK_TEXT_MAX_DIGITS);
        uint64_t mag = 0;
        bool wide = false;
        for (size_t k = 0; k < nd && !wide; k++) {
            unsigned dig = (unsigned)(d[k] - '0');
            if (mag > (UINT64_MAX - dig) / 10)
                wide = true;
            else
                mag = mag * 10 + dig;
        }
        if (wide) {
            memset(out, 0, sizeof(*out));
            out->type = PK_BIGINT;
            out->u.bits = long1_width(d, nd, neg);
        } else {
            sort_int(mag, neg, d, nd, out);
        }
    }
    if (!is_long && line == 2 && out->type == PK_INT && (out->u.i == 0 || out->u.i == 1)) {
        bool b = out->u.i == 1;
        memset(out, 0, sizeof(*out));
        out->type = PK_BOOL;
        out->u.b = b;
    }
    return true;
}

/* Whether s[0..n) is word, in any case. */
static bool is_word(const unsigned char *s, size_t n, const char *word) {
    if (strlen(word) != n)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if ((c >= 'A' && c <= 'Z' ? c + 32 : c) != (unsigned char)word[i])
            return false;
    }
    return true;
}

bool pk_text_float(const unsigned char *s, size_t n, double *out, char *why, size_t whylen) {
    size_t i = 0;
    bool neg = false;
    if (n > 0 && (s[0] == '-' || s[0] == '+')) {
        neg = s[0] == '-';
        i++;
    }
    if (is_word(s + i, n - i, "inf") || is_word(s + i, n - i, "infinity")) {
        *out = neg ? -INFINITY : INFINITY;
        return true;
    }
    if (is_word(s + i, n - i, "nan")) {
        *out = copysign(NAN, neg ? -1.0 : 1.0); /* pickle.load keeps the sign */
        return true;
    }
    size_t digits = 0;
    while (i < n && is_digit(s[i]))
        i++, digits++;
    if (i < n && s[i] == '.')
        for (i++; i < n && is_digit(s[i]); i++)
            digits++;
    bool ok = digits > 0;
    if (ok && i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '-' || s[i] == '+'))
            i++;
        size_t e = 0;
        while (i < n && is_digit(s[i]))
            i++, e++;
        ok = e > 0;
    }
    if (!ok || i != n)
        return say(why, whylen,
                   "is not a float as Python's repr writes it (digits, a '.', an exponent; inf, "
                   "nan)");
    /* Validated, so strtod (correctly rounded, as Python's) takes all of it and stops at the
     * line's '\n' (s[n]): no copy is needed. The C locale's '.' is the decimal point. */
    char *end = NULL;
    errno = 0;
    double v = strtod((const char *)s, &end);
    if (end != (const char *)s + n)
        return say(why, whylen, "is not a float this C library reads");
    if (isinf(v))
        return say(why, whylen, "is too large for a float (pickle.load refuses it)");
    *out = v;
    return true;
}

bool pk_text_string(const unsigned char *s, size_t n, unsigned char *out, size_t *len_p, char *why,
                    size_t whylen) {
    if (n < 2 || s[0] != s[n - 1] || (s[0] != '\'' && s[0] != '"'))
        return say(why, whylen, "is not quoted (pickle.load refuses it)");
    const unsigned char *p = s + 1, *end = s + n - 1;
    size_t k = 0;
    while (p < end) {
        unsigned char c = *p++;
        if (c != '\\') {
            out[k++] = c;
            continue;
        }
        if (p == end)
            return say(why, whylen, "ends in a lone backslash (pickle.load refuses it)");
        c = *p++;
        switch (c) {
        case '\n':
            break; /* a line continuation (never inside a line, but a bytes literal has it) */
        case '\\':
        case '\'':
        case '"':
            out[k++] = c;
            break;
        case 'b':
            out[k++] = '\b';
            break;
        case 'f':
            out[k++] = '\f';
            break;
        case 't':
            out[k++] = '\t';
            break;
        case 'n':
            out[k++] = '\n';
            break;
        case 'r':
            out[k++] = '\r';
            break;
        case 'v':
            out[k++] = '\v';
            break;
        case 'a':
            out[k++] = '\a';
            break;
        case 'x': {
            int hi = p < end ? hex_value(p[0]) : -1;
            int lo = p + 1 < end ? hex_value(p[1]) : -1;
            if (hi < 0 || lo < 0)
                return say(why, whylen,
                           "has \\x without two hex digits after it (pickle.load refuses it)");
            out[k++] = (unsigned char)(hi * 16 + lo);
            p += 2;
            break;
        }
        default:
            if (c >= '0' && c <= '7') { /* up to three octal digits, the byte's low 8 bits */
                unsigned v = (unsigned)(c - '0');
                for (int j = 0; j < 2 && p < end && *p >= '0' && *p <= '7'; j++)
                    v = v * 8 + (unsigned)(*p++ - '0');
                out[k++] = (unsigned char)v;
            } else { /* not an escape: kept as written (pickle.load only warns) */
                out[k++] = '\\';
                out[k++] = c;
            }
        }
    }
    for (size_t i = 0; i < k; i++)
        if (out[i] >= 0x80)
            return say(why, whylen,
                       "is not ASCII (byte 0x%02x at %zu of its %zu after the escapes): "
                       "pickle.load refuses it",
                       out[i], i, k);
    *len_p = k;
    return true;
}

/* Code point cp (at most U+10FFFF; a surrogate as its own three bytes) as UTF-8 at out. */
static size_t put_utf8(unsigned char *out, uint32_t cp) {
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xc0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xe0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (unsigned char)(0xf0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

bool pk_text_unicode(const unsigned char *s, size_t n, unsigned char *out, size_t *len_p, char *why,
                     size_t whylen) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i++];
        if (c != '\\' || i == n) { /* a byte is its Latin-1 character; so is a last '\' */
            k += put_utf8(out + k, c);
            continue;
        }
        c = s[i++];
        if (c != 'u' && c != 'U') { /* no escape: the backslash and the character */
            out[k++] = '\\';
            k += put_utf8(out + k, c);
            continue;
        }
        size_t digits = c == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t j = 0; j < digits; j++) {
            int h = i + j < n ? hex_value(s[i + j]) : -1;
            if (h < 0)
                return say(why, whylen,
                           "has a truncated \\%c escape (%zu hex digits needed; pickle.load "
                           "refuses it)",
                           c, digits);
            cp = cp * 16 + (uint32_t)h;
        }
        if (cp > 0x10ffff)
            return say(why, whylen, "has \\U%08x, past U+10FFFF (pickle.load refuses it)",
                       (unsigned)cp);
        i += digits;
        k += put_utf8(out + k, cp);
    }
    *len_p = k;
    return true;
}

bool pk_text_index(const unsigned char *s, size_t n, size_t *idx_p, char *why, size_t whylen) {
    if (n == 0)
        return say(why, whylen, "is empty");
    size_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!is_digit(s[i]))
            return say(why, whylen, "is not a memo index (decimal digits)");
        unsigned dig = (unsigned)(s[i] - '0');
        v = v > (SIZE_MAX - dig) / 10 ? SIZE_MAX : v * 10 + dig;
    }
    *idx_p = v;
    return true;
}

void pk_text_show(const unsigned char *s, size_t n, char *out, size_t room) {
    size_t k = 0;
    if (room == 0)
        return;
    for (size_t i = 0; i < n; i++) {
        char esc[8];
        int w = s[i] >= 0x20 && s[i] < 0x7f && s[i] != '\\' && s[i] != '\''
                    ? snprintf(esc, sizeof(esc), "%c", s[i])
                    : snprintf(esc, sizeof(esc), "\\x%02x", s[i]);
        if (k + (size_t)w + 4 > room) { /* room for "..." and the NUL */
            if (k + 4 <= room)
                memcpy(out + k, "...", 3), k += 3;
            break;
        }
        memcpy(out + k, esc, (size_t)w);
        k += (size_t)w;
    }
    out[k] = '\0';
}
