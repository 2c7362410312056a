#!/usr/bin/env python3
"""bench/replay_loop_split.py: where the time of `sympool replay`'s event loop goes, by part.

The loop's own figure (replay --json's ns_per_event) says how long an event takes; this says
what takes it. For each trace:
  - time: PROCS processes of `BIN replay TRACE --repeat REPEAT --json` under `perf record -e
    cpu-clock --call-graph=dwarf` (a sample profile: hardware counters are not available in every
    VM, the cpu-clock timer is); only the samples with replay_device on their stack count (the
    loop; the start state, the slot plan and the final frees are left out). Each sample goes to
    the innermost frame that names a part (inlined frames included, so the free set's lookup
    inlined into malloc_fast counts as the free set), and to its innermost real function.
    Shares times the trace's median ns_per_event (RUNS runs of `--repeat 15`) give ns an event;
    "loop_split" lines per part, "loop_split_function" lines per real function;
  - counts (with --callgrind): callgrind inside replay_device with its branch model, per real
    function: instructions and conditional branches mispredicted an event
    ("loop_function_counts");
  - a fit over every (trace, function) with enough samples: ns an event ~ a x instructions + b x
    mispredicted branches ("loop_cost_model"): what an instruction and a mispredict cost here.
BIN should be a Release build with -g (the same code as Release: CMAKE_C_FLAGS_RELEASE="-O3
-DNDEBUG -g"), for perf to see inlined frames.
Usage: bench/replay_loop_split.py BIN TRACE... [--procs 6] [--repeat 64] [--runs 5] [--callgrind]
Prints JSON lines.
"""
import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

# The parts, by the function names (inlined ones included) that sit innermost on a sample's stack.
# Generic helpers (a ref to a pointer, a block's segment) name no part: the next frame out does.
GENERIC = {'sp__blk0', 'sp__blk', 'sp__ref_ptr', 'sp__bref', 'sp__bref0', 'sp__block_stream',
           'sp__bseg', 'sp__seg', 'sp__ptr_ref'}
PARTS = [
    ('free_set', {'link_node', 'unlink_node', 'grew', 'shrank', 'fix_left', 'fix_right',
                  'rot_left', 'rot_right', 'relink', 'less_in', 'set_left', 'set_right',
                  'set_parent', 'L', 'R', 'P', 'sp__bset_insert', 'sp__bset_remove',
                  'sp__bset_move', 'sp__bset_find_fit', 'sp__bset_below', 'sp__bset_pred',
                  'sp__bset_succ', 'sp__bset_one_stream', 'sp__bset_less', 'sp__bset_cmp',
                  'sp__bset_lower_bound'}),
    ('stats', {'sp__stat_inc1', 'sp__stat_dec1', 'sp__stat_t_inc', 'sp__stat_t_dec',
               'sp__add_mem', 'sp__sub_mem_neg', 'sp__stat_add', 'allocation_down'}),
    ('replay_loop_own', {'replay_device', 'do_alloc_op', 'do_free_op', 'request',
                         'do_free_completed'}),
    ('malloc_hit_path', {'malloc_fast', 'malloc_hit', 'malloc_hit_or_full', 'hit_lock',
                         'hit_is_plain', 'hit_unlock', 'sp_malloc', 'round_512'}),
    ('free_hit_path', {'free_fast', 'free_hit', 'free_is_plain', 'mergeable', 'free_is_alone',
                       'sp_free'}),
    ('malloc_split_handout', {'hand_out', 'spare_pop', 'slab_take', 'sp__block_link_before_ref',
                              'sp__block_link_before', 'sp__block_link_after', 'malloc_rest',
                              'hit_is_whole', 'hit_splits'}),
    ('free_merge_insert', {'free_rest', 'free_block', 'sp__alloc_free_held'}),
]


def part_of(names):
    for nm in names:
        if nm in GENERIC:
            continue
        for part, fns in PARTS:
            if nm in fns:
                return part
        if nm.startswith('sp__ptr_map'):
            return 'ptr_map'
        if nm.startswith('sp__gap') or nm in ('placed_lower', 'place_take', 'place_drop'):
            return 'gap_arrays'
        if (nm == 'do_empty_cache' or 'release' in nm or 'qsort' in nm or 'msort' in nm or
                nm == 'large_first'):
            return 'empty_cache_release'
        if ('segment' in nm or 'host' in nm or 'segidx' in nm or 'arena' in nm or
                'phash' in nm or nm in ('grow', 'grow_step', 'alloc_locked', 'place_for_op')):
            return 'segments_host_backend'
        return 'other'
    return 'other'


def perf_samples(text):
    """Each sample's frames (innermost first) as (name, inlined) pairs."""
    frames = []
    for line in text.splitlines():
        if not line.strip():
            if frames:
                yield frames
            frames = []
        elif line[0] in '\t ':
            f = line.split()
            if len(f) >= 2:
                frames.append((f[1].split('+')[0], '(inlined)' in line))
    if frames:
        yield frames


def ns_median(binary, trace, runs):
    vals = []
    for _ in range(runs):
        out = subprocess.run([binary, 'replay', trace, '--repeat', '15', '--json'],
                             capture_output=True, text=True).stdout
        m = re.search(r'"ns_per_event":([0-9.]+)', out)
        if m:
            vals.append(float(m.group(1)))
    return statistics.median(vals) if vals else None, vals


def events_of(binary, trace):
    out = subprocess.run([binary, 'replay', trace, '--json'], capture_output=True,
                         text=True).stdout
    return int(re.search(r'"events":([0-9]+)', out).group(1))


def callgrind_counts(binary, trace, events):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, 'cg.out')
        subprocess.run(['valgrind', '--tool=callgrind', '--toggle-collect=replay_device',
                        '--branch-sim=yes', '--callgrind-out-file=' + out, binary, 'replay', trace,
                        '--json'], capture_output=True)
        text = subprocess.run(['callgrind_annotate', '--show=Ir,Bcm', '--threshold=100', out],
                              capture_output=True, text=True).stdout
    # With -g a function's lines come per source file (its inlined code's file:function too):
    # summed by function.
    ir, bcm = collections.Counter(), collections.Counter()
    for line in text.splitlines():
        m = re.match(r'\s*([\d,]+) \([^)]*\)\s+([\d,]+|\.)\s*(?:\([^)]*\))?\s+\S*?:(\S+)', line)
        if m and 'PROGRAM TOTALS' not in line:
            ir[m.group(3)] += int(m.group(1).replace(',', ''))
            bcm[m.group(3)] += 0 if m.group(2) == '.' else int(m.group(2).replace(',', ''))
    return {f: (ir[f] / events, bcm[f] / events) for f in ir}


def fit(points):
    """Least squares y ~ a x1 + b x2 (no intercept) over (x1, x2, y)."""
    s11 = sum(p[0] * p[0] for p in points)
    s12 = sum(p[0] * p[1] for p in points)
    s22 = sum(p[1] * p[1] for p in points)
    t1 = sum(p[0] * p[2] for p in points)
    t2 = sum(p[1] * p[2] for p in points)
    det = s11 * s22 - s12 * s12
    return (t1 * s22 - t2 * s12) / det, (s11 * t2 - s12 * t1) / det


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('bin')
    ap.add_argument('traces', nargs='+')
    ap.add_argument('--procs', type=int, default=6)
    ap.add_argument('--repeat', type=int, default=64)
    ap.add_argument('--runs', type=int, default=5)
    ap.add_argument('--freq', type=int, default=15000)
    ap.add_argument('--callgrind', action='store_true')
    a = ap.parse_args()
    points = []
    for trace in a.traces:
        name = os.path.basename(trace)
        events = events_of(a.bin, trace)
        parts, funcs, n = collections.Counter(), collections.Counter(), 0
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(a.procs):
                data = os.path.join(tmp, 'p%d.data' % i)
                subprocess.run(['perf', 'record', '-q', '-e', 'cpu-clock', '-F', str(a.freq),
                                '--call-graph=dwarf,2048', '-o', data, '--', a.bin, 'replay',
                                trace, '--repeat', str(a.repeat), '--json'],
                               capture_output=True)
                text = subprocess.run(['perf', 'script', '-i', data], capture_output=True,
                                      text=True).stdout
                for frames in perf_samples(text):
                    names = [f[0] for f in frames]
                    if 'replay_device' not in names:
                        continue
                    n += 1
                    parts[part_of(names)] += 1
                    funcs[next((f[0] for f in frames if not f[1]), names[0])] += 1
        ns, vals = ns_median(a.bin, trace, a.runs)
        for part, c in parts.most_common():
            print(json.dumps({'bench': 'loop_split', 'trace': name, 'events': events,
                              'part': part, 'samples': c, 'loop_samples': n,
                              'share': round(c / n, 4),
                              'ns_per_event': round(ns * c / n, 2) if ns else None,
                              'loop_ns_per_event': ns, 'loop_ns_runs': vals}))
        counts = callgrind_counts(a.bin, trace, events) if a.callgrind else {}
        for fn, c in funcs.most_common():
            if c < 5:
                continue
            t = ns * c / n if ns else None
            line = {'bench': 'loop_split_function', 'trace': name, 'function': fn, 'samples': c,
                    'share': round(c / n, 4), 'ns_per_event': round(t, 2) if t else None}
            if fn in counts:
                line['ir_per_event'] = round(counts[fn][0], 1)
                line['bcm_per_event'] = round(counts[fn][1], 2)
                if c >= 20 and t:
                    points.append((counts[fn][0], counts[fn][1], t))
            print(json.dumps(line))
        sys.stdout.flush()
    if len(points) >= 3:
        ns_ir, ns_bcm = fit(points)
        err = [abs(p[2] - (ns_ir * p[0] + ns_bcm * p[1])) for p in points]
        print(json.dumps({'bench': 'loop_cost_model', 'points': len(points),
                          'ns_per_instruction': round(ns_ir, 4),
                          'ns_per_mispredict_modelled': round(ns_bcm, 2),
                          'median_abs_error_ns': round(statistics.median(err), 2)}))


if __name__ == '__main__':
    main()
