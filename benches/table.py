#!/usr/bin/env python3
"""Builds a results table (the format of benches/HISTORY.md's full runs) from benches/results/*.json."""
import glob, json, os

rows = []
for path in sorted(glob.glob(os.path.join(os.path.dirname(__file__), "results", "*.json"))):
    r = json.load(open(path))
    f, b = r["fastack"], r.get("baseline")
    name = os.path.basename(path)[:-5]
    def fmt(x, nd=2):
        return f"{x:,.{nd}f}"
    line = f"| {name} | {f['mode']} | {fmt(f['requests_per_sec'], 0)} | {fmt(f['events_per_sec'], 0)} | {fmt(f['p50_ms'])} | {fmt(f['p95_ms'])} | {fmt(f['p99_ms'])} | {fmt(f['p999_ms'])} | {sum(f['errors'].values())} |"
    if b:
        line += f" {fmt(b['requests_per_sec'], 0)} / {fmt(b['p50_ms'])} / {fmt(b['p99_ms'])} | {fmt(f['requests_per_sec'] / b['requests_per_sec'])} |"
    else:
        line += " — | — |"
    extra = []
    if r.get("visibility"):
        v = r["visibility"]
        extra.append(f"visible p50 {fmt(v['p50_ms'], 0)} ms, p95 {fmt(v['p95_ms'], 0)} ms ({v['samples']} samples)")
    if r.get("stream_visibility"):
        v = r["stream_visibility"]
        extra.append(f"core.event.tracked consumed p50 {fmt(v['p50_ms'], 0)} ms, p95 {fmt(v['p95_ms'], 0)} ms")
    if r.get("server_rss_mib_after"):
        extra.append(f"RSS {fmt(r['server_rss_mib_before'], 1)} → {fmt(r['server_rss_mib_after'], 1)} MiB")
    line += " " + "; ".join(extra) + " |"
    rows.append(line)
print("| run | mode | req/s | events/s | p50 ms | p95 ms | p99 ms | p99.9 ms | errors | baseline req/s / p50 / p99 | fastack/baseline req/s | notes |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
