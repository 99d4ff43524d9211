#!/usr/bin/env bash
# Send -> delivered, webhooks and AMQP: the load client and the receiver are
# `fastack-bench` (`--webhook` starts a receiver in the load tool that
# answers 204 at once and registers it for `core.event.tracked`).
#
#   benches/scripts/deliveries.sh [path/to/fastack]
#
# 1. paced 500 events/s: send -> webhook delivered, PostgreSQL + Redis and
#    embedded SQLite; send -> `core.event.tracked` consumed from RabbitMQ;
# 2. flat out (32 connections): accepted/s against delivered/s.
set -euo pipefail
bin=${1:-target/release/fastack}
bench=${FASTACK_BENCH:-$(dirname "$bin")/fastack-bench}   # the load tool, beside the server by default
pg=${FASTACK_BENCH_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}
amqp=${FASTACK_BENCH_AMQP:-amqp://guest:guest@127.0.0.1:5672/%2f}
common=(--profile track --connections 32 --duration 15 --warmup 3 --no-baseline)

echo "== paced 500/s, webhook, PostgreSQL + Redis"
"$bench" --server "$bin" "${common[@]}" --backend postgres --postgres "$pg" --rate 500 --webhook
echo "== paced 500/s, webhook, embedded SQLite"
"$bench" --server "$bin" "${common[@]}" --backend sqlite --rate 500 --webhook
echo "== paced 500/s, AMQP, PostgreSQL + Redis"
"$bench" --server "$bin" "${common[@]}" --backend postgres --postgres "$pg" --rate 500 --visibility --amqp "$amqp"
echo "== flat out, webhook, PostgreSQL + Redis"
"$bench" --server "$bin" "${common[@]}" --backend postgres --postgres "$pg" --webhook
