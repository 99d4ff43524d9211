-- wrk script for `fastack bench --wrk benches/wrk/events.lua` (which sets
-- the environment below and runs wrk against fastack and the bare baseline
-- back to back). Standalone:
--
--   FASTACK_BENCH_KEY=fsk_... wrk -t1 -c32 -d8s -s benches/wrk/events.lua http://127.0.0.1:8080
--
-- FASTACK_BENCH_KEY    the tenant's API key (required)
-- FASTACK_BENCH_RUN    prefix of the idempotency keys (unique per run)
-- FASTACK_BENCH_BATCH  events per request: 1 sends `track`, more a `batch`
-- FASTACK_BENCH_FORMAT `fastack` (default), or `capture`: the same events
--                      in PostHog capture's format, POST /i/v0/e (an object,
--                      or an array for a batch; the key as the token)
--
-- Every event is the load tool's "Order Completed" (same size), with an
-- idempotency key of its own. At the end one line `WRK_JSON {...}` carries
-- the counts and latency percentiles (microseconds) for the load tool.

local key = os.getenv("FASTACK_BENCH_KEY") or ""
local run = os.getenv("FASTACK_BENCH_RUN") or tostring(os.time())
local batch = tonumber(os.getenv("FASTACK_BENCH_BATCH") or "1")
local occurred = os.date("!%Y-%m-%dT%H:%M:%S.000000Z")
local capture = os.getenv("FASTACK_BENCH_FORMAT") == "capture"

local threads = {}
local counter = 0
-- A global: `setup` gives each thread its own.
prefix = run

function setup(thread)
  thread:set("prefix", run .. "-t" .. tostring(#threads))
  table.insert(threads, thread)
end

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
if not capture then
  wrk.headers["Authorization"] = "Bearer " .. key
end

local function capture_event(n, i)
  return string.format(
    '{"token":"%s","event":"Order Completed","distinct_id":"user-%d","properties":{"order_id":"o-%d-%d",' ..
      '"total":129.9,"currency":"EUR","items":3},"timestamp":"%s","uuid":"%s"}',
    key, (n * 131 + i) % 5000, n, i, occurred, string.format("00000000-0000-4000-8000-%012d", n * 1000 + i))
end

local function event(n, i, typed)
  return string.format(
    '{%s"event":"Order Completed","user_id":"user-%d","properties":{"order_id":"o-%d-%d",' ..
      '"total":129.9,"currency":"EUR","items":3},"occurred_at":"%s","idempotency_key":"%s-%d-%d"}',
    typed and '"type":"track",' or "", (n * 131 + i) % 5000, n, i, occurred, prefix, n, i)
end

function request()
  counter = counter + 1
  if capture then
    if batch <= 1 then
      return wrk.format(nil, "/i/v0/e", nil, capture_event(counter, 0))
    end
    local items = {}
    for i = 0, batch - 1 do
      items[#items + 1] = capture_event(counter, i)
    end
    return wrk.format(nil, "/i/v0/e", nil, "[" .. table.concat(items, ",") .. "]")
  end
  if batch <= 1 then
    return wrk.format(nil, "/v1/core/track", nil, event(counter, 0, false))
  end
  local items = {}
  for i = 0, batch - 1 do
    items[#items + 1] = event(counter, i, true)
  end
  return wrk.format(nil, "/v1/core/batch", nil, '{"batch":[' .. table.concat(items, ",") .. "]}")
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"errors":%d,"non_2xx":%d,' ..
      '"p50_us":%d,"p95_us":%d,"p99_us":%d,"p999_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(95), latency:percentile(99),
    latency:percentile(99.9), latency.max))
end
