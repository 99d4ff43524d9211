#!/usr/bin/env python3
"""Instructions per request from callgrind files written with
`--separate-threads=yes` (one file per thread): the total, the split by
thread kind (tokio workers, the inbox writer, sqlx's SQLite workers, the
rest) and each kind's functions by self count.

Usage: benches/scripts/callgrind-split.py REQUESTS FILE... (see
instr-per-request.sh, which calls it)
"""
import collections, re, sys

# A thread's kind, from the functions it ran (thread names are not in the file).
# First match wins: tokio workers also run the inbox writer's async handle.
KINDS = [
    ("tokio workers", "tokio::runtime::scheduler::multi_thread::worker::run"),
    ("sqlx SQLite workers", "sqlx_sqlite::connection::worker"),
    ("inbox writer", "fastack_core::store::sqlite_inbox::commit"),
]


def parse(path):
    """Self cost per function: cost lines after `fn=`, except the line
    after `calls=` (that one is the call's inclusive cost)."""
    names, costs = {}, collections.Counter()
    fn, after_calls = None, False
    for line in open(path, errors="replace"):
        if line.startswith(("fn=", "cfn=")):
            key, _, rest = line.partition("=")
            m = re.match(r"\((\d+)\)(?: (.*))?", rest.strip())
            name = rest.strip()
            if m:
                if m.group(2):
                    names[m.group(1)] = m.group(2)
                name = names.get(m.group(1), name)
            if key == "fn":
                fn = name
        elif line.startswith("calls="):
            after_calls = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            parts = line.split()
            if len(parts) >= 2:
                if after_calls:
                    after_calls = False
                else:
                    costs[fn] += int(parts[1])
    return names.values(), costs


def main():
    n = int(sys.argv[1])
    kinds = collections.defaultdict(collections.Counter)
    for path in sys.argv[2:]:
        names, costs = parse(path)
        kind = next((k for k, marker in KINDS if any(marker in f for f in names)), "other threads")
        kinds[kind].update(costs)
    total = sum(sum(c.values()) for c in kinds.values())
    print(f"instructions per request: {total / n:,.0f}")
    print("\n| thread kind | instructions per request | share |")
    print("|---|---|---|")
    for kind, costs in sorted(kinds.items(), key=lambda kv: -sum(kv[1].values())):
        t = sum(costs.values())
        print(f"| {kind} | {t / n:,.0f} | {100 * t / total:.0f} % |")
    for kind, costs in sorted(kinds.items(), key=lambda kv: -sum(kv[1].values())):
        print(f"\n{kind}: top functions by self count, per request")
        for f, c in costs.most_common(25):
            print(f"{c / n:9,.0f}  {f[:140]}")


main()
