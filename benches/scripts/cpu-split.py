#!/usr/bin/env python3
"""Where the two cores go during a load run: CPU seconds per process group
(fastack server, load tool, PostgreSQL, Redis, RabbitMQ, kernel writeback)
over a 10 s window in the middle of `fastack-bench`, and, with --perf, the
server's hottest symbols from `perf record`.

With --flamegraph FILE.svg the server is sampled with DWARF call stacks
instead and the stacks are drawn as a flame graph (needs `inferno-collapse-perf`
and `inferno-flamegraph` on the PATH: `cargo install inferno`). The server's
CPU per request (its CPU-s over the window divided by the requests answered
in it) is printed in every case, and split by thread (tokio workers, the
inbox writer, sqlx's workers…) into user and system time and the bytes each
wrote, per request.

Usage: benches/scripts/cpu-split.py [--perf | --flamegraph FILE.svg] -- <fastack-bench args...>
e.g.   benches/scripts/cpu-split.py --perf -- --backend postgres --profile track --connections 32
"""
import os, subprocess, sys, time

# FASTACK_BIN: another build to measure (e.g. a copy of the build before a change).
BIN = os.environ.get("FASTACK_BIN") or os.path.join(os.path.dirname(__file__), "..", "..", "target", "release", "fastack")
# FASTACK_BENCH: the load tool (default: fastack-bench beside BIN).
BENCH = os.environ.get("FASTACK_BENCH") or os.path.join(os.path.dirname(BIN), "fastack-bench")
args = sys.argv[1:]
use_perf = "--perf" in args
flamegraph = args[args.index("--flamegraph") + 1] if "--flamegraph" in args else None
use_perf = use_perf or flamegraph is not None
bench_args = args[args.index("--") + 1:] if "--" in args else []
TICK = os.sysconf("SC_CLK_TCK")


def snapshot():
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
            cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        ticks = int(fields[11]) + int(fields[12])
        out[pid] = (group(comm, cmd), ticks)
    return out


def threads(pid):
    """The server's threads by name: user and system CPU ticks and bytes
    written (`wchar`: WAL frames, database pages and socket writes)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
            io = dict(l.split(": ") for l in open(f"/proc/{pid}/task/{tid}/io").read().splitlines())
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        name = "tokio workers" if comm.startswith("tokio-r") else comm
        u, s, w = out.get(name, (0, 0, 0))
        out[name] = (u + int(fields[11]), s + int(fields[12]), w + int(io["wchar"]))
    return out


def group(comm, cmd):
    if "fastack serve" in cmd or cmd.endswith("fastack serve "):
        return "fastack server"
    if "fastack-bench" in cmd:
        return "load tool (fastack-bench)"
    if comm.startswith("postgres") or "postgres:" in cmd:
        return "postgresql"
    if comm.startswith("redis"):
        return "redis"
    if comm in ("beam.smp", "erl_child_setup") or "rabbit" in cmd:
        return "rabbitmq"
    if comm.startswith("kworker") or comm.startswith("jbd2") or comm.startswith("flush"):
        return "kernel writeback"
    return "other"


bench = subprocess.Popen([BENCH, "--server", BIN, "--no-baseline", "--duration", "25", "--warmup", "2", *bench_args],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
time.sleep(9)
server_pid = (subprocess.run(["pgrep", "-f", "fastack serve"], capture_output=True, text=True).stdout.split() or [None])[0]
a, t0 = snapshot(), time.time()
ta = threads(server_pid) if server_pid else {}
perf = None
if use_perf:
    server = [server_pid] if server_pid else []
    if server:
        # The release build keeps no frame pointers: unwind from DWARF.
        stacks = ["-F", "199", "--call-graph", "dwarf,16384"] if flamegraph else ["-F", "499", "-g"]
        perf = subprocess.Popen(["perf", "record", *stacks, "-o", "/tmp/fastack-perf.data", "-p", server[0],
                                 "--", "sleep", "10"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(10)
b, t1 = snapshot(), time.time()
tb = threads(server_pid) if server_pid else {}
if perf:
    perf.wait()
out, _ = bench.communicate()
window = t1 - t0
totals = {}
for pid, (g, ticks) in b.items():
    before = a.get(pid, (g, 0))[1]
    totals[g] = totals.get(g, 0) + (ticks - before) / TICK
print(out.strip())
print(f"\nCPU over {window:.1f} s (2 cores = {2 * window:.1f} CPU-s available):")
print("| process | CPU-s | share of one core |")
print("|---|---|---|")
for g, s in sorted(totals.items(), key=lambda kv: -kv[1]):
    print(f"| {g} | {s:.2f} | {100 * s / window:.0f} % |")
# The load tool's table: "| fastack  |  req/s | events/s | ...".
rates = [l.split("|")[2] for l in out.splitlines() if l.startswith("| fastack")]
if rates and totals.get("fastack server"):
    per_s = float(rates[0])
    print(f"\nserver CPU per request: {1e6 * totals['fastack server'] / (per_s * window):.1f} µs "
          f"(at {per_s:.0f} req/s); PostgreSQL: {1e6 * totals.get('postgresql', 0) / (per_s * window):.1f} µs")
if rates and tb:
    n = float(rates[0]) * window
    print("\nserver threads, per request:")
    print("| thread | user µs | system µs | bytes written |")
    print("|---|---|---|---|")
    rows = []
    for name, (u, s_, w) in tb.items():
        u0, s0, w0 = ta.get(name, (0, 0, 0))
        rows.append((name, 1e6 * (u - u0) / TICK / n, 1e6 * (s_ - s0) / TICK / n, (w - w0) / n))
    for name, u, s_, w in sorted(rows, key=lambda r: -(r[1] + r[2])):
        if u + s_ > 0.5 or w > 10:
            print(f"| {name} | {u:.1f} | {s_:.1f} | {w:.0f} |")
if perf and flamegraph:
    script = subprocess.Popen(["perf", "script", "--no-inline", "-i", "/tmp/fastack-perf.data"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    folded = subprocess.run(["inferno-collapse-perf"], stdin=script.stdout, capture_output=True).stdout
    script.wait()
    title = "fastack server, " + " ".join(bench_args)
    with open(flamegraph, "wb") as f:
        f.write(subprocess.run(["inferno-flamegraph", "--title", title, "--width", "1600"],
                               input=folded, capture_output=True).stdout)
    print(f"\nflame graph: {flamegraph}")
elif perf:
    rep = subprocess.run(["perf", "report", "-i", "/tmp/fastack-perf.data", "--no-children", "--stdio",
                          "--sort", "dso,symbol", "-g", "none", "--percent-limit", "1.5"],
                         capture_output=True, text=True).stdout
    print("\nserver hottest symbols (perf, self time):")
    print("\n".join(l for l in rep.splitlines() if l.strip() and not l.startswith("#")))
