/*
 * options.c: the one table of SYMPOOL_* variables (name, kind, default, description) and the
 * parsers behind it. Each option is read from the environment once, lazily (pthread_once) and also
 * from a library constructor so that SYMPOOL_DEBUG applies from the very first log line.
 * sp__options_reload() re-reads the environment (tests, via sp::ScopedEnv); sp__option_set()
 * overrides one option from code (source "api").
 *
 * Precedence for the allocator keys: a separate variable (SYMPOOL_MAX_SPLIT_SIZE, ...) or an API
 * set wins over the same key inside SYMPOOL_ALLOC_CONF, which wins over the default. The winner is
 * stored here, with its source, so sp__alloc_conf_get() and `SYMPOOL_INFO=1` agree.
 *
 * Warnings: a malformed value warns once (per variable and value) and keeps the default; an
 * unknown SYMPOOL_* name warns once per appearance. Both are emitted after the log settings of
 * the same load are in force, so SYMPOOL_DEBUG=NONE silences them.
 *
 * Lock: opts_lock guards the value table and the warn-once records. Readers take it too (values
 * are read at init, not per allocation). sp__option_string() returns a pointer into the table:
 * stable storage, but a concurrent reload/set may rewrite it (tests only).
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

extern char **environ;

#define OPT_TEXT_MAX 512 /* longest string value kept (ALLOC_CONF's conf_text is 512 too) */
#define MiB (1ll << 20)

typedef enum { K_BOOL, K_LONG, K_DOUBLE, K_SIZE, K_ENUM, K_STRING } opt_kind_t;

/* A parsed value. */
typedef struct {
    int64_t i;            /* bool, long, size, enum index, DEBUG_SUBSYS mask */
    double d;             /* double options */
    char s[OPT_TEXT_MAX]; /* string value, or the enum's canonical name */
} opt_value_t;

/* Extra validation for one option; false with why filled on failure. */
typedef bool (*opt_check_t)(opt_value_t *v, char *why, size_t why_len);

typedef struct {
    sp_option_t id;             /* index check: the table is in enum order */
    const char *name;           /* full variable name */
    opt_kind_t kind;            /* how the text parses */
    const char *def;            /* default, as text parsed like the variable */
    const char *const *choices; /* K_ENUM: NULL-terminated names, index = value */
    opt_check_t check;          /* range / syntax check, or NULL */
    const char *desc;           /* one line for SYMPOOL_INFO=1 */
} opt_def_t;

static const char *const device_choices[] = {"auto", "cuda", "host", NULL};
static const char *const level_choices[] = {"NONE", "VERSION", "WARN", "INFO", "TRACE", NULL};
static const char *const registrar_choices[] = {"auto", "nccl", "mpi", NULL};
static const char *const report_choices[] = {"none",       "table",     "json",
                                             "prometheus", "table_all", NULL};

/* ---- checks ----------------------------------------------------------------------------- */

static bool check_subsys(opt_value_t *v, char *why, size_t why_len) {
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

static bool check_alloc_conf(opt_value_t *v, char *why, size_t why_len) {
    sp_alloc_conf_t c;
    sp__alloc_conf_defaults(&c);
    return sp__alloc_conf_parse_ex(v->s, &c, NULL, NULL, 0, why, why_len) == SP_SUCCESS;
}

static bool check_roundup(opt_value_t *v, char *why, size_t why_len) {
    if (v->s[0] == '\0')
        return true;
    char text[OPT_TEXT_MAX + 32];
    snprintf(text, sizeof text, "roundup_power2_divisions:%s", v->s);
    sp_alloc_conf_t c;
    sp__alloc_conf_defaults(&c);
    return sp__alloc_conf_parse_ex(text, &c, NULL, NULL, 0, why, why_len) == SP_SUCCESS;
}

static bool check_split(opt_value_t *v, char *why, size_t why_len) {
    if (v->i != 0 && v->i < 20 * MiB) {
        snprintf(why, why_len,
                 "want 0 (unlimited) or at least 20MiB, like PyTorch's max_split_size_mb");
        return false;
    }
    return true;
}

static bool check_min20m(opt_value_t *v, char *why, size_t why_len) {
    if (v->i < 20 * MiB) {
        snprintf(why, why_len, "want at least 20MiB, like PyTorch's max_non_split_rounding_mb");
        return false;
    }
    return true;
}

static bool check_min1m(opt_value_t *v, char *why, size_t why_len) {
    if (v->i < MiB) {
        snprintf(why, why_len, "want at least 1MiB");
        return false;
    }
    return true;
}

static bool check_positive(opt_value_t *v, char *why, size_t why_len) {
    if (v->i <= 0) {
        snprintf(why, why_len, "want more than 0");
        return false;
    }
    return true;
}

static bool check_gc(opt_value_t *v, char *why, size_t why_len) {
    if (!(v->d >= 0.0 && v->d < 1.0)) {
        snprintf(why, why_len, "want a fraction in [0, 1); 0 turns it off");
        return false;
    }
    return true;
}

static bool check_devices(opt_value_t *v, char *why, size_t why_len) {
    if (v->i < 1 || v->i > 64) {
        snprintf(why, why_len, "want 1 to 64 emulated devices");
        return false;
    }
    return true;
}

static bool check_nonneg(opt_value_t *v, char *why, size_t why_len) {
    if (v->i < 0) {
        snprintf(why, why_len, "want 0 (never) or a positive count");
        return false;
    }
    return true;
}

static bool check_timeout(opt_value_t *v, char *why, size_t why_len) {
    if (!(v->d > 0.0)) {
        snprintf(why, why_len, "want a number of seconds above 0");
        return false;
    }
    return true;
}

/* ---- the table ---------------------------------------------------------------------------- */

static const opt_def_t defs[SP_OPT_COUNT] = {
    {SP_OPT_DEVICE, "SYMPOOL_DEVICE", K_ENUM, "auto", device_choices, NULL,
     "backend: auto (cuda when a GPU answers, else host), cuda, host"},
    {SP_OPT_DEBUG, "SYMPOOL_DEBUG", K_ENUM, "WARN", level_choices, NULL,
     "log level: NONE, VERSION, WARN, INFO, TRACE"},
    {SP_OPT_DEBUG_SUBSYS, "SYMPOOL_DEBUG_SUBSYS", K_STRING, "ALL", NULL, check_subsys,
     "subsystems logged: INIT,POOL,DEVICE,SYM,BOOT,COLL,ENV,API,HISTORY,ALL; ^ = all except"},
    {SP_OPT_DEBUG_FILE, "SYMPOOL_DEBUG_FILE", K_STRING, "", NULL, NULL,
     "log file pattern (%h host, %p pid, %r rank); empty = stderr"},
    {SP_OPT_INFO, "SYMPOOL_INFO", K_BOOL, "0", NULL, NULL, "print this table at first load"},
    {SP_OPT_ALLOC_CONF, "SYMPOOL_ALLOC_CONF", K_STRING, "", NULL, check_alloc_conf,
     "allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax"},
    {SP_OPT_NO_CACHING, "SYMPOOL_NO_CACHING", K_BOOL, "0", NULL, NULL,
     "free to the device at once (like PYTORCH_NO_CUDA_MEMORY_CACHING)"},
    {SP_OPT_MAX_SPLIT_SIZE, "SYMPOOL_MAX_SPLIT_SIZE", K_SIZE, "0", NULL, check_split,
     "largest cached block that may be split; 0 = unlimited (max_split_size_mb)"},
    {SP_OPT_MAX_NON_SPLIT_ROUNDING, "SYMPOOL_MAX_NON_SPLIT_ROUNDING", K_SIZE, "20MiB", NULL,
     check_min20m, "slack allowed when reusing an unsplittable block (max_non_split_rounding_mb)"},
    {SP_OPT_LARGE_SEGMENT_SIZE, "SYMPOOL_LARGE_SEGMENT_SIZE", K_SIZE, "20MiB", NULL, check_min1m,
     "segment size for 1-10 MiB requests (large_segment_size_mb)"},
    {SP_OPT_GC_THRESHOLD, "SYMPOOL_GC_THRESHOLD", K_DOUBLE, "0", NULL, check_gc,
     "garbage collection threshold in [0,1); 0 = off (garbage_collection_threshold)"},
    {SP_OPT_ROUNDUP_POWER2_DIVISIONS, "SYMPOOL_ROUNDUP_POWER2_DIVISIONS", K_STRING, "", NULL,
     check_roundup, "N or [64:8,256:4,>:1] (roundup_power2_divisions); empty = off"},
    {SP_OPT_EXPANDABLE_SEGMENTS, "SYMPOOL_EXPANDABLE_SEGMENTS", K_BOOL, "0", NULL, NULL,
     "expandable segments (expandable_segments); parsed and reported"},
    {SP_OPT_HOST_CAPACITY, "SYMPOOL_HOST_CAPACITY", K_SIZE, "80GiB", NULL, check_positive,
     "memory of each emulated host device"},
    {SP_OPT_HOST_DEVICES, "SYMPOOL_HOST_DEVICES", K_LONG, "1", NULL, check_devices,
     "number of emulated host devices (1-64)"},
    {SP_OPT_HOST_FAIL_AFTER, "SYMPOOL_HOST_FAIL_AFTER", K_LONG, "0", NULL, check_nonneg,
     "make the Nth host device allocation fail; 0 = never"},
    {SP_OPT_SYM_TIMEOUT, "SYMPOOL_SYM_TIMEOUT", K_DOUBLE, "60", NULL, check_timeout,
     "seconds a symmetric collective waits for every rank"},
    {SP_OPT_SYM_REGISTRAR, "SYMPOOL_SYM_REGISTRAR", K_ENUM, "auto", registrar_choices, NULL,
     "who registers symmetric windows: auto, nccl, mpi"},
    {SP_OPT_REPORT, "SYMPOOL_REPORT", K_ENUM, "none", report_choices, NULL,
     "report at exit: none, table, json, prometheus, table_all (every key)"},
    {SP_OPT_REPORT_FILE, "SYMPOOL_REPORT_FILE", K_STRING, "", NULL, NULL,
     "file for SYMPOOL_REPORT (%h host, %p pid, %r rank); empty = stdout"},
};

/* Variables that start with SYMPOOL_ but belong to the build, the tests or the Python package. */
static const char *const allowed_names[] = {"SYMPOOL_TEST_DEVICE", "SYMPOOL_LIBRARY"};

/* ---- state ---------------------------------------------------------------------------- */

typedef struct {
    opt_value_t v;                 /* the value in force */
    sp_option_source_t src;        /* where it came from */
    char warned_bad[OPT_TEXT_MAX]; /* the malformed env text already warned about, "" = none */
    bool has_warned_bad;           /* warned_bad is meaningful (the bad text may be "") */
} opt_state_t;

#define UNKNOWN_MAX 32
static pthread_mutex_t opts_lock = PTHREAD_MUTEX_INITIALIZER;
static opt_state_t opts[SP_OPT_COUNT];       /* (opts_lock) */
static char unknown_warned[UNKNOWN_MAX][64]; /* unknown names warned at the last load (opts_lock) */
static int n_unknown_warned;                 /* (opts_lock) */
static pthread_once_t opts_once = PTHREAD_ONCE_INIT;
static _Thread_local bool opts_loading; /* this thread is inside a load: don't recurse */

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
    for (; isdigit((unsigned char)*p); p++) {
        uint64_t digit = (uint64_t)(*p - '0');
        if (whole > (UINT64_MAX - digit) / 10)
            return false;
        whole = whole * 10 + digit;
    }
    uint64_t frac = 0, denom = 1; /* the fraction as frac/denom, up to 9 digits kept */
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return false;
        for (; isdigit((unsigned char)*p); p++)
            if (denom < 1000000000ull) {
                frac = frac * 10 + (uint64_t)(*p - '0');
                denom *= 10;
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
    uint64_t mult = 1ull << shift;
    if (whole > UINT64_MAX / mult)
        return false;
    uint64_t bytes = whole * mult;
    /* frac/denom * mult < mult <= 2^40 and frac < 10^9, so frac * mult fits in 64 bits... when
     * mult <= 2^34; above that, divide first. */
    uint64_t extra = mult <= (1ull << 34) ? frac * mult / denom
                                          : frac * (mult / denom) + frac * (mult % denom) / denom;
    if (shift == 0 && frac != 0)
        return false; /* a fraction of a byte */
    if (bytes > UINT64_MAX - extra || bytes + extra > (uint64_t)SIZE_MAX)
        return false;
    *bytes_p = (size_t)(bytes + extra);
    return true;
}

static bool parse_long(const char *text, int64_t *v_p) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || errno != 0)
        return false;
    while (isspace((unsigned char)*end))
        end++;
    if (*end != '\0')
        return false;
    *v_p = v;
    return true;
}

static bool parse_double(const char *text, double *v_p) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno != 0 || !isfinite(v))
        return false;
    while (isspace((unsigned char)*end))
        end++;
    if (*end != '\0')
        return false;
    *v_p = v;
    return true;
}

/* Parses text for option d into *out; false with why filled when malformed. */
static bool parse_value(const opt_def_t *d, const char *text, opt_value_t *out, char *why,
                        size_t why_len) {
    opt_value_t v;
    memset(&v, 0, sizeof v);
    bool ok = true;
    bool b;
    size_t sz;
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
        ok = parse_long(text, &v.i);
        if (!ok)
            snprintf(why, why_len, "want a whole number");
        break;
    case K_DOUBLE:
        ok = parse_double(text, &v.d);
        if (!ok)
            snprintf(why, why_len, "want a number");
        break;
    case K_SIZE:
        ok = sp__parse_size(text, &sz) && sz <= (size_t)INT64_MAX;
        v.i = (int64_t)sz;
        if (!ok)
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
    if (ok && d->check != NULL)
        ok = d->check(&v, why, why_len);
    if (ok)
        *out = v;
    return ok;
}

static void set_default_locked(sp_option_t o) {
    char why[256];
    bool ok = parse_value(&defs[o], defs[o].def, &opts[o].v, why, sizeof why);
    (void)
        ok; /* the defaults are checked by the unit tests (every option starts from its default) */
    opts[o].src = SP_OPT_SRC_DEFAULT;
}

/* ---- ALLOC_CONF onto the separate options --------------------------------------------------- */

/* The options an ALLOC_CONF key maps onto. */
static const struct {
    unsigned key;    /* SP_CONF_KEY_* */
    sp_option_t opt; /* the separate option */
} conf_map[] = {
    {SP_CONF_KEY_MAX_SPLIT_SIZE, SP_OPT_MAX_SPLIT_SIZE},
    {SP_CONF_KEY_MAX_NON_SPLIT_ROUNDING, SP_OPT_MAX_NON_SPLIT_ROUNDING},
    {SP_CONF_KEY_LARGE_SEGMENT_SIZE, SP_OPT_LARGE_SEGMENT_SIZE},
    {SP_CONF_KEY_GC_THRESHOLD, SP_OPT_GC_THRESHOLD},
    {SP_CONF_KEY_ROUNDUP, SP_OPT_ROUNDUP_POWER2_DIVISIONS},
    {SP_CONF_KEY_EXPANDABLE, SP_OPT_EXPANDABLE_SEGMENTS},
};

/* Give every option still at its default (or from an earlier ALLOC_CONF) the ALLOC_CONF key's
 * value. */
static void apply_conf_locked(void) {
    for (size_t k = 0; k < sizeof conf_map / sizeof conf_map[0]; k++)
        if (opts[conf_map[k].opt].src == SP_OPT_SRC_CONF)
            set_default_locked(conf_map[k].opt);
    const char *text = opts[SP_OPT_ALLOC_CONF].v.s;
    if (text[0] == '\0')
        return;
    sp_alloc_conf_t c;
    sp__alloc_conf_defaults(&c);
    unsigned keys = 0;
    char roundup[OPT_TEXT_MAX] = "";
    if (sp__alloc_conf_parse_ex(text, &c, &keys, roundup, sizeof roundup, NULL, 0) != SP_SUCCESS)
        return; /* validated when it was set; cannot happen */
    for (size_t k = 0; k < sizeof conf_map / sizeof conf_map[0]; k++) {
        if (!(keys & conf_map[k].key) || opts[conf_map[k].opt].src != SP_OPT_SRC_DEFAULT)
            continue;
        opt_value_t *v = &opts[conf_map[k].opt].v;
        switch (conf_map[k].opt) {
        case SP_OPT_MAX_SPLIT_SIZE:
            v->i = c.max_split_size == SIZE_MAX ? 0 : (int64_t)c.max_split_size;
            break;
        case SP_OPT_MAX_NON_SPLIT_ROUNDING:
            v->i = (int64_t)c.max_non_split_rounding;
            break;
        case SP_OPT_LARGE_SEGMENT_SIZE:
            v->i = (int64_t)c.large_segment_size;
            break;
        case SP_OPT_GC_THRESHOLD:
            v->d = c.gc_threshold;
            break;
        case SP_OPT_EXPANDABLE_SEGMENTS:
            v->i = c.expandable_segments;
            break;
        default:
            break;
        }
        if (conf_map[k].opt == SP_OPT_ROUNDUP_POWER2_DIVISIONS)
            snprintf(v->s, sizeof v->s, "%s", roundup);
        else if (conf_map[k].opt == SP_OPT_GC_THRESHOLD)
            snprintf(v->s, sizeof v->s, "%g", v->d);
        else if (conf_map[k].opt == SP_OPT_EXPANDABLE_SEGMENTS)
            snprintf(v->s, sizeof v->s, "%s", v->i ? "1" : "0");
        else
            snprintf(v->s, sizeof v->s, "%lldMiB", (long long)(v->i / MiB));
        opts[conf_map[k].opt].src = SP_OPT_SRC_CONF;
    }
}

static void configure_log_locked(void) {
    sp__log_configure((int)opts[SP_OPT_DEBUG].v.i, (unsigned)opts[SP_OPT_DEBUG_SUBSYS].v.i,
                      opts[SP_OPT_DEBUG_FILE].v.s);
}

/* ---- loading ------------------------------------------------------------------------------ */

static bool is_known_name(const char *name, size_t len) {
    for (int o = 0; o < SP_OPT_COUNT; o++)
        if (strlen(defs[o].name) == len && strncmp(defs[o].name, name, len) == 0)
            return true;
    for (size_t k = 0; k < sizeof allowed_names / sizeof allowed_names[0]; k++)
        if (strlen(allowed_names[k]) == len && strncmp(allowed_names[k], name, len) == 0)
            return true;
    return false;
}

/* "SYMPOOL_DEVICE, SYMPOOL_DEBUG, ..." from the table, built once (only ever under opts_lock). */
static const char *known_names(void) {
    static char list[1024];
    if (list[0] == '\0') {
        size_t n = 0;
        for (int o = 0; o < SP_OPT_COUNT && n < sizeof list; o++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", o ? ", " : "", defs[o].name);
    }
    return list;
}

static void warn_unknown_locked(void) {
    char now[UNKNOWN_MAX][64];
    int n_now = 0;
    for (char **e = environ; e != NULL && *e != NULL; e++) {
        if (strncmp(*e, "SYMPOOL_", 8) != 0)
            continue;
        const char *eq = strchr(*e, '=');
        size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
        if (is_known_name(*e, len) || n_now == UNKNOWN_MAX)
            continue;
        snprintf(now[n_now], sizeof now[n_now], "%.*s", (int)len, *e);
        bool warned = false;
        for (int k = 0; k < n_unknown_warned; k++)
            warned = warned || strcmp(unknown_warned[k], now[n_now]) == 0;
        if (!warned)
            SP_WARN(SP_SUB_ENV,
                    "unknown variable %s: ignored; known: %s (SYMPOOL_INFO=1 prints them)",
                    now[n_now], known_names());
        n_now++;
    }
    /* Names that left the environment may warn again if they come back. */
    memcpy(unknown_warned, now, sizeof now);
    n_unknown_warned = n_now;
}

static void load_locked(void) {
    bool bad[SP_OPT_COUNT] = {false};
    char why[SP_OPT_COUNT][256];
    for (int o = 0; o < SP_OPT_COUNT; o++) {
        const char *env = getenv(defs[o].name);
        set_default_locked((sp_option_t)o);
        if (env == NULL) {
            opts[o].has_warned_bad = false;
            continue;
        }
        opt_value_t v;
        if (parse_value(&defs[o], env, &v, why[o], sizeof why[o])) {
            opts[o].v = v;
            opts[o].src = SP_OPT_SRC_ENV;
            opts[o].has_warned_bad = false;
        } else if (!opts[o].has_warned_bad || strcmp(opts[o].warned_bad, env) != 0) {
            bad[o] = true;
            snprintf(opts[o].warned_bad, sizeof opts[o].warned_bad, "%s", env);
            opts[o].has_warned_bad = true;
        }
    }
    configure_log_locked(); /* before the warnings, so SYMPOOL_DEBUG of this load decides */
    apply_conf_locked();
    for (int o = 0; o < SP_OPT_COUNT; o++)
        if (bad[o])
            SP_WARN(SP_SUB_ENV, "%s='%s' is malformed (%s): using the default '%s'", defs[o].name,
                    opts[o].warned_bad, why[o], defs[o].def);
    warn_unknown_locked();
}

static void first_load(void) {
    opts_loading = true;
    pthread_mutex_lock(&opts_lock);
    load_locked();
    bool info = opts[SP_OPT_INFO].v.i != 0;
    int level = (int)opts[SP_OPT_DEBUG].v.i;
    pthread_mutex_unlock(&opts_lock);
    if (level == SP_LOG_VERSION || level >= SP_LOG_INFO)
        sp__log_at(SP_LOG_VERSION, SP_SUB_INIT, __FILE__, __LINE__, "sympool version %s",
#ifdef SP_VERSION_STRING
                   SP_VERSION_STRING
#else
                   "unknown"
#endif
        );
    if (info)
        sp__options_print(stderr);
    opts_loading = false;
}

void sp__options_ensure(void) {
    if (opts_loading)
        return; /* a warning logged by the load itself: the table is being filled */
    pthread_once(&opts_once, first_load);
}

__attribute__((constructor)) static void options_at_load(void) {
    sp__options_ensure();
}

void sp__options_reload(void) {
    sp__options_ensure();
    opts_loading = true;
    pthread_mutex_lock(&opts_lock);
    load_locked();
    pthread_mutex_unlock(&opts_lock);
    opts_loading = false;
}

/* ---- access ------------------------------------------------------------------------------- */

static bool valid_opt(sp_option_t opt) {
    return (unsigned)opt < SP_OPT_COUNT;
}

int64_t sp__option_int(sp_option_t opt) {
    if (!valid_opt(opt))
        return 0;
    sp__options_ensure();
    pthread_mutex_lock(&opts_lock);
    int64_t v = opts[opt].v.i;
    pthread_mutex_unlock(&opts_lock);
    return v;
}

double sp__option_double(sp_option_t opt) {
    if (!valid_opt(opt))
        return 0.0;
    sp__options_ensure();
    pthread_mutex_lock(&opts_lock);
    double v = opts[opt].v.d;
    pthread_mutex_unlock(&opts_lock);
    return v;
}

const char *sp__option_string(sp_option_t opt) {
    if (!valid_opt(opt))
        return "";
    sp__options_ensure();
    return opts[opt].v.s;
}

sp_option_source_t sp__option_source(sp_option_t opt) {
    if (!valid_opt(opt))
        return SP_OPT_SRC_DEFAULT;
    sp__options_ensure();
    pthread_mutex_lock(&opts_lock);
    sp_option_source_t s = opts[opt].src;
    pthread_mutex_unlock(&opts_lock);
    return s;
}

const char *sp__option_name(sp_option_t opt) {
    return valid_opt(opt) ? defs[opt].name : "SYMPOOL_?";
}

sp_status_t sp__option_set(sp_option_t opt, const char *value) {
    SP_ARG_CHECK(valid_opt(opt), SP_SUB_ENV, "option %d is not a valid sp_option_t", (int)opt);
    sp__options_ensure();
    opt_value_t v;
    char why[256];
    if (value == NULL) { /* back to the default */
        pthread_mutex_lock(&opts_lock);
        set_default_locked(opt);
        if (opt == SP_OPT_ALLOC_CONF)
            apply_conf_locked();
        else
            for (size_t k = 0; k < sizeof conf_map / sizeof conf_map[0]; k++)
                if (conf_map[k].opt == opt)
                    apply_conf_locked();
        configure_log_locked();
        pthread_mutex_unlock(&opts_lock);
        return SP_SUCCESS;
    }
    if (!parse_value(&defs[opt], value, &v, why, sizeof why))
        return sp__error(SP_ERR_INVALID_ARGUMENT, SP_SUB_ENV, "%s='%s' is malformed: %s",
                         defs[opt].name, value, why);
    pthread_mutex_lock(&opts_lock);
    opts[opt].v = v;
    opts[opt].src = SP_OPT_SRC_API;
    if (opt == SP_OPT_ALLOC_CONF)
        apply_conf_locked();
    configure_log_locked();
    pthread_mutex_unlock(&opts_lock);
    return SP_SUCCESS;
}

/* ---- printing ----------------------------------------------------------------------------- */

static const char *source_name(sp_option_source_t s) {
    switch (s) {
    case SP_OPT_SRC_ENV:
        return "env";
    case SP_OPT_SRC_CONF:
        return "ALLOC_CONF";
    case SP_OPT_SRC_API:
        return "api";
    default:
        return "default";
    }
}

/* The value as a user would write it: sizes in the largest exact binary unit. */
static void format_value(sp_option_t o, const opt_value_t *v, char *out, size_t cap) {
    static const char *const units[] = {"", "KiB", "MiB", "GiB", "TiB"};
    switch (defs[o].kind) {
    case K_BOOL:
        snprintf(out, cap, "%s", v->i ? "on" : "off");
        break;
    case K_LONG:
        snprintf(out, cap, "%lld", (long long)v->i);
        break;
    case K_DOUBLE:
        snprintf(out, cap, "%g", v->d);
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

void sp__options_print(void *file) {
    FILE *f = file ? (FILE *)file : stderr;
    sp__options_ensure();
    pthread_mutex_lock(&opts_lock);
    fprintf(f, "sympool options (value, default, source):\n");
    for (int o = 0; o < SP_OPT_COUNT; o++) {
        char val[OPT_TEXT_MAX + 8], def[OPT_TEXT_MAX + 8];
        opt_value_t dv;
        char why[256];
        if (!parse_value(&defs[o], defs[o].def, &dv, why, sizeof why))
            memset(&dv, 0, sizeof dv);
        format_value((sp_option_t)o, &opts[o].v, val, sizeof val);
        format_value((sp_option_t)o, &dv, def, sizeof def);
        fprintf(f, "  %-34s %-16s default %-10s [%s]  %s\n", defs[o].name, val, def,
                source_name(opts[o].src), defs[o].desc);
    }
    pthread_mutex_unlock(&opts_lock);
}
