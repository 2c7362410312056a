// test_pickle_text.cc: pickles of protocols 0 and 1 (no PROTO; protocol 0's text opcodes INT,
// LONG, FLOAT, STRING, UNICODE, PUT, GET, and the LONG and I01 that protocol 1 writes too), read
// by tools/pickle_read.c as the same values as protocol 4's binary opcodes, and every malformed
// text argument refused with a reason and its offset.
#include "sp_test.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "tools/pickle_read.h"
}

namespace {

using Bytes = std::vector<unsigned char>;

Bytes bytes(const std::string &s) {
    return Bytes(s.begin(), s.end());
}

// A value as text: ints, floats by their bits, strings by their bytes in hex.
std::string show(const pk_value_t *v) {
    char b[64];
    switch (v->type) {
    case PK_NONE:
        return "None";
    case PK_BOOL:
        return v->u.b ? "True" : "False";
    case PK_INT:
        snprintf(b, sizeof b, "%lld", (long long)v->u.i);
        return b;
    case PK_UINT:
        snprintf(b, sizeof b, "u%llu", (unsigned long long)v->u.u);
        return b;
    case PK_BIGINT:
        snprintf(b, sizeof b, "big%llu", (unsigned long long)v->u.bits);
        return b;
    case PK_FLOAT: {
        uint64_t u;
        memcpy(&u, &v->u.f, sizeof u);
        snprintf(b, sizeof b, "f%016llx", (unsigned long long)u);
        return b;
    }
    case PK_STR:
    case PK_BYTES: {
        std::string s = v->type == PK_STR ? "s'" : "b'";
        for (size_t i = 0; i < v->u.str.len; i++) {
            snprintf(b, sizeof b, "%02x", (unsigned char)v->u.str.s[i]);
            s += b;
        }
        return s + "'";
    }
    case PK_LIST:
    case PK_TUPLE: {
        std::string s = v->type == PK_LIST ? "[" : "(";
        for (size_t i = 0; i < v->u.seq.n; i++)
            s += (i ? "," : "") + show(v->u.seq.items[i]);
        return s + (v->type == PK_LIST ? "]" : ")");
    }
    case PK_DICT: {
        std::string s = "{";
        for (size_t i = 0; i < v->u.seq.n; i += 2)
            s += (i ? "," : "") + show(v->u.seq.items[i]) + ":" + show(v->u.seq.items[i + 1]);
        return s + "}";
    }
    default:
        return "?";
    }
}

// The document as text, or "ERR <message>".
std::string read(const Bytes &b, const char *skip = nullptr) {
    pk_doc_t *doc = nullptr;
    char err[300] = "";
    if (!pk_parse_skip(b.data(), b.size(), nullptr, skip, &doc, err, sizeof err))
        return std::string("ERR ") + err;
    std::string s = show(pk_root(doc));
    pk_free(doc);
    return s;
}

// python3: pickle.dumps(o, protocol=0) and protocol=1 of
// o = {"a": [1, -7, 2**31, 2**64-1, -2**63, 2**70, -2**63-1, True, False, None, 1.5,
//            float('inf'), -0.0, (1, "t"), ()], "\u00e9\n\\u": "\U0001f600\ud800\x00"}
const std::string p0 =
    "(dp0\nVa\np1\n(lp2\nI1\naI-7\naL2147483648L\naL18446744073709551615L\naL-"
    "9223372036854775808L\naL1180591620717411303424L\naL-9223372036854775809L\naI01\naI00\naNaF1."
    "5\naFinf\naF-0.0\na(I1\nVt\np3\ntp4\na(tasV\xe9"
    "\\u000a\\u005cu\np5\nV\\U0001f600\\ud800\\u0000\np6\ns.";
const std::string p1 = std::string(
    "}q\x00(X\x01\x00\x00\x00"
    "aq\x01]q\x02(K\x01J\xf9\xff\xff\xffL2147483648L\nL18446744073709551615L\nL-"
    "9223372036854775808L\nL1180591620717411303424L\nL-9223372036854775809L\nI01\nI00\nNG?"
    "\xf8\x00\x00\x00\x00\x00\x00G\x7f\xf0\x00\x00\x00\x00\x00\x00G\x80\x00\x00\x00\x00\x00\x00"
    "\x00(K\x01X\x01\x00\x00\x00tq\x03tq\x04)eX\x05\x00\x00\x00\xc3\xa9\n\\uq\x05X\x08\x00\x00"
    "\x00\xf0\x9f\x98\x80\xed\xa0\x80\x00q\x06u.",
    211);
// What protocol 4 (the binary opcodes) reads of o: 2^70 is 9 bytes of LONG1, as is -2^63-1;
// U+D800 is its three bytes ('surrogatepass'), U+0000 a 0 byte.
const std::string want = "{s'61':[1,-7,2147483648,u18446744073709551615,-9223372036854775808,big9,"
                         "big9,True,False,None,f3ff8000000000000,f7ff0000000000000,"
                         "f8000000000000000,(1,s'74'),()],s'c3a90a5c75':s'f09f9880eda08000'}";

TEST(PickleText, Protocols0And1ReadAsProtocol4) {
    ASSERT_EQ(p1.size(), 211u);
    EXPECT_EQ(read(bytes(p0)), want);
    EXPECT_EQ(read(bytes(p1)), want);
    EXPECT_EQ(pk_protocol(p0.data(), p0.size()), 0);
    EXPECT_EQ(pk_protocol(p1.data(), p1.size()), 1);
    const unsigned char p4[] = {0x80, 4, 'N', '.'};
    EXPECT_EQ(pk_protocol(p4, sizeof p4), 4);
    // PROTO 0 and 1 are what pickle.load reads too (no pickler writes them).
    EXPECT_EQ(read(Bytes{0x80, 0, 'I', '5', '\n', '.'}), "5");
    EXPECT_EQ(read(Bytes{0x80, 1, 'N', '.'}), "None");
    EXPECT_EQ(read(Bytes{0x80, 6, 'N', '.'}),
              "ERR pickle: protocol 6 not supported (0-5 are) at offset 0");
}

// Python 2's pickler wrote a str as STRING, its repr: quoted, with escapes (a str of pickle.load's
// ASCII), and ints with INT and LONG; every form of it reads as Python 3 reads it.
TEST(PickleText, Python2FormsReadAsPickleLoadReadsThem) {
    EXPECT_EQ(read(bytes("(dp0\nS'a\\x41\\n\\'q'\np1\nI01\nsS\"x'y\"\nI00\ns.")),
              "{s'61410a2771':True,s'782779':False}");
    // Every escape of a bytes literal; an unknown one is kept as written (pickle.load warns);
    // an octal one keeps its low 8 bits... which must be ASCII.
    EXPECT_EQ(read(bytes("S'\\\\\\\"\\b\\f\\t\\n\\r\\v\\a\\101\\0\\q'\n.")),
              "s'5c22080c090a0d0b074100"
              "5c71'");
    EXPECT_EQ(read(bytes("S''\n.")), "s''");
    // INT: 2 characters of value 0 or 1 are a bool (I00, I01, as pickle.load's strtol reads
    // "+1" and "-0"); a leading 0 is octal there, and here; past a C long, a Python int.
    EXPECT_EQ(read(bytes("(I+1\nI-0\nI000\nI010\nI-2147483649\nI99999999999999999999\nl.")),
              "[True,False,0,8,-2147483649,big9]");
    EXPECT_EQ(read(bytes("(L5\nL-0L\nL000L\nL9223372036854775808L\nl.")),
              "[5,0,0,u9223372036854775808]");
    EXPECT_EQ(read(bytes("(F1e+100\nF-nan\nFINF\nF.5\nF5.\nF1E-400\nl.")),
              "[f54b249ad2594c37d,ffff8000000000000,f7ff0000000000000,f3fe0000000000000,"
              "f4014000000000000,f0000000000000000]");
    // UNICODE: a byte is its Latin-1 character, \u and \U escapes are code points; a backslash
    // before anything else, or last, is itself.
    EXPECT_EQ(read(bytes("V\xff\\x\\\\u0041\\U00010000\\\n.")),
              "s'c3bf5c785c5c7530303431f09080805c'");
    // The memo: PUT and GET with decimal indexes (leading zeros read as pickle.load reads them),
    // mixed with protocol 1's.
    EXPECT_EQ(read(bytes("(Vx\np007\n0g7\nh\x07l.")), "[s'78',s'78']");
}

// Every malformed text argument is refused with what is wrong, the argument as written and the
// opcode's offset; nothing is read past the input's end.
TEST(PickleText, MalformedArgumentsAreRefusedSayingWhy) {
    struct Case {
        std::string in, err;
    } cases[] = {
        {"I12", "truncated INT (no newline ends its argument) at offset 0"},
        {"(I1\nS'abc", "truncated STRING (no newline ends its argument) at offset 4"},
        {"I12x\n.", "INT argument '12x' is not a decimal integer (digits after an optional sign; "
                    "no pickler writes other forms) at offset 0"},
        {"I 5\n.", "INT argument ' 5' is not a decimal integer (digits after an optional sign; "
                   "no pickler writes other forms) at offset 0"},
        {"I\n.", "INT argument '' is empty at offset 0"},
        {"I-\n.", "INT argument '-' has no digits at offset 0"},
        {"I09\n.", "INT argument '09' has a leading 0, which makes it octal, and a digit 8 or 9 "
                   "(pickle.load refuses it) at offset 0"},
        {"I01000000000000000000000\n.",
         "INT argument '01000000000000000000000' is octal (a leading 0) and past the range of "
         "a C long (pickle.load refuses it) at offset 0"},
        {std::string("I1\0"
                     "2\n.",
                     6),
         "INT argument holds a NUL byte at offset 0"},
        {"L010L\n.", "LONG argument '010L' has a leading 0 (pickle.load refuses it) at offset 0"},
        {"LL\n.", "LONG argument 'L' is empty at offset 0"},
        {"L1_0L\n.", "LONG argument '1_0L' is not a decimal integer (digits after an optional "
                     "sign, then an optional L; no pickler writes other forms) at offset 0"},
        {"L" + std::string(4301, '7') + "L\n.",
         "LONG argument '" + std::string(44, '7') +
             "...' has 4301 digits "
             "(pickle.load refuses more than 4300: sys.int_info.default_max_str_digits) at offset "
             "0"},
        {"F1e400\n.", "FLOAT argument '1e400' is too large for a float (pickle.load refuses it) "
                      "at offset 0"},
        {"F0x1p3\n.", "FLOAT argument '0x1p3' is not a float as Python's repr writes it (digits, "
                      "a '.', an exponent; inf, nan) at offset 0"},
        {"F1e\n.", "FLOAT argument '1e' is not a float as Python's repr writes it (digits, a "
                   "'.', an exponent; inf, nan) at offset 0"},
        {"F.\n.", "FLOAT argument '.' is not a float as Python's repr writes it (digits, a '.', "
                  "an exponent; inf, nan) at offset 0"},
        {"S'abc\n.", "STRING argument '\\x27abc' is not quoted (pickle.load refuses it) at "
                     "offset 0"},
        {"S'a\"\n.", "STRING argument '\\x27a\"' is not quoted (pickle.load refuses it) at "
                     "offset 0"},
        {"S'a\\'\n.", "STRING argument '\\x27a\\x5c\\x27' ends in a lone backslash (pickle.load "
                      "refuses it) at offset 0"},
        {"S'\\x4g'\n.", "STRING argument '\\x27\\x5cx4g\\x27' has \\x without two hex digits "
                        "after it (pickle.load refuses it) at offset 0"},
        {"S'\\xe9'\n.", "STRING argument '\\x27\\x5cxe9\\x27' is not ASCII (byte 0xe9 at 0 of its "
                        "1 after the escapes): pickle.load refuses it at offset 0"},
        {"V\\u12\n.", "UNICODE argument '\\x5cu12' has a truncated \\u escape (4 hex digits "
                      "needed; pickle.load refuses it) at offset 0"},
        {"V\\U00110000\n.", "UNICODE argument '\\x5cU00110000' has \\U00110000, past U+10FFFF "
                            "(pickle.load refuses it) at offset 0"},
        {"Np-1\n.", "PUT argument '-1' is not a memo index (decimal digits) at offset 1"},
        {"Np\n.", "PUT argument '' is empty at offset 1"},
        {"Np16777216\n.", "memo index 16777216 exceeds the limit of 16777216 at offset 1"},
        {"Np99999999999999999999999\n.",
         "PUT argument '99999999999999999999999' exceeds the memo's limit at offset 1"},
        {"Np0\ng1\n.", "memo key 1 is not defined at offset 4"},
        {"g99999999999999999999999\n.",
         "GET argument '99999999999999999999999' is no memo key defined at offset 0"},
        {"p0\n.", "memo put needs 1 value on the stack at offset 0"},
        // Bytes are pickled with GLOBAL and REDUCE before protocol 3: refused, as at protocol 2.
        {"c_codecs\nencode\n.", "opcode GLOBAL at offset 0 not allowed"},
    };
    for (const Case &c : cases)
        EXPECT_EQ(read(bytes(c.in)), "ERR pickle: " + c.err) << c.in.substr(0, 40);
    // Every cut of a protocol 0 pickle fails (no crash, no read past its end).
    for (size_t n = 0; n + 1 < p0.size(); n++)
        EXPECT_EQ(read(Bytes(p0.begin(), p0.begin() + (long)n)).substr(0, 4), "ERR ") << n;
}

// A skipped value (pk_parse_skip's "frames") ends where the dict goes on with its next key, also
// when that key is a text string or a GET of one: the dict then reads as the whole reader reads
// it, less the skipped pair.
TEST(PickleText, ATextKeyEndsASkippedValue) {
    // {"size": 1, "frames": [{"name": "f"}], "size": 5}, the last key a GET of the first
    const Bytes b = bytes("\x80\x02}(Vsize\np0\nI1\nVframes\n](}(Vname\nVf\nueg0\nI5\nVk\nI6\nu.");
    EXPECT_EQ(read(b), "{s'73697a65':1,s'6672616d6573':[{s'6e616d65':s'66'}],s'73697a65':5,"
                       "s'6b':6}");
    EXPECT_EQ(read(b, "frames"), "{s'73697a65':1,s'73697a65':5,s'6b':6}");
    const Bytes c = bytes("\x80\x02}(Vframes\n](}(Vname\nVf\nueVsize\nI5\nu.");
    EXPECT_EQ(read(c, "frames"), "{s'73697a65':5}");
}

} // namespace
