/*
 * cli_json.c: the small JSON writer behind the CLI's --json outputs: one document, written as it
 * goes, two-space indentation, keys and strings escaped per RFC 8259 (control characters as
 * \uXXXX). A byte XX that is not part of UTF-8 is written as \udcXX, the lone surrogate
 * Python's 'surrogateescape' makes of it, as json.dumps escapes it: the document always parses,
 * and a path (the strings that are data here: the trace, sys.argv's and os.fsdecode's view of
 * it) comes back from json.load as the str os.fsencode turns into the same bytes (it was '?').
 * A number that JSON cannot hold (NaN, infinity) is written as null.
 */
#include <math.h>
#include <string.h>

#include "tools/cli.h"

/* The length of the valid UTF-8 sequence at s (1-4), or 0 when s does not start one. */
static int utf8_len(const unsigned char *s) {
    unsigned char c = s[0];
    int n = c < 0x80             ? 1
            : (c & 0xE0) == 0xC0 ? 2
            : (c & 0xF0) == 0xE0 ? 3
            : (c & 0xF8) == 0xF0 ? 4
                                 : 0;
    if (n == 0 || (n == 2 && c < 0xC2) || (n == 4 && c > 0xF4))
        return 0;
    for (int k = 1; k < n; k++)
        if ((s[k] & 0xC0) != 0x80)
            return 0;
    if (n == 3) {
        unsigned cp = (c & 0x0Fu) << 12 | (s[1] & 0x3Fu) << 6 | (s[2] & 0x3Fu);
        if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
    }
    if (n == 4) {
        unsigned cp = (c & 0x07u) << 18 | (s[1] & 0x3Fu) << 12;
        if (cp < 0x10000 || cp > 0x10FFFF)
            return 0;
    }
    return n;
}

void cj_write_string(FILE *f, const char *s) {
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    fputc('"', f);
    while (*p) {
        unsigned char c = *p;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
            p++;
        } else if (c < 0x20) {
            static const char esc[] = "btn?fr"; /* \b \t \n, (\v has none) \f \r */
            if (c >= 8 && c <= 13 && c != 11)
                fprintf(f, "\\%c", esc[c - 8]);
            else
                fprintf(f, "\\u%04x", c);
            p++;
        } else {
            int n = utf8_len(p);
            if (n == 0) {
                fprintf(f, "\\udc%02x", c);
                p++;
            } else {
                fwrite(p, 1, (size_t)n, f);
                p += n;
            }
        }
    }
    fputc('"', f);
}

/* Before a value or key: the comma after the previous item, a new line and the indentation. */
static void item(cli_json_t *j, const char *key) {
    if (j->depth > 0) {
        if (j->count[(j->depth - 1) % CLI_JSON_DEPTH]++ > 0)
            fputc(',', j->f);
        fprintf(j->f, "\n%*s", 2 * j->depth, "");
    }
    if (key != NULL) {
        cj_write_string(j->f, key);
        fputs(": ", j->f);
    }
}

void cj_init(cli_json_t *j, FILE *f) {
    memset(j, 0, sizeof *j);
    j->f = f;
}

static void open_(cli_json_t *j, const char *key, char c) {
    item(j, key);
    fputc(c, j->f);
    j->count[j->depth % CLI_JSON_DEPTH] = 0;
    j->depth++;
}

void cj_object(cli_json_t *j, const char *key) {
    open_(j, key, '{');
}

void cj_array(cli_json_t *j, const char *key) {
    open_(j, key, '[');
}

void cj_end(cli_json_t *j, char c) {
    j->depth--;
    if (j->count[j->depth % CLI_JSON_DEPTH] > 0)
        fprintf(j->f, "\n%*s", 2 * j->depth, "");
    fputc(c, j->f);
    if (j->depth == 0)
        fputc('\n', j->f);
}

void cj_str(cli_json_t *j, const char *key, const char *v) {
    item(j, key);
    cj_write_string(j->f, v);
}

void cj_int(cli_json_t *j, const char *key, int64_t v) {
    item(j, key);
    fprintf(j->f, "%lld", (long long)v);
}

void cj_uint(cli_json_t *j, const char *key, uint64_t v) {
    item(j, key);
    fprintf(j->f, "%llu", (unsigned long long)v);
}

void cj_num(cli_json_t *j, const char *key, double v) {
    item(j, key);
    if (isfinite(v))
        fprintf(j->f, "%.17g", v);
    else
        fputs("null", j->f);
}

void cj_bool(cli_json_t *j, const char *key, bool v) {
    item(j, key);
    fputs(v ? "true" : "false", j->f);
}

void cj_null(cli_json_t *j, const char *key) {
    item(j, key);
    fputs("null", j->f);
}
