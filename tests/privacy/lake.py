#!/usr/bin/env python3
"""Reads a fastack lake as an analyst would, each tenant's Delta table with
the `deltalake` package, and prints one JSON object: rows, distinct event
ids, the rows of one tenant that carry any of the given identifiers (user
ids, anonymous ids or contact ids) — what an erasure must have left none
of — and, for that tenant's table, where else the identifiers could hide:
every version still readable (time travel), the log's JSON, and every
Parquet object under the table's root, in the table or not.

    lake.py <directory of the lake> <tenant id> <identifier>...
"""

import json
import os
import sys

import pyarrow.compute as pc
import pyarrow.parquet as pq


IDENTIFYING = ("user_id", "anonymous_id", "contact_id")


def carrying(table, wanted: set) -> int:
    """Rows of `table` carrying one of `wanted`."""
    n = 0
    for column in IDENTIFYING:
        n += sum(1 for v in table.column(column).to_pylist() if v in wanted)
    return n


def main(root: str, tenant: str, identifiers: list) -> None:
    from deltalake import DeltaTable

    wanted = set(identifiers)
    rows, ids, tenant_rows, theirs = 0, set(), 0, 0
    ours = None
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if not os.path.isdir(os.path.join(path, "_delta_log")):
            continue
        data = DeltaTable(path).to_pyarrow_table()
        rows += data.num_rows
        ids.update(data.column("id").to_pylist())
        if name == f"tenant={tenant}":
            ours = path
            tenant_rows += pc.sum(pc.equal(data.column("tenant_id"), tenant)).as_py() or 0
            theirs += carrying(data, wanted)
    versions_readable, versions_with_them, log_mentions, files_with_them = 0, 0, 0, 0
    if ours is not None:
        latest = DeltaTable(ours).version()
        for version in range(latest + 1):
            try:
                data = DeltaTable(ours, version=version).to_pyarrow_table()
            except Exception:  # a version naming files an erasure deleted
                continue
            versions_readable += 1
            if carrying(data, wanted):
                versions_with_them += 1
        for dirpath, _, names in os.walk(ours):
            for file in names:
                full = os.path.join(dirpath, file)
                if file.endswith(".parquet") and "_delta_log" not in dirpath:
                    if carrying(pq.read_table(full), wanted):
                        files_with_them += 1
                elif file.endswith(".parquet"):  # a checkpoint of the log
                    text = json.dumps(pq.read_table(full).to_pylist(), default=str)
                    if any(w in text for w in wanted):
                        log_mentions += 1
                else:
                    with open(full, "rb") as f:
                        text = f.read()
                    if any(w.encode() in text for w in wanted):
                        log_mentions += 1
    print(
        json.dumps(
            {
                "rows": rows,
                "distinct_ids": len(ids),
                "tenant_rows": tenant_rows,
                "theirs": theirs,
                "versions_readable": versions_readable,
                "versions_with_them": versions_with_them,
                "log_mentions": log_mentions,
                "files_with_them": files_with_them,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
    # deltalake's runtime threads can abort the interpreter's teardown after
    # the answer is printed: leave without it.
    sys.stdout.flush()
    os._exit(0)
