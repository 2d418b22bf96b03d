#!/usr/bin/env python3
"""Turns Google Benchmark JSON from bench_rings / bench_pipeline / bench_inference into the tables of
benchmarks/RESULTS.md: medians of the repetitions, each figure divided by its peer from
the same run (machines are shared and noisy; only same-run ratios are compared).
For bench_inference the first table is the one to read first: conveyor against the
hand-written producer + queue loop at equal threads, over batch sizes and workers; then
latency under paced arrivals, CUDA graphs and precisions (GPU runs), then every row.

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
    if not v:
        return "-"
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
            rest = k.split('/conveyor/')[1]
            own = (ips.get(f"{rt}/thread_queue/{rest}/streams:2", {}).get("items_per_second")
                   or ips.get(f"{rt}/thread_queue/{rest}", {}).get("items_per_second"))
            by_hand = ips.get(f"{rt}/by_hand/{k.split('/conveyor/')[1]}", {}).get("items_per_second")
            fair = next((v2.get("items_per_second") for k2, v2 in ips.items()
                         if re.fullmatch(rf"{re.escape(rt)}/thread_queue/producers:\d+/streams:\d+", k2)), None)
            if "/paced/" in k:
                note = "paced: its rate is the offered load (latency table)"
            elif own:
                note = f"{rate / own:.2f}x thread_queue on the same work"
                if by_hand:
                    note += f", {rate / by_hand:.2f}x by_hand"
            elif serial and queue:
                note = f"{rate / serial:.2f}x serial, {rate / queue:.2f}x thread_queue (1 producer, 1 stream)"
                if fair and k.endswith("/conveyor/lanes:2"):
                    note += f", {rate / fair:.2f}x thread_queue at equal threads"
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
    print("\n| pipeline (flooded: latency is mostly queueing) | items/s | efficiency "
          "| bound: slowest stage alone | P50 ms | P95 ms | P99 ms | H2D goodput GB/s (/ pinned peak) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for k, v in runs.items():
        if "/conveyor/" not in k or "/paced/" in k:
            continue
        good = v.get("h2d_goodput_bytes_per_second")
        ratio = f"{good / 1e9:.2f} ({good / pinned:.2f})" if good and pinned else ""
        print(f"| {k} | {fmt_rate(v.get('items_per_second', 0.0))} | "
              f"{v.get('efficiency', 0.0):.3f} | {bound_stage(v)} | {v.get('latency_p50_ms', 0.0):.2f} | "
              f"{v.get('latency_p95_ms', 0.0):.2f} | {v.get('latency_p99_ms', 0.0):.2f} | {ratio} |")


def first(m):
    """bench_inference: the table a user reads first. conveyor against the hand-written
    producer + queue loop with the same threads (W producers = W prepare workers, one
    stream per lane), over batch sizes and workers; the loop as people write it first
    (1 producer, 1 stream) and the serial loop for scale."""
    runs = {short(k): v for k, v in m.items()}
    ips = {k: v.get("items_per_second", 0.0) for k, v in runs.items()}
    rts = sorted({k.split("/")[0] for k in runs if "/conveyor/batch:" in k})
    for rt in rts:
        grid = sorted({tuple(int(x) for x in re.findall(r"batch:(\d+)/workers:(\d+)$", k)[0])
                       for k in runs if k.startswith(f"{rt}/conveyor/batch:")})
        if not grid:
            continue
        print(f"\n**{rt}: conveyor vs the hand-written producer + queue loop at equal threads** "
              "(W producers for W prepare workers, 2 streams for 2 lanes; median items/s)\n")
        workers = sorted({w for _, w in grid})
        print("| batch | " + " | ".join(f"W={w}: conveyor / loop = ratio" for w in workers) + " |")
        print("| --- |" + " --- |" * len(workers))
        for b in sorted({b for b, _ in grid}):
            cells = []
            for w in workers:
                mine = ips.get(f"{rt}/conveyor/batch:{b}/workers:{w}")
                peer = ips.get(f"{rt}/thread_queue/batch:{b}/workers:{w}/streams:2")
                cells.append(f"{fmt_rate(mine)} / {fmt_rate(peer)} = {mine / peer:.2f}x"
                             if mine and peer else "-")
            print(f"| {b} | " + " | ".join(cells) + " |")
        lanes2 = ips.get(f"{rt}/conveyor/lanes:2")
        notes = []
        for name, label in ((f"{rt}/thread_queue", "1 producer, 1 stream: what people write first"),
                            (f"{rt}/serial", "serial loop, one image at a time"),
                            (f"{rt}/batched", "serial loop over batches")):
            if ips.get(name) and lanes2:
                notes.append(f"conveyor (default: lanes:2) / {label}: {lanes2 / ips[name]:.2f}x")
        fair = [k for k in ips if re.fullmatch(rf"{re.escape(rt)}/thread_queue/producers:\d+/streams:\d+", k)]
        for k in fair:
            if lanes2:
                notes.append(f"conveyor (default) / {k.split('/', 1)[1]}: {lanes2 / ips[k]:.2f}x")
        for n in notes:
            print(f"- {n}")
        paced = sorted(((tuple(float(x) for x in re.findall(r"batch:(\d+)/load:([\d.]+)$", k)[0]), v)
                        for k, v in runs.items() if k.startswith(f"{rt}/conveyor/paced/")))
        if paced:
            print(f"\n**{rt}: latency under paced arrivals** (load: fraction of the default pipeline's "
                  "flood throughput; latency from each item's due time to the sink)\n")
            print("| batch | load | offered items/s | achieved items/s | P50 ms | P95 ms | P99 ms |")
            print("| --- | --- | --- | --- | --- | --- | --- |")
            for (b, load), v in paced:
                print(f"| {b:.0f} | {load:.2f} | {fmt_rate(v.get('offered_items_per_second', 0.0))} | "
                      f"{fmt_rate(v.get('achieved_items_per_second', 0.0))} | "
                      f"{v.get('latency_p50_ms', 0.0):.2f} | {v.get('latency_p95_ms', 0.0):.2f} | "
                      f"{v.get('latency_p99_ms', 0.0):.2f} |")
        graphs = sorted({int(b) for k in runs for b in re.findall(rf"^{re.escape(rt)}/conveyor/graphs:o\w+/batch:(\d+)$", k)})
        if graphs:
            print(f"\n**{rt}: CUDA graphs at small batches** (items/s)\n")
            print("| batch | graphs off | graphs on | on / off | P95 ms off / on |")
            print("| --- | --- | --- | --- | --- |")
            for b in graphs:
                off = runs.get(f"{rt}/conveyor/graphs:off/batch:{b}", {})
                on = runs.get(f"{rt}/conveyor/graphs:on/batch:{b}", {})
                r_off, r_on = off.get("items_per_second"), on.get("items_per_second")
                ratio = f"{r_on / r_off:.2f}x" if r_on and r_off else "-"
                print(f"| {b} | {fmt_rate(r_off or 0)} | {fmt_rate(r_on or 0)} | {ratio} | "
                      f"{off.get('latency_p95_ms', 0.0):.2f} / {on.get('latency_p95_ms', 0.0):.2f} |")
        precs = [p for p in ("fp32", "tf32", "fp16", "bf16") if f"{rt}/conveyor/precision:{p}" in runs]
        if precs:
            print(f"\n**{rt}: precision** (items/s; labels_differ: labels unlike the fp32 serial loop's)\n")
            print("| precision | default model | vs fp32 | wide model (compute-bound) | vs fp32 |")
            print("| --- | --- | --- | --- | --- |")
            base = ips.get(f"{rt}/conveyor/precision:fp32")
            wbase = ips.get(f"{rt}/conveyor/model:wide/precision:fp32")
            for p in precs:
                d, w = ips.get(f"{rt}/conveyor/precision:{p}"), ips.get(f"{rt}/conveyor/model:wide/precision:{p}")
                print(f"| {p} | {fmt_rate(d or 0)} | {d / base if d and base else 0:.2f}x | "
                      f"{fmt_rate(w or 0)} | {w / wbase if w and wbase else 0:.2f}x |")


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
            if any("/bandwidth/" in k for k in m):
                first(m)
                print()
            pipeline(m)
            if any("/bandwidth/" in k for k in m):
                inference(m)
        print()


if __name__ == "__main__":
    main()
