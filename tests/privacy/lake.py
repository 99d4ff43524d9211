#!/usr/bin/env python3
"""Reads a fastack Parquet lake with pyarrow, as an analyst would, and
prints one JSON object: rows, distinct event ids, and the rows of one
tenant that carry any of the given identifiers (user ids, anonymous ids or
contact ids) — what an erasure must have left none of.

    lake.py <directory of the lake> <tenant id> <identifier>...
"""

import json
import sys

import pyarrow.compute as pc
import pyarrow.dataset as ds


def main(root: str, tenant: str, identifiers: list[str]) -> None:
    table = ds.dataset(root, format="parquet", partitioning="hive").to_table()
    ours = pc.equal(table.column("tenant_id"), tenant)
    wanted = set(identifiers)
    theirs = 0
    for column in ("user_id", "anonymous_id", "contact_id"):
        values = table.column(column).to_pylist()
        mine = ours.to_pylist()
        theirs += sum(1 for v, m in zip(values, mine) if m and v in wanted)
    print(
        json.dumps(
            {
                "rows": table.num_rows,
                "distinct_ids": len(pc.unique(table.column("id"))),
                "tenant_rows": pc.sum(ours).as_py() or 0,
                "theirs": theirs,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
