#!/usr/bin/env bash
# Time and memory to archive one partition of 1,000,000 events, and the
# archive's compression ratio: fills tracked_events_y2020m01_r13 of a fresh
# PostgreSQL database with 1M realistic rows, then runs
# `fastack admin retention run` under /usr/bin/time -v.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=target/release/fastack
db=fastack_archive_$RANDOM$RANDOM
dir=$(mktemp -d)
psql -h 127.0.0.1 -U postgres -d test -qc "CREATE DATABASE $db"
export FASTACK_DATABASE_URL=postgres://postgres@127.0.0.1:5432/$db
export FASTACK_ENC_KEY=ZmFzdGFjay1iZW5jaC1tYXN0ZXIta2V5LTMyLWJ5dGVzIQ==
export FASTACK_STORAGE_URL=file://$dir
export FASTACK_LOG=warn
"$bin" migrate >/dev/null
"$bin" admin tenant create --name archive --plan free >/dev/null
tenant=$(psql -h 127.0.0.1 -U postgres -d "$db" -tAc "select id from tenants where name = 'archive'")
psql -h 127.0.0.1 -U postgres -d "$db" -q <<SQL
CREATE TABLE tracked_events_y2020m01 PARTITION OF tracked_events
  FOR VALUES FROM ('2020-01-01 00:00:00+00') TO ('2020-02-01 00:00:00+00') PARTITION BY LIST (retention_class);
CREATE TABLE tracked_events_y2020m01_r13 PARTITION OF tracked_events_y2020m01 FOR VALUES IN (13);
INSERT INTO tracked_events_y2020m01_r13 (tenant_id, occurred_at, id, retention_class, kind, event, contact_id,
    user_id, anonymous_id, properties, occurred_offset_s, received_at, idempotency_key)
SELECT '$tenant'::uuid, '2020-01-01'::timestamptz + (g * interval '2 seconds'), gen_random_uuid(), 13, 'track',
       'Order Completed', gen_random_uuid(), 'user-' || (g % 50000), NULL,
       jsonb_build_object('order_id', 'o-' || g, 'total', (g % 10000) / 100.0, 'currency', 'EUR', 'items', g % 7),
       3600, '2020-01-01'::timestamptz + (g * interval '2 seconds'), 'key-' || g
FROM generate_series(1, 1000000) AS g;
SQL
echo "rows: $(psql -h 127.0.0.1 -U postgres -d "$db" -tAc 'select count(*) from tracked_events_y2020m01_r13')"
/usr/bin/time -v "$bin" admin retention run 2> "$dir/time.txt" | grep tracked_events_y2020m01_r13
grep -E "Elapsed|Maximum resident" "$dir/time.txt"
manifest=$(find "$dir" -name '*.manifest.json' -path '*y2020m01_r13*')
python3 -c "import json,sys; m=json.load(open('$manifest')); print(f\"uncompressed {m['uncompressed_bytes']} B, compressed {m['compressed_bytes']} B, ratio {m['uncompressed_bytes']/m['compressed_bytes']:.2f}x\")"
psql -h 127.0.0.1 -U postgres -d test -qc "DROP DATABASE $db WITH (FORCE)"
rm -rf "$dir"
