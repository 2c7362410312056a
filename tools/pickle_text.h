/*
 * pickle_text.h: the arguments of pickle's text opcodes (protocol 0's INT, LONG, FLOAT, STRING,
 * UNICODE, PUT and GET; protocol 1 writes INT and LONG too), decoded as pickle.load (the C
 * unpickler) decodes them. Each argument is a line: the bytes up to the next '\n', passed here
 * without it.
 *
 * What a pickler writes is read exactly: Python 3's and Python 2's (repr of ints and floats, an
 * 'L' after a LONG, I00/I01 for False/True, str as raw-unicode-escape, Python 2's str as a quoted
 * repr with escapes). Other forms that pickle.load also reads, and that no pickler writes (white
 * space, '_' between digits, 0x, a NUL byte in the line), are refused with a reason, as is
 * everything pickle.load refuses; no form is read as another value than pickle.load's. Every
 * function is pure (no globals, no allocation): the caller owns the buffers.
 */
#ifndef SP_TOOLS_PICKLE_TEXT_H
#define SP_TOOLS_PICKLE_TEXT_H

#include <stdbool.h>
#include <stddef.h>

#include "tools/pickle_read.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most digits pickle.load reads in a decimal integer (Python 3.11's default
 * sys.int_info.default_max_str_digits): a longer one is refused there, and here. */
#define PK_TEXT_MAX_DIGITS 4300

/* INT's (is_long false) or LONG's argument s[0..n) into *out: a PK_INT, PK_UINT or PK_BIGINT as
 * a LONG1 of that value reads (u.bits its width), or for INT a PK_BOOL when it is two characters
 * of value 0 or 1 (I00, I01). False with a reason in why (a phrase after "INT argument 'x' ").
 * A leading 0 makes INT's digits octal, as in pickle.load (strtol of base 0). */
bool pk_text_int(const unsigned char *s, size_t n, bool is_long, pk_value_t *out, char *why,
                 size_t whylen);

/* FLOAT's argument: a decimal float as Python's repr writes it ([+-], digits with an optional
 * '.', an exponent), or inf, infinity, nan (any case, with a sign). One too large for a double
 * is refused (pickle.load: OverflowError). s[n] must be readable and no part of a float (the
 * line's '\n'): once the form is checked, strtod reads s in place and stops there. */
bool pk_text_float(const unsigned char *s, size_t n, double *out, char *why, size_t whylen);

/* STRING's argument: a quoted repr ('...' or "...") whose escapes are decoded as Python's
 * bytes literals' (\\x41, \\n, octal, ...; an unknown one is kept as written) into out (room for
 * n bytes), *len_p bytes. pickle.load then decodes them as ASCII: a byte past 0x7f is refused. */
bool pk_text_string(const unsigned char *s, size_t n, unsigned char *out, size_t *len_p, char *why,
                    size_t whylen);

/* UNICODE's argument: raw-unicode-escape (a byte is its Latin-1 character; \\uXXXX and
 * \\UXXXXXXXX are code points, lone surrogates allowed) as UTF-8 into out (room for 2 * n
 * bytes), *len_p bytes: what BINUNICODE holds for the same str. */
bool pk_text_unicode(const unsigned char *s, size_t n, unsigned char *out, size_t *len_p, char *why,
                     size_t whylen);

/* PUT's and GET's argument: a memo index in decimal digits. One past SIZE_MAX reads as SIZE_MAX
 * (every limit refuses it). */
bool pk_text_index(const unsigned char *s, size_t n, size_t *idx_p, char *why, size_t whylen);

/* s[0..n) as a short printable quote for a message: at most `room` - 1 characters into out,
 * others than printable ASCII as \\xNN, a long one cut with "...". */
void pk_text_show(const unsigned char *s, size_t n, char *out, size_t room);

#ifdef __cplusplus
}
#endif

#endif /* SP_TOOLS_PICKLE_TEXT_H */
