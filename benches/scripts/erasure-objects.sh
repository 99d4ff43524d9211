#!/usr/bin/env bash
# An erasure's work outside the database, reported apart from it: one
# retention archive of 1,000,000 rows holding 1,000 of the person's (streamed,
# rewritten, its new manifest read back and verified, copied over the old
# pair and verified again) and a Parquet lake of 30 days (one file an hour,
# the person's event and 150 others in each, every file rewritten). Fills a
# fresh PostgreSQL database, archives January 2020 with `fastack admin
# retention run`, writes the lake with `fastack admin backfill mirror`, then
# runs `fastack admin erasure request --here` and prints the erasure's
# per-store times (its `erasure pass done` log line) and the certificate's
# counts.
#
#   benches/scripts/erasure-objects.sh [BIN]      (default target/release/fastack)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-target/release/fastack}
db=fastack_erasure_objects_$RANDOM$RANDOM
dir=$(mktemp -d)
psql -h 127.0.0.1 -U postgres -d test -qc "CREATE DATABASE $db"
trap 'psql -h 127.0.0.1 -U postgres -d test -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)"; [ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
export FASTACK_DATABASE_URL=postgres://postgres@127.0.0.1:5432/$db
export FASTACK_ENC_KEY=ZmFzdGFjay1iZW5jaC1tYXN0ZXIta2V5LTMyLWJ5dGVzIQ==
export FASTACK_STORAGE_URL=file://$dir/objects
export FASTACK_MIRROR_URL=file://$dir/lake
export FASTACK_LOG=warn
"$bin" migrate >/dev/null
"$bin" admin tenant create --name shop --plan free >/dev/null
tenant=$(psql -h 127.0.0.1 -U postgres -d "$db" -tAc "select id from tenants where name = 'shop'")
contact=$(python3 -c 'import uuid; print(uuid.uuid4())')
psql -h 127.0.0.1 -U postgres -d "$db" -q <<SQL
CREATE TABLE tracked_events_y2020m01 PARTITION OF tracked_events
  FOR VALUES FROM ('2020-01-01 00:00:00+00') TO ('2020-02-01 00:00:00+00') PARTITION BY LIST (retention_class);
CREATE TABLE tracked_events_y2020m01_r13 PARTITION OF tracked_events_y2020m01 FOR VALUES IN (13);
INSERT INTO tracked_events_y2020m01_r13 (tenant_id, occurred_at, id, retention_class, kind, event, contact_id,
    user_id, anonymous_id, properties, occurred_offset_s, received_at, idempotency_key)
SELECT '$tenant'::uuid, '2020-01-01'::timestamptz + (g * interval '2 seconds'), gen_random_uuid(), 13, 'track',
       'Order Completed', CASE WHEN g % 1000 = 0 THEN '$contact'::uuid ELSE gen_random_uuid() END,
       CASE WHEN g % 1000 = 0 THEN 'bench-person' ELSE 'user-' || (g % 50000) END, NULL,
       jsonb_build_object('order_id', 'o-' || g, 'total', (g % 10000) / 100.0, 'currency', 'EUR', 'items', g % 7),
       3600, '2020-01-01'::timestamptz + (g * interval '2 seconds'), 'key-' || g
FROM generate_series(1, 1000000) AS g;
-- The last 30 days: the person once an hour, 150 others an hour.
INSERT INTO tracked_events (tenant_id, occurred_at, id, retention_class, kind, event, contact_id,
    user_id, anonymous_id, properties, occurred_offset_s, received_at, idempotency_key)
SELECT '$tenant'::uuid, date_trunc('hour', now()) - (h * interval '1 hour') + (k * interval '20 seconds'),
       gen_random_uuid(), 13, 'track', 'Page Viewed',
       CASE WHEN k = 0 THEN '$contact'::uuid ELSE gen_random_uuid() END,
       CASE WHEN k = 0 THEN 'bench-person' ELSE 'user-' || k END, NULL,
       jsonb_build_object('path', '/pricing', 'n', k), 0, now(), 'recent-' || h || '-' || k
FROM generate_series(1, 720) AS h, generate_series(0, 150) AS k;
INSERT INTO contacts (id, tenant_id, merged_into, traits, created_at, updated_at)
VALUES ('$contact', '$tenant', NULL, '{}', now(), now());
INSERT INTO contact_identities (tenant_id, kind, value, contact_id) VALUES ('$tenant', 1, 'bench-person', '$contact');
SQL
echo "archiving January 2020 (1,000,000 rows)"
"$bin" admin retention run >/dev/null
from=$(date -u -d '31 days ago' +%FT%TZ)
to=$(date -u +%FT%TZ)
echo "writing the lake (30 days, a file an hour)"
"$bin" admin backfill mirror --tenant shop --from "$from" --to "$to" >/dev/null
echo "lake files: $(find "$dir/lake" -name '*.parquet' | wc -l)"
echo "erasing bench-person"
FASTACK_LOG=fastack_core::erasure=debug /usr/bin/time -v "$bin" admin --json erasure request --tenant shop --user-id bench-person --here \
  >"$dir/cert.json" 2>"$dir/log.txt"
grep 'erasure pass done' "$dir/log.txt" | sed 's/.*erasure pass done //' || true
grep -E "Elapsed|Maximum resident" "$dir/log.txt"
python3 - "$dir/cert.json" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
s = job["result"]["stores"]
print(json.dumps({
    "status": job["status"],
    "execution_time_ms": job["execution_time_ms"],
    "events_removed": s["tracked_events"]["events_removed"],
    "archive_rows_removed": s["archives"]["events_removed"],
    "archives_rewritten": s["archives"]["objects_rewritten"],
    "lake_events_removed": s["lake"]["events_removed"],
    "lake_files_rewritten": s["lake"]["files_rewritten"],
    "found": job["result"]["verification"]["found"],
}, indent=2))
PY
