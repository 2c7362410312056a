/*
 * alloc_conf.c: reads PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax ("key:value,key:value") so users can
 * paste the string they already tune, and resolves the allocator settings the pool uses.
 *
 * Keys and checks follow PyTorch's AllocatorConfig (facts in shared/reference/pytorch-allocator.md
 * §1.2, §1.9): *_mb values are MiB; max_split_size_mb and max_non_split_rounding_mb are at least 20
 * (kLargeBuffer); garbage_collection_threshold lies strictly in (0, 1); roundup_power2_divisions is
 * "N", a power of 2 (all 16 intervals), or "[64:8,256:4,>:1]" (values powers of 2 or 0) where keys
 * are power-of-2 MB boundaries in any order, the first one also fills the intervals below it and
 * ">" fills those after the boundary before it; expandable_segments is True/False. CUDA-only keys
 * are checked and ignored (INFO); backend:cudaMallocAsync is refused.
 *
 * Invariant: a failed parse changes nothing; we parse into a copy and copy back on success.
 * A pure parser: no state, no lock, no logging (what it has to say goes to the caller's note
 * function), no option reads. config.c resolves the parsed keys under the separate SYMPOOL_*
 * variables into the typed sp_alloc_conf_t the allocator uses.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"    /* sp_alloc_conf_t and the parser's prototypes only */
#include "core/options.h" /* sp__conf_number, sp__roundup_parse */

#define MiB ((size_t)1 << 20)
#define MIN_SPLIT_MB 20 /* kLargeBuffer / 1 MiB: PyTorch's floor for the two *_mb limits */
#define N_INTERVALS 16  /* roundup intervals: [1 MiB, 2 MiB), ..., [32 GiB, inf) */

void sp__alloc_conf_defaults(sp_alloc_conf_t *conf_p) {
    memset(conf_p, 0, sizeof *conf_p);
    conf_p->max_split_size = SIZE_MAX;
    conf_p->max_non_split_rounding = 20 * MiB;
    conf_p->large_segment_size = 20 * MiB;
    conf_p->memory_fraction = 1.0;
    conf_p->pinned_num_register_threads = 1;
}

/* A token of the text: [p, p+len), trimmed. */
typedef struct {
    const char *p; /* first character */
    size_t len;    /* length in characters */
} span_t;

static span_t trim(const char *p, size_t len) {
    while (len > 0 && isspace((unsigned char)*p)) {
        p++;
        len--;
    }
    while (len > 0 && isspace((unsigned char)p[len - 1]))
        len--;
    return (span_t){p, len};
}

static bool span_is(span_t s, const char *word) {
    return strlen(word) == s.len && strncmp(s.p, word, s.len) == 0;
}

/* Non-negative decimal integer, digits only, no overflow. */
/* A whole number. One too large for 64 bits reads as UINT64_MAX (a number, which every key's
 * range check then refuses as out of range, not as malformed). */
static bool span_uint(span_t s, uint64_t *v_p) {
    if (s.len == 0)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < s.len; i++) {
        if (!isdigit((unsigned char)s.p[i]))
            return false;
        uint64_t digit = (uint64_t)(s.p[i] - '0');
        v = v > (UINT64_MAX - digit) / 10 ? UINT64_MAX : v * 10 + digit;
    }
    *v_p = v;
    return true;
}

/* Whether the digits of s are a number past UINT64_MAX (which span_uint reads as UINT64_MAX). */
static bool span_past_u64(span_t s) {
    static const char max[] = "18446744073709551615";
    while (s.len > 1 && s.p[0] == '0') {
        s.p++;
        s.len--;
    }
    return s.len > sizeof max - 1 || (s.len == sizeof max - 1 && memcmp(s.p, max, s.len) > 0);
}

bool sp__conf_number(const char *text, size_t len, double *v_p) {
    span_t s = trim(text, len);
    char tmp[64];
    if (s.len == 0 || s.len >= sizeof tmp)
        return false;
    memcpy(tmp, s.p, s.len);
    tmp[s.len] = '\0';
    char *end;
    errno = 0;
    double v = sp__strtod_c(tmp, &end);
    if (end == tmp || *end != '\0' || errno != 0 || !isfinite(v))
        return false;
    *v_p = v;
    return true;
}

static bool span_double(span_t s, double *v_p) {
    return sp__conf_number(s.p, s.len, v_p);
}

/* True or False, as PyTorch spells them and nothing else: its ConfigTokenizer::toBool
 * (c10/core/AllocatorConfig.h) refuses "true", so a setting taken here but refused by PyTorch
 * would pass with sympool and stop the same job under torch. */
static bool span_bool(span_t s, bool *v_p) {
    if (span_is(s, "True")) {
        *v_p = true;
        return true;
    }
    if (span_is(s, "False")) {
        *v_p = false;
        return true;
    }
    return false;
}

static bool pow2_or_zero(uint64_t v) {
    return (v & (v - 1)) == 0;
}

static int log2_u64(uint64_t v) {
    return 63 - __builtin_clzll(v);
}

/* "N" or "[64:8,256:4,>:1]" onto table (which is replaced as a whole). */
static bool parse_roundup(span_t v, uint32_t table[N_INTERVALS], char *why, size_t why_len) {
    uint32_t out[N_INTERVALS] = {0};
    uint64_t n;
    if (v.len > 0 && v.p[0] != '[') {
        /* PyTorch refuses 0 here (only a list entry may say 0, "no rounding"). */
        bool number = span_uint(v, &n);
        if (!number || n == 0 || !pow2_or_zero(n) || n > UINT32_MAX) {
            snprintf(why, why_len, "roundup_power2_divisions: '%.*s' %s", (int)v.len, v.p,
                     !number          ? "is neither N (a power of 2) nor [MB:N,...,>:N]"
                     : n > UINT32_MAX ? "is out of range (at most 2147483648)"
                                      : "is not a power of 2");
            return false;
        }
        for (int i = 0; i < N_INTERVALS; i++)
            out[i] = (uint32_t)n;
        memcpy(table, out, sizeof out);
        return true;
    }
    if (v.len < 2 || v.p[v.len - 1] != ']') {
        snprintf(why, why_len, "roundup_power2_divisions: '%.*s' is neither N nor [MB:N,...,>:N]",
                 (int)v.len, v.p);
        return false;
    }
    const char *p = v.p + 1, *stop = v.p + v.len - 1;
    /* PyTorch's rules, entry by entry and in any order: a boundary sets its own interval (a later
     * entry for the same interval wins); the first boundary also fills every interval below it;
     * ">" fills from just after the boundary read before it, or from interval 1 when none was
     * (PyTorch's last_index starts at 0). "[]" leaves every interval at 0. */
    int last = 0;      /* interval of the boundary read last */
    bool first = true; /* no boundary read yet */
    while (p < stop) {
        const char *comma = memchr(p, ',', (size_t)(stop - p));
        const char *end = comma ? comma : stop;
        span_t entry = trim(p, (size_t)(end - p));
        p = end + 1;
        if (entry.len == 0 && comma == NULL)
            break; /* blanks only ("[ ]"), or after a trailing comma ("[64:8, ]") */
        const char *colon = memchr(entry.p, ':', entry.len);
        if (colon == NULL) {
            snprintf(why, why_len, "roundup_power2_divisions: bad entry '%.*s' (want MB:N)",
                     (int)entry.len, entry.p);
            return false;
        }
        span_t key = trim(entry.p, (size_t)(colon - entry.p));
        span_t val = trim(colon + 1, (size_t)(entry.p + entry.len - colon - 1));
        bool number = span_uint(val, &n);
        if (!number || !pow2_or_zero(n) || n > UINT32_MAX) {
            snprintf(why, why_len, "roundup_power2_divisions: value '%.*s' %s", (int)val.len, val.p,
                     number && n > UINT32_MAX ? "is out of range (at most 2147483648)"
                                              : "is not a power of 2 or 0");
            return false;
        }
        if (span_is(key, ">")) {
            for (int i = last + 1; i < N_INTERVALS; i++)
                out[i] = (uint32_t)n;
            continue;
        }
        uint64_t mb;
        number = span_uint(key, &mb);
        if (!number || mb == 0 || !pow2_or_zero(mb)) {
            /* span_uint reads any number past 64 bits as UINT64_MAX (2^64 is a power of 2) */
            snprintf(why, why_len, "roundup_power2_divisions: boundary '%.*s' %s", (int)key.len,
                     key.p,
                     number && mb == UINT64_MAX ? "is out of range (at most 9223372036854775808)"
                                                : "is not a power-of-2 MB size");
            return false;
        }
        int idx = log2_u64(mb); /* interval index from 1 MiB; clamped like PyTorch */
        if (idx > N_INTERVALS - 1)
            idx = N_INTERVALS - 1;
        if (first) /* the first boundary also covers every interval below it */
            for (int i = 0; i < idx; i++)
                out[i] = (uint32_t)n;
        first = false;
        out[idx] = (uint32_t)n;
        last = idx;
    }
    memcpy(table, out, sizeof out);
    return true;
}

bool sp__roundup_parse(const char *text, uint32_t table[N_INTERVALS], char *why, size_t why_len) {
    return parse_roundup(trim(text, strlen(text)), table, why, why_len);
}

/* One "*_mb" key with a floor, to bytes. clamp: a value past what size_t holds in MB is that
 * most (PyTorch's parseMaxSplitSize and parseMaxNonSplitRoundingSize in c10/core/
 * AllocatorConfig.cpp take any size_t and clamp it to SIZE_MAX / 1 MiB), else it is refused. */
static bool parse_mb(span_t key, span_t v, uint64_t min_mb, bool clamp, size_t *bytes_p, char *why,
                     size_t why_len) {
    uint64_t mb;
    if (!span_uint(v, &mb)) {
        snprintf(why, why_len, "%.*s: '%.*s' is not a whole number of MB", (int)key.len, key.p,
                 (int)v.len, v.p);
        return false;
    }
    /* Only a size_t: past 2^64 - 1 (span_uint's saturated UINT64_MAX) stoull refuses it there. */
    if (mb > SIZE_MAX / MiB && clamp && !span_past_u64(v))
        mb = SIZE_MAX / MiB;
    if (mb > SIZE_MAX / MiB) {
        snprintf(why, why_len, "%.*s: %.*s is out of range (at most %llu MB)", (int)key.len, key.p,
                 (int)v.len, v.p, (unsigned long long)(SIZE_MAX / MiB));
        return false;
    }
    if (mb < min_mb) {
        snprintf(why, why_len, "%.*s: %llu is below the minimum %llu (MB)", (int)key.len, key.p,
                 (unsigned long long)mb, (unsigned long long)min_mb);
        return false;
    }
    *bytes_p = (size_t)mb * MiB;
    return true;
}

/* CUDA-only keys: check the value's form, keep it in c for the snapshot's allocator_settings
 * (PyTorch reports them), then say that it has no effect here. */
static bool parse_ignored(span_t key, span_t v, sp_alloc_conf_t *c, char *why, size_t why_len) {
    bool b = false; /* GCC 12 -O2 cannot see that only a parsed value is read */
    uint64_t n;
    if (span_is(key, "backend")) {
        if (span_is(v, "native"))
            return true;
        if (span_is(v, "cudaMallocAsync"))
            snprintf(why, why_len,
                     "backend: cudaMallocAsync is not supported by sympool (use native)");
        else
            snprintf(why, why_len, "backend: '%.*s' is not native or cudaMallocAsync", (int)v.len,
                     v.p);
        return false;
    }
    /* PyTorch: the register threads are a power of 2 up to its maximum of 128; the pinned
     * reserve segment is a whole number of MB above 0. */
    bool ok = span_is(key, "pinned_num_register_threads")
                  ? (span_uint(v, &n) && n > 0 && n <= 128 && (n & (n - 1)) == 0)
              : span_is(key, "pinned_reserve_segment_size_mb") ? (span_uint(v, &n) && n > 0)
                                                               : span_bool(v, &b);
    if (!ok) {
        snprintf(why, why_len, "%.*s: bad value '%.*s'", (int)key.len, key.p, (int)v.len, v.p);
        return false;
    }
    if (span_is(key, "pinned_num_register_threads"))
        c->pinned_num_register_threads = (uint32_t)n;
    else if (span_is(key, "release_lock_on_cudamalloc") ||
             span_is(key, "release_lock_on_hipmalloc"))
        c->release_lock_on_cudamalloc = b;
    else if (span_is(key, "pinned_use_cuda_host_register") ||
             span_is(key, "pinned_use_hip_host_register"))
        c->pinned_use_cuda_host_register = b;
    else if (span_is(key, "graph_capture_record_stream_reuse"))
        c->graph_capture_record_stream_reuse = b;
    return true;
}

/* PyTorch's CUDA build also takes the ROCm spellings (release_lock_on_hipmalloc,
 * pinned_use_hip_host_register), so a string written for either parses on both. */
static const char *const ignored_keys[] = {
    "backend",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_use_background_threads",
    "graph_capture_record_stream_reuse",
};

/* One "key:value" entry onto c and *keys (both unchanged on failure). *ignored_p: a CUDA-only key
 * that is accepted and has no effect here (why says so). */
static sp_status_t parse_entry(span_t entry, sp_alloc_conf_t *c, unsigned *keys, char *roundup_text,
                               size_t roundup_len, bool *ignored_p, char *why, size_t why_len) {
    const char *colon = memchr(entry.p, ':', entry.len);
    if (colon == NULL) {
        snprintf(why, why_len, "'%.*s': expected key:value", (int)entry.len, entry.p);
        return SP_ERR_INVALID_ARGUMENT;
    }
    span_t key = trim(entry.p, (size_t)(colon - entry.p));
    span_t v = trim(colon + 1, (size_t)(entry.p + entry.len - colon - 1));
    bool ok;
    unsigned bit = 0;
    if (span_is(key, "max_split_size_mb")) {
        ok = parse_mb(key, v, MIN_SPLIT_MB, true, &c->max_split_size, why, why_len);
        bit = SP_CONF_KEY_MAX_SPLIT_SIZE;
    } else if (span_is(key, "max_non_split_rounding_mb")) {
        ok = parse_mb(key, v, MIN_SPLIT_MB, true, &c->max_non_split_rounding, why, why_len);
        bit = SP_CONF_KEY_MAX_NON_SPLIT_ROUNDING;
    } else if (span_is(key, "large_segment_size_mb")) {
        size_t seg = 0;
        ok = parse_mb(key, v, SP_LARGE_SEGMENT_MIN / MiB, false, &seg, why, why_len);
        if (ok && (seg > SP_LARGE_SEGMENT_MAX || seg % SP_LARGE_SEGMENT_STEP != 0)) {
            snprintf(why, why_len, "large_segment_size_mb: %zu is %s (MB)", seg / MiB,
                     seg > SP_LARGE_SEGMENT_MAX ? "above the maximum 1048576" : "not even");
            ok = false;
        }
        if (ok)
            c->large_segment_size = seg;
        bit = SP_CONF_KEY_LARGE_SEGMENT_SIZE;
    } else if (span_is(key, "garbage_collection_threshold")) {
        double t = 0.0;
        ok = span_double(v, &t) && t > 0.0 && t < 1.0;
        if (ok)
            c->gc_threshold = t;
        else
            snprintf(why, why_len, "garbage_collection_threshold: '%.*s' is not a number in (0, 1)",
                     (int)v.len, v.p);
        bit = SP_CONF_KEY_GC_THRESHOLD;
    } else if (span_is(key, "roundup_power2_divisions")) {
        ok = parse_roundup(v, c->roundup_divisions, why, why_len);
        if (ok && roundup_text != NULL && roundup_len > 0)
            snprintf(roundup_text, roundup_len, "%.*s", (int)v.len, v.p);
        bit = SP_CONF_KEY_ROUNDUP;
    } else if (span_is(key, "per_process_memory_fraction")) {
        /* PyTorch's start-up form of set_per_process_memory_fraction, on every device. */
        double f = -1.0;
        ok = span_double(v, &f) && f >= 0.0 && f <= 1.0;
        if (ok)
            c->memory_fraction = f;
        else
            snprintf(why, why_len,
                     "per_process_memory_fraction is invalid, set it in [0.0, 1.0] (got '%.*s')",
                     (int)v.len, v.p);
        bit = SP_CONF_KEY_MEMORY_FRACTION;
    } else if (span_is(key, "expandable_segments")) {
        ok = span_bool(v, &c->expandable_segments);
        if (!ok)
            snprintf(why, why_len, "expandable_segments: '%.*s' is not True or False", (int)v.len,
                     v.p);
        bit = SP_CONF_KEY_EXPANDABLE;
    } else {
        bool known = false;
        for (size_t i = 0; i < sizeof ignored_keys / sizeof ignored_keys[0]; i++)
            known = known || span_is(key, ignored_keys[i]);
        if (!known) {
            snprintf(why, why_len,
                     "unknown key '%.*s' (known: max_split_size_mb, max_non_split_rounding_mb, "
                     "large_segment_size_mb, garbage_collection_threshold, "
                     "roundup_power2_divisions, per_process_memory_fraction, "
                     "expandable_segments, and the CUDA-only keys)",
                     (int)key.len, key.p);
            return SP_ERR_INVALID_ARGUMENT;
        }
        if (!parse_ignored(key, v, c, why, why_len))
            return span_is(key, "backend") && span_is(v, "cudaMallocAsync")
                       ? SP_ERR_NOT_SUPPORTED
                       : SP_ERR_INVALID_ARGUMENT;
        snprintf(why, why_len, "ALLOC_CONF key %.*s:%.*s has no effect in sympool: ignored",
                 (int)key.len, key.p, (int)v.len, v.p);
        *ignored_p = true;
        return SP_SUCCESS;
    }
    if (!ok)
        return SP_ERR_INVALID_ARGUMENT;
    *keys |= bit;
    return SP_SUCCESS;
}

sp_status_t sp__alloc_conf_parse_ex(const char *text, sp_alloc_conf_t *conf, unsigned *keys_p,
                                    char *roundup_text, size_t roundup_len, bool lenient,
                                    sp_alloc_conf_note_fn note, void *note_arg, char *why,
                                    size_t why_len) {
    char scratch[512];
    if (why == NULL) {
        why = scratch;
        why_len = sizeof scratch;
    }
    why[0] = '\0';
    if (text == NULL || conf == NULL) {
        snprintf(why, why_len, "NULL text or conf");
        return SP_ERR_INVALID_ARGUMENT;
    }
    size_t total = strlen(text);
    if (total >= sizeof conf->conf_text) {
        snprintf(why, why_len, "the text is %zu characters; at most %zu are kept", total,
                 sizeof conf->conf_text - 1);
        return SP_ERR_INVALID_ARGUMENT;
    }
    /* PyTorch's ConfigTokenizer drops every ' ' wherever it stands ("max_split_size_mb:20 0" is
     * 200; c10/core/AllocatorConfig.h): the entries are read from the text without them, and
     * the text itself is kept as given (the snapshot's PYTORCH_CUDA_ALLOC_CONF). */
    char flat[sizeof conf->conf_text];
    size_t nflat = 0;
    for (size_t i = 0; i < total; i++)
        if (text[i] != ' ')
            flat[nflat++] = text[i];
    flat[nflat] = '\0';
    sp_alloc_conf_t c = *conf;
    unsigned keys = 0;
    const char *p = flat;
    const char *stop = flat + nflat;
    while (p < stop) {
        /* A comma inside [...] belongs to the roundup list, not to the key list. */
        const char *end = p;
        int depth = 0;
        while (end < stop && (depth > 0 || *end != ',')) {
            if (*end == '[')
                depth++;
            else if (*end == ']')
                depth--;
            end++;
        }
        span_t entry = trim(p, (size_t)(end - p));
        p = end + 1;
        if (entry.len == 0)
            continue; /* "a:1,,b:2" and a trailing comma are harmless */
        bool ignored = false;
        char entry_why[512];
        sp_status_t s = parse_entry(entry, &c, &keys, roundup_text, roundup_len, &ignored,
                                    entry_why, sizeof entry_why);
        if (s != SP_SUCCESS && !lenient) {
            snprintf(why, why_len, "%s", entry_why);
            return s;
        }
        if (note != NULL && (s != SP_SUCCESS || ignored))
            note(note_arg, s != SP_SUCCESS, s, entry_why);
    }
    memcpy(c.conf_text, text, total + 1);
    *conf = c;
    if (keys_p != NULL)
        *keys_p = keys;
    return SP_SUCCESS;
}
