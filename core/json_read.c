/*
 * json_read.c: reads a JSON memory snapshot (sympool's ".json" snapshots; recent PyTorch viewers
 * accept the same) by translating it into the equivalent pickle with core_emit.c's emitter, so
 * the CLI's restricted pickle reader sees both forms as the same values with the same checks.
 * It lives beside the emitter that writes those snapshots (the reverse of its JSON form) and is
 * offered to tools/ as sp_x_json_to_pickle (sympool/experimental.h).
 *
 * The parser is a strict recursive-descent RFC 8259 reader that reads what Python's json.load
 * reads, as the same values: objects, arrays, strings (escapes, surrogate pairs; raw bytes
 * UTF-8; \u0000 and a lone surrogate escape are the str json.load makes, which the pickle holds
 * as CPython's pickler would: a 0 byte, the surrogate's 3 bytes), integers of any width, floats
 * (and NaN, Infinity, -Infinity, which json.load reads too), true, false, null. Nesting is
 * read with a heap stack, as deep as json.load reads (JSON_MAX_DEPTH); every error names its
 * byte offset. No lock.
 */
#include "sympool/experimental.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/core_emit.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef struct jp {
    const char *p;        /* input */
    size_t len, pos;      /* size, cursor */
    sp__emit_t *e;        /* output */
    int depth;            /* open containers */
    char *err;            /* message buffer */
    size_t errlen;        /* its size */
    char *sbuf;           /* decoded string scratch */
    size_t scap;          /* its size */
    const char *skip_key; /* values under this key are read, not written (NULL: none) */
    int mute_depth;       /* while one is read: the depth of the object holding it, else -1 */
} jp_t;

static inline bool muted(const jp_t *j) {
    return j->mute_depth >= 0;
}

/* After a value ended at depth d (a scalar, or a container just closed): the skipped value, if
 * this was it, is over. */
static inline void value_done(jp_t *j) {
    if (j->mute_depth == j->depth)
        j->mute_depth = -1;
}

static bool jfail(jp_t *j, const char *what) {
    snprintf(j->err, j->errlen, "json: %s at offset %zu", what, j->pos);
    return false;
}

static void skip_ws(jp_t *j) {
    while (j->pos < j->len && (j->p[j->pos] == ' ' || j->p[j->pos] == '\t' ||
                               j->p[j->pos] == '\n' || j->p[j->pos] == '\r'))
        j->pos++;
}

static bool literal(jp_t *j, const char *word) {
    size_t n = strlen(word);
    if (j->len - j->pos < n || memcmp(j->p + j->pos, word, n) != 0)
        return jfail(j, "unexpected token");
    j->pos += n;
    return true;
}

/* cp into j->sbuf as UTF-8; a surrogate in its 3-byte form ('surrogatepass'). */
static bool put_utf8(jp_t *j, size_t *o, unsigned long cp) {
    unsigned char b[4];
    size_t n;
    if (cp == 0) { /* as 0xC0 0x80, the emitter's form of U+0000 in a C string */
        b[0] = 0xc0;
        b[1] = 0x80;
        n = 2;
    } else if (cp < 0x80) {
        b[0] = (unsigned char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (unsigned char)(0xc0 | (cp >> 6));
        b[1] = (unsigned char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (unsigned char)(0xe0 | (cp >> 12));
        b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        b[2] = (unsigned char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        b[0] = (unsigned char)(0xf0 | (cp >> 18));
        b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
        b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        b[3] = (unsigned char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    if (*o + n + 1 > j->scap) {
        size_t cap = (j->scap ? j->scap : 256) * 2 + n;
        char *nb = realloc(j->sbuf, cap);
        if (nb == NULL)
            return jfail(j, "out of memory");
        j->sbuf = nb;
        j->scap = cap;
    }
    memcpy(j->sbuf + *o, b, n);
    *o += n;
    return true;
}

static bool hex4(jp_t *j, unsigned long *v) {
    if (j->len - j->pos < 4)
        return jfail(j, "truncated \\u escape");
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = j->p[j->pos++];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return jfail(j, "bad \\u escape");
        *v = *v * 16 + (unsigned long)d;
    }
    return true;
}

/* How many bytes from p (avail of them left in the document) need nothing done to them in a
 * string: none a quote, a backslash, a control character or part of a multi-byte sequence.
 * Names and file names are nearly all such bytes, and the byte loop in string() cost some 24
 * instructions a byte: sixteen at a time with SSE2 (every x86-64 has it), else eight with the
 * word-at-a-time tests ("has a zero byte", "has a byte less than n": exact as a yes/no). */
static inline bool plain_byte(unsigned char c) {
    return c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
}

static size_t plain_run(const char *p, size_t avail) {
    size_t run = 0;
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    const __m128i space = _mm_set1_epi8(0x20);
    for (; avail - run >= 16; run += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(p + run));
        /* Signed: bytes 0x80-0xff are negative, so "less than 0x20" takes them too. */
        __m128i special =
            _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                         _mm_cmplt_epi8(v, space));
        unsigned mask = (unsigned)_mm_movemask_epi8(special);
        if (mask != 0)
            return run + (size_t)__builtin_ctz(mask);
    }
#else
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    for (; avail - run >= 8; run += 8) {
        uint64_t w;
        memcpy(&w, p + run, sizeof(w));
        uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
        if ((((q - ones) & ~q) | ((b - ones) & ~b) | ((w - ones * 0x20) & ~w) | w) & highs)
            break;
    }
#endif
    while (run < avail && plain_byte((unsigned char)p[run]))
        run++;
    return run;
}

/* Room in j->sbuf for `more` bytes after o, and the terminating byte. */
static bool sbuf_room(jp_t *j, size_t o, size_t more) {
    if (o + more + 2 <= j->scap)
        return true;
    size_t cap = j->scap ? j->scap : 256;
    while (cap < o + more + 2)
        cap *= 2;
    char *nb = realloc(j->sbuf, cap);
    if (nb == NULL)
        return jfail(j, "out of memory");
    j->sbuf = nb;
    j->scap = cap;
    return true;
}

/* A string into j->sbuf (NUL-terminated), in the emitter's form of a Python str: U+0000 as 0xC0
 * 0x80, a lone surrogate (an escape json.load reads as one) in its 3-byte form. */
static bool string(jp_t *j) {
    size_t o = 0;
    if (j->sbuf == NULL) {
        j->sbuf = malloc(256);
        if (j->sbuf == NULL)
            return jfail(j, "out of memory");
        j->scap = 256;
    }
    j->pos++; /* the opening quote */
    for (;;) {
        size_t run = plain_run(j->p + j->pos, j->len - j->pos);
        if (run > 0) {
            if (!sbuf_room(j, o, run))
                return false;
            memcpy(j->sbuf + o, j->p + j->pos, run);
            o += run;
            j->pos += run;
        }
        if (j->pos >= j->len)
            return jfail(j, "unterminated string");
        unsigned char c = (unsigned char)j->p[j->pos];
        if (c == '"') {
            j->pos++;
            break;
        }
        if (c < 0x20)
            return jfail(j, "control character in string");
        unsigned long cp = c;
        j->pos++;
        if (c == '\\') {
            if (j->pos >= j->len)
                return jfail(j, "truncated escape");
            char x = j->p[j->pos++];
            switch (x) {
            case '"':
                cp = '"';
                break;
            case '\\':
                cp = '\\';
                break;
            case '/':
                cp = '/';
                break;
            case 'b':
                cp = '\b';
                break;
            case 'f':
                cp = '\f';
                break;
            case 'n':
                cp = '\n';
                break;
            case 'r':
                cp = '\r';
                break;
            case 't':
                cp = '\t';
                break;
            case 'u': {
                if (!hex4(j, &cp))
                    return false;
                /* A high surrogate followed by an escaped low one is a pair; any other surrogate
                 * is a lone one, and what follows is read on its own (json.load does both). */
                unsigned long lo;
                if (cp >= 0xd800 && cp < 0xdc00 && j->len - j->pos >= 6 && j->p[j->pos] == '\\' &&
                    j->p[j->pos + 1] == 'u') {
                    size_t at = j->pos;
                    j->pos += 2;
                    if (!hex4(j, &lo))
                        return false;
                    if (lo >= 0xdc00 && lo < 0xe000)
                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    else
                        j->pos = at;
                }
                break;
            }
            default:
                return jfail(j, "bad escape");
            }
            if (!put_utf8(j, &o, cp))
                return false;
            continue;
        }
        /* Raw bytes are copied as they are, once they are UTF-8 (RFC 8259 8.1: what Python's
         * json.load reads; no surrogate, nothing overlong or past U+10FFFF). The emitter would
         * write others as '?', a string misread instead of refused. */
        size_t k = 0; /* continuation bytes of a sequence that starts at c */
        if (c >= 0x80) {
            unsigned char lo = 0x80, hi = 0xbf; /* the range of the first of them */
            if (c >= 0xc2 && c <= 0xdf) {
                k = 1;
            } else if (c >= 0xe0 && c <= 0xef) {
                k = 2;
                lo = c == 0xe0 ? 0xa0 : 0x80;
                hi = c == 0xed ? 0x9f : 0xbf;
            } else if (c >= 0xf0 && c <= 0xf4) {
                k = 3;
                lo = c == 0xf0 ? 0x90 : 0x80;
                hi = c == 0xf4 ? 0x8f : 0xbf;
            } else {
                j->pos--;
                return jfail(j, "not UTF-8");
            }
            const unsigned char *s = (const unsigned char *)j->p + j->pos;
            bool ok = j->len - j->pos >= k && s[0] >= lo && s[0] <= hi;
            for (size_t i = 1; ok && i < k; i++)
                ok = (s[i] & 0xc0) == 0x80;
            if (!ok) {
                j->pos--;
                return jfail(j, "not UTF-8");
            }
        }
        if (o + 2 + k > j->scap) {
            size_t cap = (j->scap ? j->scap : 256) * 2;
            char *nb = realloc(j->sbuf, cap);
            if (nb == NULL)
                return jfail(j, "out of memory");
            j->sbuf = nb;
            j->scap = cap;
        }
        j->sbuf[o++] = (char)c;
        for (size_t i = 0; i < k; i++)
            j->sbuf[o++] = j->p[j->pos++];
    }
    j->sbuf[o] = '\0'; /* both writers keep one byte free */
    return true;
}

static bool is_digit(const jp_t *j, size_t at) {
    return at < j->len && j->p[at] >= '0' && j->p[at] <= '9';
}

/* Not JSON, but json.load reads them (and json.dumps writes them): the floats NaN, Infinity and
 * -Infinity (neg: after a '-', where only Infinity may follow). Else a bad number. */
static bool not_a_number(jp_t *j, bool neg) {
    const char *word = j->pos + neg < j->len && j->p[j->pos + neg] == 'I' ? "Infinity"
                       : !neg && j->pos < j->len && j->p[j->pos] == 'N'   ? "NaN"
                                                                          : NULL;
    if (word == NULL)
        return jfail(j, "bad number");
    j->pos += neg;
    if (!literal(j, word))
        return false;
    if (!muted(j))
        sp__emit_double(j->e, word[0] == 'N' ? NAN : neg ? -INFINITY : INFINITY);
    return true;
}

/* Python's int() refuses longer decimal text (sys.int_info.default_max_str_digits), so json.load
 * refuses such an integer. */
#define INT_MAX_DIGITS 4300

/* A number as json.load reads it: RFC 8259's grammar, and where the grammar ends the number ends
 * ("01", "1." and "1.e5" leave "1", ".", ".e5" to what follows, which refuses them, as json.load
 * does); an integer of any width (json.load's int: past 64 bits a pickle LONG, as pickle.dumps
 * writes it); a float past the double range is an infinity, as float() makes it. */
static bool number(jp_t *j) {
    size_t start = j->pos, i = start;
    bool neg = i < j->len && j->p[i] == '-';
    i += neg;
    if (!is_digit(j, i))
        return not_a_number(j, neg);
    size_t first = i; /* the first digit */
    uint64_t v = (uint64_t)(j->p[i++] - '0');
    if (v != 0)
        for (; is_digit(j, i); i++)
            v = v * 10 + (uint64_t)(j->p[i] - '0'); /* exact up to 19 digits */
    size_t digits = i - first;
    bool is_float = false;
    if (i < j->len && j->p[i] == '.' && is_digit(j, i + 1)) {
        for (i += 2; is_digit(j, i);)
            i++;
        is_float = true;
    }
    if (i < j->len && (j->p[i] == 'e' || j->p[i] == 'E')) {
        size_t k = i + 1;
        if (k < j->len && (j->p[k] == '+' || j->p[k] == '-'))
            k++;
        if (is_digit(j, k)) {
            for (i = k + 1; is_digit(j, i);)
                i++;
            is_float = true;
        }
    }
    /* The common case, an integer of up to 19 digits: v is its magnitude. */
    if (!is_float && digits <= 19 && (!neg || v <= (uint64_t)INT64_MAX + 1)) {
        if (!muted(j) && neg)
            sp__emit_int(j->e, v > (uint64_t)INT64_MAX ? INT64_MIN : -(int64_t)v);
        else if (!muted(j))
            sp__emit_uint(j->e, v);
        j->pos = i;
        return true;
    }
    if (!is_float && digits > INT_MAX_DIGITS)
        return jfail(j, "integer of more than 4300 digits (Python's int() refuses it)");
    size_t n = i - start;
    char small[64], *buf = n < sizeof(small) ? small : malloc(n + 1);
    if (buf == NULL)
        return jfail(j, "out of memory");
    memcpy(buf, j->p + start, n);
    buf[n] = '\0';
    char *end = NULL;
    errno = 0;
    unsigned long long u = is_float || neg ? 0 : strtoull(buf, &end, 10);
    if (!muted(j)) { /* a skipped value is read and checked above, written nowhere */
        if (is_float)
            sp__emit_double(j->e, sp__strtod_c(buf, &end));
        else if (!neg && errno == 0)
            sp__emit_uint(j->e, u); /* 20 digits below 2^64 */
        else
            sp__emit_int_text(j->e, buf, n);
    }
    if (buf != small)
        free(buf);
    j->pos = i;
    return true;
}

/* How deep a document may nest. json.load's C scanner recurses once per open container, under
 * CPython's recursion guard, so how deep it reads depends on the version: 3.11 stops near
 * sys.getrecursionlimit() (1,000: 994 levels from a script's json.load), 3.12 and 3.13 at a C
 * recursion limit of some thousands, 3.14 where its guard sees the C stack run low (tens of
 * thousands of levels on an 8 MiB main thread). Every document one of them reads is read here
 * (100,000 is past all of them), and one nested deeper is refused, as they all refuse it. The
 * parser keeps its open containers on the heap (a byte each, grown by doubling, never more than
 * the input has bytes), never on the C stack, so a file of nothing but '[' is a short error. */
#define JSON_MAX_DEPTH 100000

/* A scalar value (string, literal, number); containers are parse()'s. */
static inline __attribute__((always_inline)) bool scalar(jp_t *j) {
    switch (j->p[j->pos]) {
    case '"':
        if (!string(j))
            return false;
        if (!muted(j))
            sp__emit_str(j->e, j->sbuf);
        return true;
    case 't':
        if (!literal(j, "true"))
            return false;
        if (!muted(j))
            sp__emit_bool(j->e, true);
        return true;
    case 'f':
        if (!literal(j, "false"))
            return false;
        if (!muted(j))
            sp__emit_bool(j->e, false);
        return true;
    case 'n':
        if (!literal(j, "null"))
            return false;
        if (!muted(j))
            sp__emit_none(j->e);
        return true;
    default:
        return number(j);
    }
}

/* An object's key and its ':' (whitespace before them skipped). */
static inline __attribute__((always_inline)) bool key(jp_t *j) {
    skip_ws(j);
    if (j->pos >= j->len || j->p[j->pos] != '"')
        return jfail(j, "expected a string key");
    if (!string(j))
        return false;
    if (!muted(j)) {
        sp__emit_key(j->e, j->sbuf);
        if (j->skip_key != NULL && strcmp(j->sbuf, j->skip_key) == 0) {
            /* Its value is read below like any other, written as this empty list. */
            sp__emit_list_begin(j->e);
            sp__emit_list_end(j->e);
            j->mute_depth = j->depth;
        }
    }
    skip_ws(j);
    if (j->pos >= j->len || j->p[j->pos] != ':')
        return jfail(j, "expected ':'");
    j->pos++;
    return true;
}

/* One value, its containers read in a loop: open[] holds '{' or '[' for each open one, and cur
 * the innermost one's closing character (0: none open). */
static bool parse(jp_t *j) {
    char *open = NULL;
    size_t cap = 0;
    char cur = 0;
    bool ok = false;
    for (;;) {
        /* A value. */
        skip_ws(j);
        if (j->pos >= j->len) {
            jfail(j, "truncated input");
            goto out;
        }
        char c = j->p[j->pos];
        if (c == '{' || c == '[') {
            if ((size_t)j->depth == JSON_MAX_DEPTH) {
                jfail(j, "nesting deeper than 100000 levels (json.load refuses it)");
                goto out;
            }
            if ((size_t)j->depth == cap) {
                size_t ncap = cap ? cap * 2 : 64;
                char *n = realloc(open, ncap);
                if (n == NULL) {
                    jfail(j, "out of memory");
                    goto out;
                }
                open = n;
                cap = ncap;
            }
            open[j->depth++] = c;
            j->pos++;
            cur = c == '{' ? '}' : ']';
            if (!muted(j)) {
                if (c == '{')
                    sp__emit_dict_begin(j->e);
                else
                    sp__emit_list_begin(j->e);
            }
            skip_ws(j);
            if (j->pos >= j->len || j->p[j->pos] != cur) {
                if (c == '{' && !key(j))
                    goto out;
                continue; /* its first value */
            }
            /* Empty: closed below. */
        } else if (!scalar(j)) {
            goto out;
        } else {
            value_done(j);
        }
        /* After a value: close what it ends, or go on to the next item of its container. */
        for (;;) {
            if (cur == 0) {
                ok = true;
                goto out;
            }
            skip_ws(j);
            char n = j->pos < j->len ? j->p[j->pos] : 0;
            if (n == ',') {
                j->pos++;
                if (cur == '}' && !key(j))
                    goto out;
                break; /* the next value */
            }
            if (n != cur) {
                jfail(j, cur == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
                goto out;
            }
            j->pos++;
            if (!muted(j)) {
                if (cur == '}')
                    sp__emit_dict_end(j->e);
                else
                    sp__emit_list_end(j->e);
            }
            j->depth--;
            value_done(j);
            cur = j->depth == 0 ? 0 : open[j->depth - 1] == '{' ? '}' : ']';
        }
    }
out:
    free(open);
    return ok;
}

SP_EXPORT bool sp_x_json_to_pickle(const char *text, size_t len, char **pickle_p, size_t *len_p,
                                   char *err, size_t errlen) {
    return sp_x_json_to_pickle_skip(text, len, NULL, pickle_p, len_p, err, errlen);
}

SP_EXPORT bool sp_x_json_to_pickle_skip(const char *text, size_t len, const char *skip_key,
                                        char **pickle_p, size_t *len_p, char *err, size_t errlen) {
    char scratch[1];
    if (err == NULL || errlen == 0) { /* messages go nowhere, but the parser always writes one */
        err = scratch;
        errlen = sizeof scratch;
    }
    if ((text == NULL && len > 0) || pickle_p == NULL || len_p == NULL) {
        snprintf(err, errlen, "json: text, pickle_p or len_p is NULL");
        return false;
    }
    sp__emit_t e;
    sp__emit_init(&e, false);
    jp_t j = {text, len, 0, &e, 0, err, errlen, NULL, 0, skip_key, -1};
    bool ok = parse(&j);
    if (ok) {
        skip_ws(&j);
        if (j.pos != j.len)
            ok = jfail(&j, "trailing characters");
    }
    free(j.sbuf);
    if (!ok) {
        sp__emit_discard(&e);
        return false;
    }
    if (sp__emit_finish(&e, pickle_p, len_p) != SP_SUCCESS) {
        snprintf(err, errlen, "json: out of memory");
        return false;
    }
    return true;
}
