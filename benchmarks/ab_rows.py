#!/usr/bin/env python3
"""Compares benchmark binaries row by row: for each row, every binary runs it back to
back (in one order on even rounds, reversed on odd ones), so that the binaries meet the
same state of a shared, drifting machine; each row's figure is the median over the rounds
of each binary's rate divided by the first binary's rate in that round.

  python3 benchmarks/ab_rows.py --filter '^conveyor/trivial/' --rounds 12 \\
      base=old/bench_pipeline new=build/benchmarks/bench_pipeline control=copy/bench_pipeline

NAME=BINARY pairs: the first is the baseline. A second copy of the baseline under another
name is the control: its ratios show what identical binaries read on this machine (the
noise). Rows come from the first binary's --benchmark_list_tests; a row another binary
lacks is left out for it. Rates: items_per_second, the median of --repetitions runs per
process. --out DIR keeps every run as JSON lines (rows.jsonl) for a second look. Stopped
early (SIGTERM, as `timeout` sends, or Ctrl-C), it reports the rounds it finished.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from summarize import short  # a row's name without Google Benchmark's suffixes (beside this file)


def list_rows(binary, pattern):
    out = subprocess.run([binary, "--benchmark_list_tests", "--benchmark_filter=" + pattern],
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.split() if line]


def exact(row):
    """A --benchmark_filter that matches this row alone. Google Benchmark's regex takes
    no escape for '-' or '/' (Python's re.escape would add some)."""
    return "^" + re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", row) + "$"


def run_row(binary, row, repetitions, scratch):
    """The median items_per_second of one process running one row, or None."""
    path = os.path.join(scratch, "row.json")
    subprocess.run([binary, "--benchmark_filter=" + exact(row),
                    "--benchmark_repetitions=%d" % repetitions,
                    "--benchmark_out=" + path, "--benchmark_out_format=json"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with open(path) as f:
            runs = json.load(f)["benchmarks"]
    except (OSError, ValueError, KeyError):
        return None
    finally:
        if os.path.exists(path):
            os.remove(path)
    rates = [b["items_per_second"] for b in runs
             if b.get("run_type") == "iteration" and "items_per_second" in b
             and not b.get("error_occurred")]
    return statistics.median(rates) if rates else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binaries", nargs="+", metavar="NAME=BINARY")
    parser.add_argument("--filter", default=".", help="rows: a --benchmark_filter regex")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--repetitions", type=int, default=1, help="runs per process")
    parser.add_argument("--out", help="a folder for rows.jsonl (every run)")
    args = parser.parse_args()
    binaries = []
    for spec in args.binaries:
        name, sep, path = spec.partition("=")
        if not sep or not name or not os.access(path, os.X_OK):
            parser.error("%r: want NAME=BINARY, an executable" % spec)
        binaries.append((name, path))
    if len(binaries) < 2:
        parser.error("give two binaries or more: the baseline first")
    if len({name for name, _ in binaries}) != len(binaries):
        parser.error("give each binary a name of its own")

    rows = list_rows(binaries[0][1], args.filter)
    if not rows:
        parser.error("no row of %s matches %r" % (binaries[0][1], args.filter))
    log = None
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        log = open(os.path.join(args.out, "rows.jsonl"), "a")
    rates = {}  # (row, round, name) -> items/s, rounds finished only
    done = 0
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: report, then end
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for r in range(args.rounds):
                order = binaries if r % 2 == 0 else binaries[::-1]
                this_round = {}
                for row in rows:
                    for name, path in order:
                        rate = run_row(path, row, args.repetitions, scratch)
                        if rate is not None:
                            this_round[(row, r, name)] = rate
                        else:
                            print("no rate: %s in %s" % (row, name), file=sys.stderr)
                rates.update(this_round)
                done += 1
                if log:
                    for (row, _, name), rate in this_round.items():
                        log.write(json.dumps({"row": row, "round": r, "binary": name,
                                              "rate": rate, "utc": utc_now()}) + "\n")
                    log.flush()
                print("round %d of %d done, %s UTC" % (r + 1, args.rounds, utc_now()),
                      file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("stopped after %d of %d rounds" % (done, args.rounds), file=sys.stderr)
    if done:
        report(rows, [name for name, _ in binaries], rates, done)
    return 0 if done == args.rounds else 1


def utc_now():
    return time.strftime("%H:%M:%S", time.gmtime())


def report(rows, names, rates, rounds):
    """Per row: each binary's ratio to the first, median [lowest-highest] over the rounds
    both ran it, and the first binary's median rate."""
    base = names[0]
    width = max(len(short(row)) for row in rows)
    header = ["%-28s" % ("%s / %s" % (name, base)) for name in names[1:]]
    print("%-*s  %s  %s, M items/s" % (width, "row", "  ".join(header), base))
    for row in rows:
        cells = []
        for name in names[1:]:
            ratios = [rates[(row, r, name)] / rates[(row, r, base)] for r in range(rounds)
                      if (row, r, name) in rates and (row, r, base) in rates]
            cell = "-"
            if ratios:
                cell = "%.2f [%.2f-%.2f] n=%d" % (statistics.median(ratios), min(ratios),
                                                 max(ratios), len(ratios))
            cells.append("%-28s" % cell)
        base_rates = [rates[(row, r, base)] for r in range(rounds) if (row, r, base) in rates]
        base_cell = "%.1f" % (statistics.median(base_rates) / 1e6) if base_rates else "-"
        print("%-*s  %s  %s" % (width, short(row), "  ".join(cells), base_cell))


if __name__ == "__main__":
    sys.exit(main())
