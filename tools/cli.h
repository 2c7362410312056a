/*
 * cli.h: the `sympool` command's subcommands (one file each) and the replay engine that tests
 * drive directly. Everything here runs in the CLI process only; the library is used through its
 * public API.
 */
#ifndef SP_TOOLS_CLI_H
#define SP_TOOLS_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <getopt.h>

#include "sympool/experimental.h"
#include "tools/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The subcommands: argv[0] is the command's name; each parses its options with getopt_long
 * (--opt=value and --opt value, -h/--help) and returns the process exit status: 0 done,
 * 1 failed, 2 usage error (refused before doing anything). */
int sp_cli_info(int argc, char **argv);
int sp_cli_replay(int argc, char **argv);
int sp_cli_plot(int argc, char **argv);
int sp_cli_summary(int argc, char **argv);

/* `sympool info [--json] TRACE` (trace_info.c): what a snapshot holds, as text or as one JSON
 * object. Returns the exit status. */
int cli_trace_info(const char *path, bool json);

/* ---- shared by the subcommands (cli_util.c) ---------------------------------------------- */

/* getopt_long for subcommand cmd with our own messages: an unknown option or a missing value
 * prints "sympool CMD: ..." and returns '?'. Resets getopt's state on the first call for argv
 * (optind == 0). */
int cli_getopt(int argc, char **argv, const char *cmd, const char *shortopts,
               const struct option *longopts);
/* An option that takes a value, met with value: false (after saying so) when it was given
 * before (*seen set), else remembers value in *seen. A second value is refused rather than
 * taken over the first: which one was meant cannot be told (two outputs, one written). */
bool cli_once(const char *cmd, const char *opt, const char **seen, const char *value);
/* Whether the command can write its output (option opt) at path: its folder exists, and what is
 * at path, if anything, is a regular file. Else false after saying why (the command then exits 1,
 * as when the write itself fails): checked before any input is read, so that a typo in the
 * folder does not cost the whole run first. */
bool cli_output_ok(const char *cmd, const char *opt, const char *path);
/* The file an output option's OUT names: %h, %p, %r and %% expanded as sp_dump_snapshot expands
 * a snapshot's path (include/sympool/history.h), a %r with the rank unknown (no launcher) as 0.
 * Every file the command writes (replay --snapshot, plot -o) is named so. Into out (cap bytes);
 * false when OUT cannot be expanded whole (too long): out then holds OUT, perhaps cut, for a
 * message only, never a name to write. */
bool cli_output_path(const char *pattern, char *out, size_t cap);
/* A whole decimal integer in [lo, hi]. */
bool cli_parse_long(const char *s, long lo, long hi, long *out);
/* True when a and b name one file: the same existing file (through any link or other name of
 * it), or, neither existing, the same name in the same folder (the file both would create). */
bool cli_same_target(const char *a, const char *b);
/* Whether output option opt's file (already expanded: cli_output_path) is not where
 * SYMPOOL_DEBUG_FILE, expanded, sends the library's log lines: else false after saying so (the
 * lines would be appended to the written file); nor, with %r while the rank is not known, the
 * file of any rank (sp_x_path_names), which the library's writers refuse. */
bool cli_output_not_log(const char *cmd, const char *opt, const char *file);
/* The lines a command's log filter (sp_x_log_set_fn) passes go where the library's own would:
 * to the file SYMPOOL_DEBUG_FILE names (its value in force: the environment's, or a replay
 * --compare configuration's item; %h, %p expanded; appended to; a regular file), else stderr.
 * They all went to stderr. cli_log_open before a filter is set and after the option changes
 * (a filter may make no sympool call); cli_log_line writes one line. */
void cli_log_open(void);
void cli_log_line(const char *line);
/* The file an input word names: "-" is standard input (as a pipe or a redirection gives it; the
 * readers take a stream), anything else the path itself. */
const char *cli_input(const char *word);
/* True when path ends with suffix, e.g. ".json" (case-sensitive, as sp_dump_snapshot decides). */
bool cli_has_suffix(const char *path, const char *suffix);
/* The option named `name` (a SYMPOOL_* variable) as the library has it in force, into *oi;
 * false when there is none of that name. */
bool cli_option(const char *name, sp_x_option_info_t *oi);
/* True when out names a file that exists and is the file in names (through any link or other
 * name of it): writing out would replace the input the command reads. */
bool cli_same_file(const char *in, const char *out);

/* Before loading the trace at path: the heap made ready for what loading and replaying it will
 * allocate (fewer, cheaper page faults). A hint; does nothing for small or unreadable files. */
void cli_heap_prepare(const char *path);

/* Remove the atomic writer's temporary file when the command is killed (SIGINT, SIGTERM,
 * SIGHUP, ...), then die by the same signal (cli_temp.c). Called once, first thing in main. */
void cli_temp_cleanup_install(void);

/* ---- the JSON writer of --json outputs (cli_json.c) --------------------------------------- */

#define CLI_JSON_DEPTH 16 /* deeper documents reuse the counts (the CLI writes 4 levels) */
typedef struct cli_json {
    FILE *f;
    int depth;                    /* containers open */
    size_t count[CLI_JSON_DEPTH]; /* items written in each */
} cli_json_t;

void cj_init(cli_json_t *j, FILE *f);
/* s (NULL: "") as one JSON string, quotes included, escaped as the writer does; for one-line
 * records written without the writer (replay's --json lines). */
void cj_write_string(FILE *f, const char *s);
/* key: the member's name inside an object; NULL inside an array and for the document itself. */
void cj_object(cli_json_t *j, const char *key);
void cj_array(cli_json_t *j, const char *key);
void cj_end(cli_json_t *j, char close); /* '}' or ']'; the document's last ends the line */
void cj_str(cli_json_t *j, const char *key, const char *v); /* NULL writes "" */
void cj_int(cli_json_t *j, const char *key, int64_t v);
void cj_uint(cli_json_t *j, const char *key, uint64_t v);
void cj_num(cli_json_t *j, const char *key, double v); /* NaN/infinity: null */
void cj_bool(cli_json_t *j, const char *key, bool v);
void cj_null(cli_json_t *j, const char *key);

/* What one replay measured. Bytes are summed over devices (each device's own peak). */
typedef struct replay_result {
    size_t trace_entries;            /* entries in every device trace */
    size_t events;                   /* allocator calls made: allocs + frees replayed */
    size_t allocs, frees;            /* of which */
    size_t seeded_blocks;            /* live blocks at the start outside the start segments */
    uint64_t seeded_bytes;           /* their requested bytes */
    size_t ooms;                     /* our allocations that failed with OUT_OF_MEMORY */
    size_t skipped_frees;            /* frees of blocks we never got (OOM'ed) */
    size_t recorded_ooms;            /* oom events in the recorded trace */
    int64_t peak_requested;          /* ours: requested_bytes.all.peak */
    int64_t peak_allocated;          /* ours: allocated_bytes.all.peak */
    int64_t peak_active;             /* ours: active_bytes.all.peak (allocated, or freed and
                                      * pending until other streams' work completes) */
    int64_t page_floor;              /* each device's peak active rounded up to 2 MiB pages,
                                      * summed: what no allocator on 2 MiB pages reserves less
                                      * than at its peak */
    int64_t peak_reserved;           /* ours: reserved_bytes.all.peak */
    int64_t end_reserved;            /* ours after the last event: reserved_bytes.all.current */
    int64_t end_allocated;           /* ours: allocated_bytes.all.current */
    int64_t end_inactive_split;      /* ours: inactive_split_bytes.all.current (fragmentation) */
    uint64_t pytorch_end_allocated;  /* the recorded run's allocated blocks at the end */
    uint64_t pytorch_peak_reserved;  /* PyTorch's, reconstructed from the trace */
    uint64_t pytorch_final_reserved; /* sum of the final segments */
    uint64_t trace_peak_requested;   /* seeds + allocs - frees, over the trace */
    int64_t device_allocs;           /* ours: num_device_alloc (segments and page maps) */
    int64_t device_frees;            /* ours: num_device_free (segment frees and unmaps) */
    sp_x_vmm_counters_t vmm;         /* ours: pages mapped/unmapped (sp_x_vmm_counters) */
    size_t start_segments;           /* segments rebuilt as they were before the trace */
    uint64_t start_bytes;            /* their bytes */
    size_t start_blocks;             /* their live blocks */
    size_t start_pending;            /* starting blocks freed and pending other streams' work */
    bool start_requested;            /* the segment kind differs from the recorded run's (or
                                      * start_rules_differ): every live starting block requested
                                      * instead (no segments) */
    bool start_rules_differ;         /* both expandable, the recorded run's by PyTorch's rules,
                                      * --conf's by ours (replay_set_user_conf) */
    uint64_t pytorch_start_reserved; /* PyTorch's reserved before the first event */
    int64_t start_reserved;          /* ours once the starting state is built: the peak's floor */
    size_t empty_caches;             /* the user's empty_cache calls replayed */
    size_t gc_runs;                  /* runs of segment frees left to the next malloc's garbage
                                      * collection (TR_F_MAYBE_GC, collects_next) */
    size_t deferred_frees;           /* frees held back for other streams, replayed */
    double ns_per_event;             /* wall time of the event loop / events */
    int devices;                     /* devices replayed */
} replay_result_t;

/* The most devices a replay emulates, one per recorded device: SYMPOOL_HOST_DEVICES' range
 * (core/options.c, check_devices). */
#define REPLAY_MAX_DEVICES 64

/* Replay t on the current sympool (already configured: host backend, options). The seeds are
 * allocated first, then every event in order. When snapshot_out is set, history is recorded and
 * a snapshot of the replay written there before the blocks are freed. Every block is freed at
 * the end. Returns false with a reason (sympool failures other than OOM). */
bool replay_trace(const tr_trace_t *t, const char *snapshot_out, replay_result_t *r, char *err,
                  size_t errlen);

/* Whether the settings replayed are the user's (--conf) rather than the snapshot's own. With
 * them, a recording made with expandable segments (PyTorch's rules) replayed under expandable
 * segments with any of our rules on (SYMPOOL_EXPANDABLE_PAGE, _RECYCLE or _BORROW not 0) starts
 * from its live blocks requested, as a change of segment kind does: the recorded mapped pages
 * are what PyTorch's rules kept (20 MiB units, freed pages mapped until an OOM or empty_cache),
 * not what the configuration asked about would hold. Without --conf the replay re-enacts the
 * recorded run and keeps them. Default false. */
void replay_set_user_conf(bool given);
/* Expandable segments by the recording's rules (sp_x_option_set): sympool's own snapshots
 * record theirs (tr_settings_t.rules: each set unless the environment sets it); else PyTorch's,
 * SYMPOOL_EXPANDABLE_PAGE, _RECYCLE and _BORROW at 0, as a recording made with them re-enacts
 * them; false (the last error says why) when the library refuses. */
bool replay_recorded_rules(const tr_trace_t *t);
/* Without --capacity and SYMPOOL_HOST_CAPACITY, the emulated device holds twice what the recorded
 * run reserved at its peak on its largest device, when that is more than the option's default
 * (80 GiB): an H200's or B200's trace replayed on 80 GiB ran out of memory at once, and its peaks
 * came out as nothing. At most 64 TiB. After the trace is loaded, before init. false with
 * sp_last_error() when the option cannot be set. */
bool replay_fit_capacity(const tr_trace_t *t);

#ifdef __cplusplus
}
#endif

#endif /* SP_TOOLS_CLI_H */
