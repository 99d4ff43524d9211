#!/usr/bin/env bash
# What PostgreSQL does per accepted-and-processed event: statements (calls,
# rows and execution time per event, from pg_stat_statements) and WAL
# (bytes, records, full-page images and syncs per event, from pg_stat_wal)
# over one closed-loop run of the load tool, which waits until processing
# has drained the inbox before it stops the server.
#
#   benches/scripts/pg-per-event.sh [path/to/fastack] [bench args...]
#
# Needs `pg_stat_statements` in `shared_preload_libraries` (then a restart):
#   psql -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
# The counters are the whole server's: run nothing else against it meanwhile.
set -euo pipefail
bin=${1:-target/release/fastack}
bench=${FASTACK_BENCH:-$(dirname "$bin")/fastack-bench}   # the load tool, beside the server by default
shift || true
extra=("$@")
[ ${#extra[@]} -gt 0 ] || extra=(--profile track --connections 32)
pg=${FASTACK_BENCH_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}
q() { psql "$pg" -X -q -v ON_ERROR_STOP=1 "$@"; }

q -tAc "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
q -tAc "SELECT pg_stat_statements_reset()" >/dev/null
q -tAc "SELECT pg_stat_reset_shared('wal')" >/dev/null
"$bench" --server "$bin" --backend postgres --postgres "$pg" --duration 8 --warmup 0 --no-baseline "${extra[@]}"

# Events processed = rows inserted into tracked_events during the run.
q <<'SQL'
\pset footer off
WITH ev AS (
  SELECT sum(rows)::numeric AS n FROM pg_stat_statements
  WHERE query ~* '^\s*insert into "?tracked_events'
)
SELECT ev.n AS events,
       round(sum(s.calls) / ev.n, 2) AS statements_per_event,
       round(sum(s.total_exec_time)::numeric * 1000 / ev.n, 1) AS exec_us_per_event
FROM pg_stat_statements s, ev
WHERE s.query !~* 'pg_stat_statements|pg_stat_reset'
GROUP BY ev.n;

WITH ev AS (
  SELECT sum(rows)::numeric AS n FROM pg_stat_statements
  WHERE query ~* '^\s*insert into "?tracked_events'
)
SELECT round(s.calls / ev.n, 3) AS calls_per_event,
       round(s.rows / ev.n, 3) AS rows_per_event,
       round(s.total_exec_time::numeric * 1000 / ev.n, 1) AS exec_us_per_event,
       left(regexp_replace(s.query, '\s+', ' ', 'g'), 110) AS statement
FROM pg_stat_statements s, ev
WHERE s.calls / ev.n >= 0.001
ORDER BY s.total_exec_time DESC
LIMIT 25;

WITH ev AS (
  SELECT sum(rows)::numeric AS n FROM pg_stat_statements
  WHERE query ~* '^\s*insert into "?tracked_events'
)
SELECT round(w.wal_bytes / ev.n) AS wal_bytes_per_event,
       round(w.wal_records / ev.n, 2) AS wal_records_per_event,
       round(w.wal_fpi / ev.n, 3) AS full_page_images_per_event,
       round(w.wal_sync / ev.n, 3) AS wal_syncs_per_event
FROM pg_stat_wal w, ev;
SQL
