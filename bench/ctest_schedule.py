#!/usr/bin/env python3
"""How long a ctest -jN run of a build folder takes when ctest orders it as on a fresh folder
(CI's: no CTestCostData.txt yet), from the durations a previous run recorded.

    bench/ctest_schedule.py BUILD_DIR [--cost-data FILE] [--jobs 2] [--names FILE]
                            [--exclude REGEX] [--tail 8]

Ordering is CTest's for a first run: COST descending, ties in registration order (the GoogleTest
include files first, where CTestTestfile.cmake includes them, then add_test); a free slot takes
the first waiting test whose RESOURCE_LOCKs are free. Durations: CTestCostData.txt of a run
(BUILD_DIR's own by default; its per-test average), a test missing there counts 0.05 s. --names
limits the run to the tests named in FILE (one a line, e.g. `ctest -N -L unit` output's names);
by default, every test that has a duration. The cuda_double stage's GoogleTest runs are
registered by a script at test time (tests/cmake/cuda_double.cmake) and are not read here. Prints the test-seconds, their ideal split over the
slots, the simulated wall and the time the last test ran alone (the tail), as one JSON line.
It models slots, not CPU: a test that waits (a deadline, a late rank) holds its slot all the same.
"""
import argparse
import json
import os
import re

ADD = re.compile(r'^\s*add_test\(\s*\[=\[(.*?)\]=\]', re.M)
PROPS = re.compile(r'^\s*set_tests_properties\(\s*\[=\[(.*?)\]=\]\s+PROPERTIES(.*)$', re.M)


def read_costs(path):
    """name -> seconds from CTestCostData.txt (lines: name runs average)."""
    out = {}
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) == 3 and p[0] != '---':
                out[p[0]] = float(p[2])
    return out


def registered(build):
    """(names in registration order, COST by name, RESOURCE_LOCK list by name)."""
    names, cost, locks = [], {}, {}

    def props(text):
        for name, rest in PROPS.findall(text):
            m = re.search(r'\bCOST "([0-9.]+)"', rest)
            if m:
                cost[name] = float(m.group(1))
            m = re.search(r'\bRESOURCE_LOCK "([^"]*)"', rest)
            if m:
                locks[name] = m.group(1).split(';')

    def walk(testfile):
        if not os.path.exists(testfile):
            return
        text = open(testfile).read()
        for m in re.finditer(r'^(include|add_test|subdirs)\((.*)$', text, re.M):
            kind, rest = m.groups()
            if kind == 'include':
                # A GoogleTest include file: its tests are in the list beside it.
                inc = rest.strip('")').replace('_include.cmake', '_tests.cmake')
                walk(inc)
            elif kind == 'add_test':
                names.append(ADD.match(m.group(0)).group(1))
            else:
                sub = rest.strip('")')
                if not os.path.isabs(sub):
                    sub = os.path.join(os.path.dirname(testfile), sub)
                walk(os.path.join(sub, 'CTestTestfile.cmake'))
        props(text)

    walk(os.path.join(build, 'CTestTestfile.cmake'))
    return names, cost, locks


def simulate(order, dur, locks, jobs):
    """Greedy list scheduling; returns (wall, [(end, name)])."""
    waiting, running, held, now, ends = list(order), [], set(), 0.0, []
    while waiting or running:
        while len(running) < jobs:
            pick = next((i for i, n in enumerate(waiting)
                         if not any(lk in held for lk in locks.get(n, []))), None)
            if pick is None:
                break
            n = waiting.pop(pick)
            running.append((now + dur.get(n, 0.05), n))
            held.update(locks.get(n, []))
        running.sort()
        now, n = running.pop(0)
        held.difference_update(locks.get(n, []))
        ends.append((now, n))
    return now, ends


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('build')
    ap.add_argument('--cost-data')
    ap.add_argument('--jobs', type=int, default=2)
    ap.add_argument('--names')
    ap.add_argument('--exclude', help='leave out the tests this regular expression finds')
    ap.add_argument('--tail', type=int, default=0, help='print the last N tests to end')
    a = ap.parse_args()
    dur = read_costs(a.cost_data or os.path.join(a.build, 'Testing/Temporary/CTestCostData.txt'))
    names, cost, locks = registered(a.build)
    keep = set(open(a.names).read().split()) if a.names else set(dur)
    names = [n for n in names if n in keep and not (a.exclude and re.search(a.exclude, n))]
    order = sorted(names, key=lambda n: -cost.get(n, 0.0))  # stable: ties keep registration
    wall, ends = simulate(order, dur, locks, a.jobs)
    total = sum(dur.get(n, 0.05) for n in names)
    alone = wall - (ends[-2][0] if len(ends) > 1 else 0.0)
    print(json.dumps({'build': a.build, 'tests': len(names), 'test_seconds': round(total, 1),
                      'ideal_s': round(total / a.jobs, 1), 'simulated_wall_s': round(wall, 1),
                      'last_test_alone_s': round(alone, 1)}))
    for end, n in ends[-a.tail:] if a.tail else []:
        print('  ends %7.1f  %-60s %6.1f s' % (end, n, dur.get(n, 0.05)))


if __name__ == '__main__':
    main()
