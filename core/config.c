/*
 * config.c: the configuration in force and the gate every log line and error passes through.
 * It reads the SYMPOOL_* variables at first use (the first option read, log line or error; not
 * in a library constructor, so a program's setenv before its first sympool call counts) and again
 * at the first use after sp_shutdown; it applies the log settings, says once what is malformed,
 * and resolves the allocator settings into one typed sp_alloc_conf_t. It sits at the top of
 * core/: options.c (the table and its parsers), alloc_conf.c (the ALLOC_CONF parser), log.c
 * (writing lines) and status.c (the last-error text) call nothing here.
 *
 * Precedence for the allocator keys: a separate variable (SYMPOOL_MAX_SPLIT_SIZE, ...) or an API
 * set wins over the same key inside SYMPOOL_ALLOC_CONF (when that is unset, PyTorch's own variable
 * in PyTorch's order: PYTORCH_ALLOC_CONF, else the older PYTORCH_CUDA_ALLOC_CONF), which wins over
 * the default. The winner is
 * kept with its source (typed, no text round trip), so sp__alloc_conf_get() and `SYMPOOL_INFO=1`
 * agree. A SYMPOOL_ALLOC_CONF with some bad entries keeps its good ones and warns once per bad one
 * (PyTorch rejects only what it cannot parse); sp__option_set is strict and changes nothing.
 *
 * Warnings: a malformed value warns once (per variable and value) and keeps the default; an
 * unknown SYMPOOL_* name warns once per appearance. Both are emitted after the log settings of
 * the same load are in force, so SYMPOOL_DEBUG=NONE silences them.
 *
 * Locks: first_mu serializes first loads (other threads wait for the table to be complete);
 * opts_lock guards the values and the warn-once records. Readers take it too (values are read at
 * init, not per allocation), except sp__option_double: every collective call reads its deadline
 * (SYMPOOL_SYM_TIMEOUT), so the double values are also published, at the end of every change, in
 * opts_d, which it reads with relaxed atomics. sp__option_string() returns a pointer into the
 * table: stable storage, but a concurrent reload/set may rewrite it (tests only).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/options.h"
#include "sympool/version.h"

extern char **environ;

/* Variables that start with SYMPOOL_ but are read by sympool's other parts, not this library: the
 * Python package (LIBRARY, CACHE_DIR), the packaging (CMAKE_BUILD_DIR) and the scripts and test
 * suites (scripts/test.sh, scripts/gpu-check.sh). A user who sets one of them for those parts must
 * not get a warning from every process, nor fail a test suite that rejects unexpected warnings. */
static const char *const allowed_names[] = {"SYMPOOL_LIBRARY",
                                            "SYMPOOL_CACHE_DIR",
                                            "SYMPOOL_CMAKE_BUILD_DIR",
                                            "SYMPOOL_CMAKE_ARGS",
                                            "SYMPOOL_TEST_DEVICE",
                                            "SYMPOOL_TEST_NP",
                                            "SYMPOOL_FUZZ_SECONDS",
                                            "SYMPOOL_GPU_CHECK_BUILD",
                                            "SYMPOOL_GPU_CHECK_CMAKE_ARGS",
                                            "SYMPOOL_GPU_CHECK_DEADLINE",
                                            "SYMPOOL_GPU_CHECK_NO_GPU",
                                            "SYMPOOL_DEPS_ROOT",
                                            "SYMPOOL_NCCL_ROOT"};

typedef struct {
    opt_value_t v;                 /* the value in force */
    sp_option_source_t src;        /* where it came from */
    char warned_bad[OPT_TEXT_MAX]; /* the malformed env text already warned about, "" = none */
    bool has_warned_bad;           /* warned_bad is meaningful (the bad text may be "") */
} opt_state_t;

#define UNKNOWN_MAX 32
static pthread_mutex_t first_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int opts_read; /* 1 while the table holds this run's reading (release/acquire) */
static _Thread_local bool opts_loading; /* this thread is inside a load: don't recurse */
static pthread_mutex_t opts_lock = PTHREAD_MUTEX_INITIALIZER;
static opt_state_t opts[SP_OPT_COUNT];       /* (opts_lock) */
static sp_alloc_conf_t conf_resolved;        /* the allocator settings in force (opts_lock) */
static opt_notes_t conf_notes;               /* what the last ALLOC_CONF parse said (opts_lock) */
static char unknown_warned[UNKNOWN_MAX][64]; /* unknown names warned at the last load (opts_lock) */
static int n_unknown_warned;                 /* (opts_lock) */
static double opts_d[SP_OPT_COUNT]; /* opts[o].v.d as of the last change (written under opts_lock,
                                       read without it; relaxed atomics) */

/* ---- errors and the log gate ------------------------------------------------------------ */

bool sp__log_wanted(sp_log_level_t level, unsigned subsys) {
    sp__options_ensure();
    int in_force = __atomic_load_n(&sp__log_level, __ATOMIC_RELAXED);
    /* Still unread once the options were read: an sp_shutdown on another thread has marked them
     * unread since (sp__options_forget), for the next line to read them again. The mark is no
     * level (it is above all of them): this line keeps the level last set, which is in force
     * until that reading. Not reading them here: a line may be logged under opts_lock
     * (sp__option_set), which a reading takes. Lines of the load itself keep the mark. */
    if (in_force == SP_LOG_UNREAD && !opts_loading)
        in_force = __atomic_load_n(&sp__log_level_configured, __ATOMIC_RELAXED);
    return in_force >= (int)level &&
           (__atomic_load_n(&sp__log_mask, __ATOMIC_RELAXED) & subsys) != 0;
}

static _Thread_local bool errors_quiet; /* sp__errors_quiet: this thread's WARNs are INFOs */

void sp__errors_quiet(bool on) {
    errors_quiet = on;
}

static sp_status_t error_v(sp_log_level_t level, sp_status_t status, unsigned subsys,
                           const char *file, int line, const char *fmt, va_list ap) {
    sp__error_vset(fmt, ap);
    if (errors_quiet && level == SP_LOG_WARN)
        level = SP_LOG_INFO;
    if (SP_LOG_ENABLED(level, subsys))
        sp__log_at(level, subsys, file, line, "%s (%s)", sp_last_error(), sp_status_name(status));
    return status;
}

sp_status_t sp__error_at(sp_status_t status, unsigned subsys, const char *file, int line,
                         const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    sp_status_t s = error_v(SP_LOG_WARN, status, subsys, file, line, fmt, ap);
    va_end(ap);
    return s;
}

sp_status_t sp__error_quiet_at(sp_status_t status, unsigned subsys, const char *file, int line,
                               const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    sp_status_t s = error_v(SP_LOG_INFO, status, subsys, file, line, fmt, ap);
    va_end(ap);
    return s;
}

/* ---- resolving ---------------------------------------------------------------------------- */

static void set_default_locked(sp_option_t o) {
    char why[256];
    /* The defaults are checked by the unit tests (every option starts from its default). */
    (void)sp__opt_parse(o, sp__opt_defs[o].def, false, NULL, &opts[o].v, why, sizeof why);
    opts[o].src = SP_OPT_SRC_DEFAULT;
}

/* One option that ALLOC_CONF's key sets, from the parsed (typed) ALLOC_CONF. */
static void take_conf_key_locked(sp_option_t o, const sp_alloc_conf_t *c, const char *roundup) {
    opt_value_t *v = &opts[o].v;
    switch (o) {
    case SP_OPT_MAX_SPLIT_SIZE:
        v->i = c->max_split_size == SIZE_MAX ? 0 : (int64_t)c->max_split_size;
        break;
    case SP_OPT_MAX_NON_SPLIT_ROUNDING:
        v->i = (int64_t)c->max_non_split_rounding;
        break;
    case SP_OPT_LARGE_SEGMENT_SIZE:
        v->i = (int64_t)c->large_segment_size;
        break;
    case SP_OPT_GC_THRESHOLD:
        v->d = c->gc_threshold;
        break;
    case SP_OPT_EXPANDABLE_SEGMENTS:
        v->i = c->expandable_segments;
        break;
    case SP_OPT_ROUNDUP_POWER2_DIVISIONS:
        memcpy(v->conf.roundup_divisions, c->roundup_divisions, sizeof c->roundup_divisions);
        break;
    default:
        return;
    }
    /* The text is for display (sp__option_string, the printer) only; nothing parses it again. */
    if (o == SP_OPT_ROUNDUP_POWER2_DIVISIONS)
        snprintf(v->s, sizeof v->s, "%s", roundup);
    else
        sp__opt_format(o, v, v->s, sizeof v->s);
    opts[o].src = SP_OPT_SRC_CONF;
}

/* Give every option still at its default (or from an earlier ALLOC_CONF) the ALLOC_CONF key's
 * value, then build the typed allocator settings from the winners. */
static void resolve_locked(void) {
    const opt_value_t *ac = &opts[SP_OPT_ALLOC_CONF].v;
    for (int o = 0; o < SP_OPT_COUNT; o++) {
        unsigned key = sp__opt_defs[o].conf_key;
        if (key == 0)
            continue;
        if (opts[o].src == SP_OPT_SRC_CONF)
            set_default_locked((sp_option_t)o);
        if ((ac->conf_keys & key) && opts[o].src == SP_OPT_SRC_DEFAULT)
            take_conf_key_locked((sp_option_t)o, &ac->conf, ac->roundup);
    }
    sp_alloc_conf_t c;
    sp__alloc_conf_defaults(&c);
    int64_t mss = opts[SP_OPT_MAX_SPLIT_SIZE].v.i;
    c.max_split_size = mss == 0 ? SIZE_MAX : (size_t)mss;
    c.max_non_split_rounding = (size_t)opts[SP_OPT_MAX_NON_SPLIT_ROUNDING].v.i;
    c.large_segment_size = (size_t)opts[SP_OPT_LARGE_SEGMENT_SIZE].v.i;
    c.gc_threshold = opts[SP_OPT_GC_THRESHOLD].v.d;
    c.expandable_segments = opts[SP_OPT_EXPANDABLE_SEGMENTS].v.i != 0;
    c.no_caching = opts[SP_OPT_NO_CACHING].v.i != 0;
    memcpy(c.roundup_divisions, opts[SP_OPT_ROUNDUP_POWER2_DIVISIONS].v.conf.roundup_divisions,
           sizeof c.roundup_divisions);
    /* No SYMPOOL_* variable of its own: only the ALLOC_CONF key sets it. */
    c.memory_fraction =
        (ac->conf_keys & SP_CONF_KEY_MEMORY_FRACTION) ? ac->conf.memory_fraction : 1.0;
    snprintf(c.conf_text, sizeof c.conf_text, "%s", ac->s);
    /* The CUDA-only keys (no SYMPOOL_* variables): reported in snapshots, nothing else. */
    c.pinned_num_register_threads = ac->conf.pinned_num_register_threads;
    c.release_lock_on_cudamalloc = ac->conf.release_lock_on_cudamalloc;
    c.pinned_use_cuda_host_register = ac->conf.pinned_use_cuda_host_register;
    c.graph_capture_record_stream_reuse = ac->conf.graph_capture_record_stream_reuse;
    conf_resolved = c;
    for (int o = 0; o < SP_OPT_COUNT; o++) /* every change ends here: publish the doubles */
        __atomic_store(&opts_d[o], &opts[o].v.d, __ATOMIC_RELAXED);
}

static void configure_log_locked(void) {
    sp__log_configure((int)opts[SP_OPT_DEBUG].v.i, (unsigned)opts[SP_OPT_DEBUG_SUBSYS].v.i,
                      opts[SP_OPT_DEBUG_FILE].v.s);
}

/* ---- loading ------------------------------------------------------------------------------ */

static bool is_known_name(const char *name, size_t len) {
    for (int o = 0; o < SP_OPT_COUNT; o++)
        if (strlen(sp__opt_defs[o].name) == len && strncmp(sp__opt_defs[o].name, name, len) == 0)
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
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", o ? ", " : "",
                                  sp__opt_defs[o].name);
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

/* Where the ALLOC_CONF text comes from when SYMPOOL_ALLOC_CONF is unset: PyTorch's variable, read
 * in PyTorch's order (PYTORCH_ALLOC_CONF; the older PYTORCH_CUDA_ALLOC_CONF only without it). NULL
 * and *src_p untouched when neither is set. */
static const char *pytorch_conf(sp_option_source_t *src_p, const char **name_p) {
    const char *env = getenv("PYTORCH_ALLOC_CONF");
    if (env != NULL) {
        *src_p = SP_OPT_SRC_PYTORCH_ALLOC;
        *name_p = "PYTORCH_ALLOC_CONF";
        return env;
    }
    env = getenv("PYTORCH_CUDA_ALLOC_CONF");
    if (env != NULL) {
        *src_p = SP_OPT_SRC_PYTORCH;
        *name_p = "PYTORCH_CUDA_ALLOC_CONF";
    }
    return env;
}

/* The variable the ALLOC_CONF text came from, for messages. */
static const char *conf_var_locked(void) {
    sp_option_source_t src = opts[SP_OPT_ALLOC_CONF].src;
    return src == SP_OPT_SRC_PYTORCH || src == SP_OPT_SRC_PYTORCH_ALLOC
               ? sp__option_source_name(src)
               : "SYMPOOL_ALLOC_CONF";
}

/* What the ALLOC_CONF parse said: the skipped entries at WARN (once per text: warn_bad), the
 * ignored CUDA-only keys at INFO. */
static void log_conf_notes_locked(bool warn_bad) {
    for (int k = 0; k < conf_notes.n; k++) {
        if (!conf_notes.bad[k])
            SP_INFO(SP_SUB_ENV, "%s", conf_notes.text[k]);
        else if (warn_bad)
            SP_WARN(SP_SUB_ENV,
                    "%s='%s' is malformed in part (%s): that entry is ignored, the others apply",
                    conf_var_locked(), opts[SP_OPT_ALLOC_CONF].warned_bad, conf_notes.text[k]);
    }
    conf_notes.n = 0;
}

/* Read every variable from the environment; keep_api: values set through sp__option_set stay. */
static void load_locked(bool keep_api) {
    bool bad[SP_OPT_COUNT] = {false};
    bool conf_warn = false; /* ALLOC_CONF kept its good entries; its bad ones are new */
    char why[SP_OPT_COUNT][256];
    const char *conf_name = sp__opt_defs[SP_OPT_ALLOC_CONF].name; /* where its text came from */
    conf_notes.n = 0;
    for (int o = 0; o < SP_OPT_COUNT; o++) {
        if (keep_api && opts[o].src == SP_OPT_SRC_API)
            continue;
        const char *env = getenv(sp__opt_defs[o].name);
        sp_option_source_t src = SP_OPT_SRC_ENV;
        /* A PyTorch job already states its allocator settings in PyTorch's variable; taking
         * them when sympool's own is unset keeps one place to set them. */
        if (env == NULL && o == SP_OPT_ALLOC_CONF)
            env = pytorch_conf(&src, &conf_name);
        set_default_locked((sp_option_t)o);
        if (env == NULL) {
            opts[o].has_warned_bad = false;
            continue;
        }
        opt_value_t v;
        opt_notes_t *notes = o == SP_OPT_ALLOC_CONF ? &conf_notes : NULL;
        bool same = opts[o].has_warned_bad && strcmp(opts[o].warned_bad, env) == 0;
        if (sp__opt_parse((sp_option_t)o, env, true, notes, &v, why[o], sizeof why[o])) {
            opts[o].v = v;
            opts[o].src = src;
            bool partly_bad = false;
            for (int k = 0; notes != NULL && k < notes->n; k++)
                partly_bad = partly_bad || notes->bad[k];
            conf_warn = conf_warn || (partly_bad && !same);
            opts[o].has_warned_bad = partly_bad;
            if (partly_bad)
                snprintf(opts[o].warned_bad, sizeof opts[o].warned_bad, "%s", env);
        } else if (!same) {
            bad[o] = true;
            snprintf(opts[o].warned_bad, sizeof opts[o].warned_bad, "%s", env);
            opts[o].has_warned_bad = true;
        }
    }
    configure_log_locked(); /* before the warnings, so SYMPOOL_DEBUG of this load decides */
    resolve_locked();
    for (int o = 0; o < SP_OPT_COUNT; o++)
        if (bad[o]) {
            bool range = strncmp(why[o], SP_OPT_OUT_OF_RANGE, strlen(SP_OPT_OUT_OF_RANGE)) == 0;
            SP_WARN(SP_SUB_ENV, "%s='%s' is %s (%s): using the default '%s'",
                    o == SP_OPT_ALLOC_CONF ? conf_name : sp__opt_defs[o].name, opts[o].warned_bad,
                    range ? "out of range" : "malformed",
                    range ? why[o] + strlen(SP_OPT_OUT_OF_RANGE) : why[o], sp__opt_defs[o].def);
        }
    log_conf_notes_locked(conf_warn);
    warn_unknown_locked();
}

/* The version line and the SYMPOOL_INFO table come with the process's first reading only, not
 * again after each sp_shutdown. */
static void first_load(void) {
    static bool said; /* (first_mu) */
    opts_loading = true;
    pthread_mutex_lock(&opts_lock);
    load_locked(true);
    bool info = opts[SP_OPT_INFO].v.i != 0 && !said;
    int level = said ? SP_LOG_NONE : (int)opts[SP_OPT_DEBUG].v.i;
    said = true;
    pthread_mutex_unlock(&opts_lock);
    if (level == SP_LOG_VERSION || level >= SP_LOG_INFO)
        sp__log_at(SP_LOG_VERSION, SP_SUB_INIT, __FILE__, __LINE__, "sympool version %s",
                   sp_version());
    if (info)
        sp__options_print(stderr);
    opts_loading = false;
}

void sp__options_ensure(void) {
    if (SP_LIKELY(atomic_load_explicit(&opts_read, memory_order_acquire)) || opts_loading)
        return; /* read, or a line logged by the load itself while the table is being filled */
    pthread_mutex_lock(&first_mu);
    if (!atomic_load_explicit(&opts_read, memory_order_relaxed)) {
        first_load();
        atomic_store_explicit(&opts_read, 1, memory_order_release);
    }
    pthread_mutex_unlock(&first_mu);
}

void sp__options_forget(void) {
    pthread_mutex_lock(&first_mu);
    atomic_store_explicit(&opts_read, 0, memory_order_release);
    /* The next log line reads the options first (SYMPOOL_DEBUG may have changed). */
    __atomic_store_n(&sp__log_level, SP_LOG_UNREAD, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&first_mu);
}

void sp__options_reload(void) {
    sp__options_ensure();
    opts_loading = true;
    pthread_mutex_lock(&opts_lock);
    load_locked(false);
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
    double v;
    __atomic_load(&opts_d[opt], &v, __ATOMIC_RELAXED);
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
    return valid_opt(opt) ? sp__opt_defs[opt].name : "SYMPOOL_?";
}

void sp__alloc_conf_get(sp_alloc_conf_t *conf_p) {
    sp__options_ensure();
    pthread_mutex_lock(&opts_lock);
    *conf_p = conf_resolved;
    pthread_mutex_unlock(&opts_lock);
}

sp_status_t sp__option_set(sp_option_t opt, const char *value) {
    SP_ARG_CHECK(valid_opt(opt), SP_SUB_ENV, "option %d is not a valid sp_option_t", (int)opt);
    sp__options_ensure();
    opt_value_t v;
    opt_notes_t notes = {0};
    char why[256];
    if (value != NULL && !sp__opt_parse(opt, value, false, &notes, &v, why, sizeof why))
        return sp__error(
            SP_ERR_INVALID_ARGUMENT, SP_SUB_ENV, "%s='%s' is %s: %s", sp__opt_defs[opt].name, value,
            strncmp(why, SP_OPT_OUT_OF_RANGE, strlen(SP_OPT_OUT_OF_RANGE)) == 0 ? "out of range"
                                                                                : "malformed",
            strncmp(why, SP_OPT_OUT_OF_RANGE, strlen(SP_OPT_OUT_OF_RANGE)) == 0
                ? why + strlen(SP_OPT_OUT_OF_RANGE)
                : why);
    pthread_mutex_lock(&opts_lock);
    if (value == NULL) { /* back to the default */
        set_default_locked(opt);
    } else {
        opts[opt].v = v;
        opts[opt].src = SP_OPT_SRC_API;
    }
    conf_notes = notes;
    resolve_locked();
    configure_log_locked();
    log_conf_notes_locked(false);
    pthread_mutex_unlock(&opts_lock);
    return SP_SUCCESS;
}

/* ---- the strict ALLOC_CONF parse (tests, tools) ------------------------------------------ */

static void log_ignored(void *arg, bool bad, sp_status_t status, const char *why) {
    (void)arg, (void)status;
    if (!bad)
        SP_INFO(SP_SUB_ENV, "%s", why);
}

sp_status_t sp__alloc_conf_parse(const char *text, sp_alloc_conf_t *conf) {
    char why[512];
    unsigned keys;
    sp_status_t s = sp__alloc_conf_parse_ex(text, conf, &keys, NULL, 0, false, log_ignored, NULL,
                                            why, sizeof why);
    if (s != SP_SUCCESS)
        return sp__error(s, SP_SUB_ENV, "ALLOC_CONF '%s': %s", text ? text : "(null)", why);
    return SP_SUCCESS;
}

/* ---- printing ----------------------------------------------------------------------------- */

const char *sp__option_source_name(sp_option_source_t s) {
    switch (s) {
    case SP_OPT_SRC_ENV:
        return "env";
    case SP_OPT_SRC_CONF:
        return "ALLOC_CONF";
    case SP_OPT_SRC_API:
        return "api";
    case SP_OPT_SRC_PYTORCH:
        return "PYTORCH_CUDA_ALLOC_CONF";
    case SP_OPT_SRC_PYTORCH_ALLOC:
        return "PYTORCH_ALLOC_CONF";
    default:
        return "default";
    }
}

void sp__option_values(sp_option_t o, opt_value_t *cur, opt_value_t *def, sp_option_source_t *src) {
    char why[256];
    if (!sp__opt_parse(o, sp__opt_defs[o].def, false, NULL, def, why, sizeof why))
        memset(def, 0, sizeof *def);
    sp__options_ensure();
    pthread_mutex_lock(&opts_lock);
    *cur = opts[o].v;
    *src = opts[o].src;
    pthread_mutex_unlock(&opts_lock);
}

void sp__options_print(void *file) {
    FILE *f = file ? (FILE *)file : stderr;
    fprintf(f, "sympool options (value, default, source):\n");
    for (int o = 0; o < SP_OPT_COUNT; o++) {
        char val[OPT_TEXT_MAX + 8], def[OPT_TEXT_MAX + 8];
        opt_value_t cv, dv;
        sp_option_source_t src;
        sp__option_values((sp_option_t)o, &cv, &dv, &src);
        sp__opt_format((sp_option_t)o, &cv, val, sizeof val);
        sp__opt_format((sp_option_t)o, &dv, def, sizeof def);
        fprintf(f, "  %-34s %-16s default %-10s [%s]  %s\n", sp__opt_defs[o].name, val, def,
                sp__option_source_name(src), sp__opt_defs[o].desc);
    }
}

/* fork() (pool/fork.c): first_mu, then opts_lock, the order a first load takes them. */
void sp__options_fork_lock(void) {
    pthread_mutex_lock(&first_mu);
    pthread_mutex_lock(&opts_lock);
}

void sp__options_fork_unlock(void) {
    pthread_mutex_unlock(&opts_lock);
    pthread_mutex_unlock(&first_mu);
}
