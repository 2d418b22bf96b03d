#!/usr/bin/env python3
"""Turns Google Benchmark JSON from bench_rings / bench_pipeline / bench_inference into the tables of
benchmarks/RESULTS.md: medians of the repetitions, each figure divided by its peer from
the same run (machines are shared and noisy; only same-run ratios are compared).

  ./build/benchmarks/bench_rings --benchmark_repetitions=5 \
      --benchmark_out=rings.json --benchmark_out_format=json
  python3 benchmarks/summarize.py rings.json [pipeline.json ...]
"""
import json
import re
import sys


def medians(path):
    """{run_name: {counter: median}} plus the context block of one JSON file."""
    with open(path) as f:
        data = json.load(f)
    out = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        name = b["run_name"]
        # Without repetitions there are no aggregates: the single run is the median.
        if b.get("run_type") == "aggregate" or name not in out:
            keys = {k: v for k, v in b.items() if isinstance(v, (int, float))}
            out[name] = keys
    return out, data.get("context", {})


def short(name):
    for suffix in ("/min_time:0.100", "/manual_time", "/real_time", "/iterations:1"):
        name = name.replace(suffix, "")
    return name


def fmt_rate(v):
    return f"{v / 1e6:.2f} M/s" if v >= 1e6 else f"{v / 1e3:.1f} k/s"


def natural(item):
    """Sort key for (name, value) pairs: batch:4 before batch:16."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", item[0])]


def rings(m):
    ips = {short(k): v.get("items_per_second", 0.0) for k, v in sorted(m.items())}
    holds = {short(k): v.get("holds") for k, v in sorted(m.items())}
    print("| workload | conveyor | fastest peer | conveyor / peer "
          "| fastest peer holding <= 1.05x as many | conveyor / it | block / try (conveyor) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for me, mine in ips.items():
        parts = me.split("/")  # workload / queue / path [/ capacity]
        if parts[0] not in ("spsc", "mpmc2x2") or parts[1] != "conveyor":
            continue
        peers = {k: v for k, v in ips.items()
                 if k.split("/")[0] == parts[0] and k.split("/")[2:] == parts[2:]
                 and k.split("/")[1] != "conveyor" and not k.split("/")[1].startswith("lamport")}
        # The same bound on items in flight: a peer that holds twice as many is another
        # workload (moodycamel's ReaderWriterQueue asked for 1024 holds 2044).
        mine_holds = holds.get(me)
        fair = {k: v for k, v in peers.items()
                if mine_holds is None or holds.get(k) is None or holds[k] <= 1.05 * mine_holds}
        twin = "/".join(parts[:2] + ["try"] + parts[3:])
        bt = mine / ips[twin] if ips.get(twin) else float("nan")

        def best_of(group):
            if not group:
                return "-", "-"
            k = max(group, key=group.get)
            held = f", holds {holds[k]:.0f}" if holds.get(k) is not None else ""
            return f"{fmt_rate(group[k])} ({k.split('/')[1]}{held})", f"{mine / group[k]:.2f}"

        any_peer, any_ratio = best_of(peers)
        fair_peer, fair_ratio = best_of(fair)
        print(f"| {me} | {fmt_rate(mine)} | {any_peer} | {any_ratio} | {fair_peer} | {fair_ratio} "
              f"| {bt:.2f} |")
    rtt = {short(k): v.get("ns_per_rtt") for k, v in sorted(m.items()) if k.startswith("rtt/")}
    if rtt:
        print("\n| round trip | ns per round trip |")
        print("| --- | --- |")
        for k, v in rtt.items():
            print(f"| {k} | {v * 1e9:.0f} |")  # stored in seconds
    idle = {short(k): v.get("cpu_us_per_s") for k, v in sorted(m.items()) if k.startswith("idle/")}
    if idle:
        print("\n| blocked idle consumer | CPU us used in 1 s |")
        print("| --- | --- |")
        for k, v in idle.items():
            print(f"| {k} | {v:.1f} |")
    pads = {k: v for k, v in ips.items() if "/lamport-" in k}
    if pads:
        print("\n| false-sharing layout (SPSC try) | items/s | vs packed |")
        print("| --- | --- | --- |")
        for k, v in pads.items():
            packed = ips.get(k.replace(k.split("/")[1], "lamport-packed"))
            print(f"| {k} | {fmt_rate(v)} | {v / packed:.2f} |")


def pipeline(m):
    """bench_pipeline and bench_inference: throughput, efficiency against the stage bound
    measured in the same run, and the ratio to the peers in the same run."""
    ips = dict(sorted(((short(k), v) for k, v in m.items() if "/bandwidth/" not in k),
                      key=natural))
    inference = any(k.split("/")[1:2] == ["serial"] for k in ips)
    print("| benchmark | items/s | efficiency | GPU busy | ratio |")
    print("| --- | --- | --- | --- | --- |")
    tbb = ips.get("tbb/trivial/tokens:8", {}).get("items_per_second")
    for k, v in ips.items():
        eff = v.get("overlap_efficiency", v.get("efficiency"))
        busy = v.get("gpu_busy_fraction")
        note = ""
        rate = v.get("items_per_second", 0.0)
        if "/trivial" in k and tbb and not k.startswith(("tbb/", "serial/")):
            note = f"{rate / tbb:.2f}x tbb"
        if inference and "/conveyor/" in k:
            rt = k.split("/")[0]
            serial = ips.get(f"{rt}/serial", {}).get("items_per_second")
            queue = ips.get(f"{rt}/thread_queue", {}).get("items_per_second")
            # The compute- and transfer-bound configurations have their own loop peer.
            own = ips.get(f"{rt}/thread_queue/{k.split('/conveyor/')[1]}", {}).get("items_per_second")
            by_hand = ips.get(f"{rt}/by_hand/{k.split('/conveyor/')[1]}", {}).get("items_per_second")
            if own:
                note = f"{rate / own:.2f}x thread_queue on the same work"
                if by_hand:
                    note += f", {rate / by_hand:.2f}x by_hand"
            elif serial and queue:
                note = f"{rate / serial:.2f}x serial, {rate / queue:.2f}x thread_queue"
        if k.endswith("/staging:pageable"):
            pinned = ips.get(k.removesuffix("/staging:pageable"), {}).get("items_per_second")
            if pinned:
                note = f"{rate / pinned:.2f}x the same loop staging in pinned memory"
        print(f"| {k} | {fmt_rate(rate)} | {'' if eff is None else f'{eff:.3f}'} | "
              f"{'' if busy is None else f'{busy:.2f}'} | {note} |")
    for w in (1, 2):
        off = ips.get(f"conveyor/trivial/workers:{w}/metrics:off", {}).get("items_per_second")
        on = ips.get(f"conveyor/trivial/workers:{w}/metrics:on", {}).get("items_per_second")
        if off and on:
            print(f"\nmetrics on / off (trivial, {w} worker{'s' if w > 1 else ''}): {on / off:.2f}")


def inference(m):
    """bench_inference's sweeps: latency and transfer goodput beside throughput, and the
    bandwidth probe that the goodput is a ratio of."""
    runs = dict(sorted(((short(k), v) for k, v in m.items()), key=natural))
    peak = {}
    for k, v in runs.items():
        if "/bandwidth/" in k:
            peak[k.split("/bandwidth/")[1]] = v.get("bytes_per_second", 0.0)
    if peak:
        print("\n| copy | GB/s |")
        print("| --- | --- |")
        for k, v in peak.items():
            print(f"| {k} | {v / 1e9:.2f} |")
    pinned = peak.get("h2d:pinned")
    print("\n| pipeline | items/s | efficiency | bound: slowest stage alone | P50 ms | P95 ms "
          "| H2D goodput GB/s (/ pinned peak) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for k, v in runs.items():
        if "/conveyor/" not in k:
            continue
        good = v.get("h2d_goodput_bytes_per_second")
        ratio = f"{good / 1e9:.2f} ({good / pinned:.2f})" if good and pinned else ""
        print(f"| {k} | {fmt_rate(v.get('items_per_second', 0.0))} | "
              f"{v.get('efficiency', 0.0):.3f} | {bound_stage(v)} | {v.get('latency_p50_ms', 0.0):.2f} | "
              f"{v.get('latency_p95_ms', 0.0):.2f} | {ratio} |")


def bound_stage(v):
    """The slowest stage of bench_inference's probes (stage_<name>_items_per_second) and
    the next one, so a reader sees how clear the bound is."""
    stages = sorted((rate, k[len("stage_"):-len("_items_per_second")]) for k, rate in v.items()
                    if k.startswith("stage_") and k.endswith("_items_per_second") and rate > 0)
    if not stages:
        return ""
    text = f"{stages[0][1]} {fmt_rate(stages[0][0])}"
    if len(stages) > 1:
        text += f" (next: {stages[1][1]} {fmt_rate(stages[1][0])})"
    return text


def main():
    for path in sys.argv[1:]:
        m, ctx = medians(path)
        print(f"<!-- {path}: {ctx.get('date', '?')}, {ctx.get('num_cpus', '?')} CPUs, "
              f"load {ctx.get('load_avg', '?')} -->")
        if any(k.startswith(("spsc/", "mpmc2x2/", "rtt/")) for k in m):
            rings(m)
        else:
            pipeline(m)
            if any("/bandwidth/" in k for k in m):
                inference(m)
        print()


if __name__ == "__main__":
    main()
