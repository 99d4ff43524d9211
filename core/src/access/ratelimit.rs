//! Rate limits by GCRA (generic cell rate algorithm), per tenant and per key.
//!
//! One pure decision function, [`gcra`], is used in process (embedded) and
//! mirrored by the Redis Lua script (production), so both modes give the
//! same answers and the same `RateLimit` header values. The Redis script
//! decides tenant and key in one atomic round trip (`EVALSHA`) using the
//! server's clock, so nodes with skewed clocks share one budget; under load
//! a node leases several tokens per round trip ([`lease_size`]).

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use fastack_entities::{ApiKeyId, TenantId};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use redis::{Script, aio::ConnectionManager};

use crate::error::{Error, Result};

const MICROS: i64 = 1_000_000;

/// A sustained rate with a burst allowance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    pub rate_per_sec: u32,
    pub burst: u32,
}

impl Quota {
    fn interval_us(&self) -> i64 {
        (MICROS / i64::from(self.rate_per_sec.max(1))).max(1)
    }
}

/// The state of one policy after a decision, for the `RateLimit` headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyState {
    /// `"tenant"` or `"key"`.
    pub name: &'static str,
    pub quota: Quota,
    pub remaining: u64,
    /// Seconds until the policy is fully replenished.
    pub reset_secs: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub policies: Vec<PolicyState>,
    /// Seconds to wait before retrying (only when refused).
    pub retry_after_secs: u64,
}

impl Decision {
    /// The values of the IETF draft's `RateLimit-Policy` and `RateLimit`
    /// headers. The policy describes the burst: `q` is what an idle client
    /// may send at once, `w` the seconds the rate takes to refill it, so
    /// the remaining count `r` never exceeds `q`.
    ///
    /// Written straight into two buffers: every answer carries them.
    pub fn header_values(&self) -> (String, String) {
        use std::fmt::Write;
        let mut policy = String::with_capacity(48);
        let mut state = String::with_capacity(48);
        for (i, p) in self.policies.iter().enumerate() {
            if i > 0 {
                policy.push_str(", ");
                state.push_str(", ");
            }
            let rate = p.quota.rate_per_sec.max(1);
            let window = p.quota.burst.div_ceil(rate).max(1);
            // Writing to a String cannot fail.
            let _ = write!(policy, "\"{}\";q={};w={window}", p.name, p.quota.burst);
            let _ = write!(state, "\"{}\";r={};t={}", p.name, p.remaining, p.reset_secs);
        }
        (policy, state)
    }
}

/// Result of one GCRA step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub allowed: bool,
    /// Theoretical arrival time to store if the request is let through.
    pub new_tat: i64,
    pub remaining: u64,
    pub reset_us: i64,
    pub retry_us: i64,
}

/// GCRA at time `now` with stored theoretical arrival time `tat` (both µs).
pub fn gcra(now: i64, tat: Option<i64>, quota: Quota) -> Step {
    let interval = quota.interval_us();
    let burst = i64::from(quota.burst.max(1));
    let tat = tat.unwrap_or(now).max(now);
    let new_tat = tat + interval;
    let allow_at = new_tat - burst * interval;
    if now < allow_at {
        Step {
            allowed: false,
            new_tat: tat,
            remaining: 0,
            reset_us: tat - now,
            retry_us: allow_at - now,
        }
    } else {
        Step {
            allowed: true,
            new_tat,
            remaining: ((now + burst * interval - new_tat) / interval).max(0) as u64,
            reset_us: new_tat - now,
            retry_us: 0,
        }
    }
}

fn ceil_secs(us: i64) -> u64 {
    ((us.max(0) + MICROS - 1) / MICROS) as u64
}

fn decision(tenant: (Quota, Step), key: Option<(Quota, Step)>) -> Decision {
    let allowed = tenant.1.allowed && key.is_none_or(|(_, s)| s.allowed);
    let mut policies = vec![PolicyState {
        name: "tenant",
        quota: tenant.0,
        remaining: tenant.1.remaining,
        reset_secs: ceil_secs(tenant.1.reset_us),
    }];
    let mut retry = tenant.1.retry_us;
    if let Some((q, s)) = key {
        policies.push(PolicyState {
            name: "key",
            quota: q,
            remaining: s.remaining,
            reset_secs: ceil_secs(s.reset_us),
        });
        retry = retry.max(s.retry_us);
    }
    Decision {
        allowed,
        policies,
        retry_after_secs: if allowed { 0 } else { ceil_secs(retry).max(1) },
    }
}

/// In-process limiter state of one tenant (its key cells included).
#[derive(Debug)]
pub struct LocalCells {
    base: Instant,
    cells: Mutex<LocalState>,
}

#[derive(Debug, Default)]
struct LocalState {
    tenant: Option<i64>,
    keys: HashMap<ApiKeyId, i64>,
}

impl Default for LocalCells {
    fn default() -> Self {
        LocalCells {
            base: Instant::now(),
            cells: Mutex::new(LocalState::default()),
        }
    }
}

impl LocalCells {
    /// Decides tenant and key together: a refusal by either consumes neither.
    pub fn check(&self, tenant_q: Quota, key: Option<(ApiKeyId, Quota)>) -> Decision {
        let now = self.base.elapsed().as_micros() as i64;
        self.check_at(now, tenant_q, key)
    }

    pub fn check_at(&self, now: i64, tenant_q: Quota, key: Option<(ApiKeyId, Quota)>) -> Decision {
        let mut st = self.cells.lock();
        let t = gcra(now, st.tenant, tenant_q);
        let k = key.map(|(id, q)| (id, q, gcra(now, st.keys.get(&id).copied(), q)));
        let d = decision((tenant_q, t), k.map(|(_, q, s)| (q, s)));
        if d.allowed {
            st.tenant = Some(t.new_tat);
            if let Some((id, _, s)) = k {
                // Bounded: a tenant's keys are few; drop idle cells if not.
                if st.keys.len() > 10_000 {
                    st.keys.retain(|_, tat| *tat > now);
                }
                st.keys.insert(id, s.new_tat);
            }
        }
        d
    }
}

/// Requests without a valid API key, per client address, on this node: a
/// flood of random keys from one address is answered 429 without touching
/// the database once its budget (`FASTACK_UNAUTH_RPS`, burst the same) is
/// spent. Requests with a valid key never draw on it.
#[derive(Debug)]
pub struct ClientLimiter {
    base: Instant,
    quota: Quota,
    cells: Mutex<HashMap<std::net::IpAddr, i64>>,
}

/// Addresses remembered at most; idle ones are dropped beyond it.
const MAX_CLIENTS: usize = 100_000;

impl ClientLimiter {
    pub fn new(rate_per_sec: u32) -> Self {
        Self::with_quota(Quota {
            rate_per_sec,
            burst: rate_per_sec,
        })
    }

    pub fn with_quota(quota: Quota) -> Self {
        ClientLimiter {
            base: Instant::now(),
            quota,
            cells: Mutex::new(HashMap::new()),
        }
    }

    fn now(&self) -> i64 {
        self.base.elapsed().as_micros() as i64
    }

    /// Seconds to wait when the address has spent its budget (nothing is
    /// consumed), `None` while it has some left.
    pub fn exhausted(&self, ip: std::net::IpAddr) -> Option<u64> {
        let now = self.now();
        let tat = self.cells.lock().get(&ip).copied();
        let step = gcra(now, tat, self.quota);
        (!step.allowed).then(|| ceil_secs(step.retry_us).max(1))
    }

    /// Charges one unauthenticated request; `Some(retry after s)` when over.
    pub fn charge(&self, ip: std::net::IpAddr) -> Option<u64> {
        let now = self.now();
        let mut cells = self.cells.lock();
        let step = gcra(now, cells.get(&ip).copied(), self.quota);
        if !step.allowed {
            return Some(ceil_secs(step.retry_us).max(1));
        }
        if cells.len() >= MAX_CLIENTS {
            cells.retain(|_, tat| *tat > now);
        }
        cells.insert(ip, step.new_tat);
        None
    }
}

/// Longest a leased token stays usable; unused ones are then given up.
const LEASE_TTL: Duration = Duration::from_secs(1);
/// A lease covers about this much of the recent local request rate.
const LEASE_WINDOW_SECS: f64 = 0.02;
/// Upper bound of one lease, whatever the rate.
const MAX_LEASE: u32 = 256;

/// How many tokens to ask Redis for at once.
///
/// One at a time while traffic is light, so a lone client sees exact
/// numbers; under load, about `LEASE_WINDOW_SECS` of this node's recent
/// rate (and at least one per request already waiting), capped at a tenth
/// of the smallest burst so a node never holds much of a tenant's budget.
pub fn lease_size(recent_rate_per_sec: f64, waiting: u32, smallest_burst: u32) -> u32 {
    let want = (recent_rate_per_sec * LEASE_WINDOW_SECS).ceil() as u32;
    let cap = (smallest_burst / 10).clamp(1, MAX_LEASE);
    want.max(waiting + 1).clamp(1, cap)
}

// `gcra` for up to `wanted` cells at once, on the tenant cell and the
// optional key cell: grants the same count from both (the smaller fit, 0 =
// refused), atomically, on Redis' clock. With `wanted` = 1 it is `gcra`.
const SCRIPT: &str = r#"
-- KEYS[1] tenant cell, KEYS[2] key cell (optional)
-- ARGV: wanted, tenant interval us, tenant burst, key interval us, key burst
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = tonumber(ARGV[1])
local function load(key)
  local tat = tonumber(redis.call('GET', key))
  if tat == nil or tat < now then tat = now end
  return tat
end
local function fit(tat, interval, burst)
  local f = math.floor((now + burst * interval - tat) / interval)
  if f < 0 then f = 0 end
  return f
end
local ti, tb = tonumber(ARGV[2]), tonumber(ARGV[3])
local tt = load(KEYS[1])
local g = math.min(n, fit(tt, ti, tb))
local ki, kb, kt = 1, 1, now
if #KEYS > 1 then
  ki, kb = tonumber(ARGV[4]), tonumber(ARGV[5])
  kt = load(KEYS[2])
  g = math.min(g, fit(kt, ki, kb))
end
local function report(tat, interval, burst)
  if g == 0 then
    local allow_at = tat + interval - burst * interval
    return {math.max(0, math.floor((now + burst * interval - tat) / interval)), tat - now, allow_at - now}
  end
  local nt = tat + g * interval
  return {math.max(0, math.floor((now + burst * interval - nt) / interval)), nt - now, 0}
end
local a = report(tt, ti, tb)
local b = {0, 0, 0}
if #KEYS > 1 then b = report(kt, ki, kb) end
if g > 0 then
  local nt = tt + g * ti
  redis.call('SET', KEYS[1], nt, 'PX', math.floor((nt - now) / 1000) + 1000)
  if #KEYS > 1 then
    local nk = kt + g * ki
    redis.call('SET', KEYS[2], nk, 'PX', math.floor((nk - now) / 1000) + 1000)
  end
end
return {g, a[1], a[2], a[3], b[1], b[2], b[3]}
"#;

/// Tokens taken from Redis for one (tenant, key) and not yet spent, with
/// the cell states Redis reported when it granted them.
#[derive(Debug)]
struct Lease {
    quotas: (Quota, Option<Quota>),
    left: u32,
    spent: u32,
    taken: Instant,
    tenant: (u64, i64),
    key: (u64, i64),
}

impl Lease {
    /// The decision for a request served from this lease: `remaining`
    /// counts the tokens still held here, `reset` runs down from the grant.
    fn decision(&self, now: Instant) -> Decision {
        let elapsed = now.duration_since(self.taken).as_micros() as i64;
        let step = |(remaining, reset_us): (u64, i64)| Step {
            allowed: true,
            new_tat: 0,
            remaining: remaining + u64::from(self.left),
            reset_us: reset_us - elapsed,
            retry_us: 0,
        };
        decision(
            (self.quotas.0, step(self.tenant)),
            self.quotas.1.map(|q| (q, step(self.key))),
        )
    }
}

#[derive(Debug, Default)]
struct LeaseSlot {
    waiting: AtomicU32,
    held: tokio::sync::Mutex<Held>,
}

/// What a node holds for one (tenant, key) between round trips.
#[derive(Debug, Default)]
enum Held {
    #[default]
    Nothing,
    Tokens(Lease),
    /// Redis refused: a cell's TAT only grows, so no token can be granted
    /// before `until`, and refusing locally until then is exact.
    Refused {
        quotas: (Quota, Option<Quota>),
        until: Instant,
        answer: Decision,
    },
}

/// Redis-backed limiter shared by all nodes.
///
/// Each node leases tokens from Redis in small blocks sized to its own
/// recent rate and spends them locally, so a busy tenant costs one round
/// trip per block instead of one per request. Redis still charges every
/// token before it is used: across nodes the limit is never exceeded; a
/// node's unspent tokens (at most a tenth of the burst) lapse after 1 s.
/// A refusal is remembered until its retry time, so a client hammering
/// past its limit costs no round trips either.
#[derive(Clone)]
pub struct RedisLimiter {
    conn: ConnectionManager,
    script: Arc<Script>,
    prefix: String,
    slots: Arc<Mutex<HashMap<(TenantId, Option<ApiKeyId>), Arc<LeaseSlot>>>>,
    round_trips: Counter,
    /// Until when requests skip Redis after a failed round trip.
    skip_until: Arc<parking_lot::Mutex<Option<Instant>>>,
}

/// How long a rate-limit round trip may take before the request is decided
/// by the node's own cells instead (rate limiting fails open, and a Redis
/// that went away must not spend the request's answer budget).
const ROUND_TRIP_WAIT: Duration = Duration::from_millis(100);

/// After a failed round trip, how long requests use the node's own cells
/// before Redis is tried again.
const SKIP_AFTER_FAILURE: Duration = Duration::from_secs(1);

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl RedisLimiter {
    /// `round_trips` counts the decisions that needed Redis.
    pub async fn connect(url: &str, prefix: &str, round_trips: Counter) -> Result<Self> {
        let client = redis::Client::open(url)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(2)));
        let conn = ConnectionManager::new_with_config(client, config).await?;
        Ok(RedisLimiter {
            conn,
            script: Arc::new(Script::new(SCRIPT)),
            prefix: prefix.to_owned(),
            slots: Arc::default(),
            round_trips,
            skip_until: Arc::default(),
        })
    }

    /// Whether Redis answers (start and dependency checks).
    pub async fn ping(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }

    fn slot(&self, tenant: TenantId, key: Option<ApiKeyId>) -> Arc<LeaseSlot> {
        let mut slots = self.slots.lock();
        if slots.len() > 10_000 {
            // Idle slots hold nothing worth keeping (their tokens lapse).
            slots.retain(|_, s| Arc::strong_count(s) > 1);
        }
        slots.entry((tenant, key)).or_default().clone()
    }

    pub async fn check(
        &self,
        tenant: TenantId,
        tenant_q: Quota,
        key: Option<(ApiKeyId, Quota)>,
    ) -> Result<Decision> {
        let quotas = (tenant_q, key.map(|(_, q)| q));
        let slot = self.slot(tenant, key.map(|(id, _)| id));
        slot.waiting.fetch_add(1, Ordering::Relaxed);
        // Requests of one (tenant, key) queue behind a refill in flight and
        // are then served from what it brought.
        let mut held = slot.held.lock().await;
        let waiting = slot.waiting.fetch_sub(1, Ordering::Relaxed) - 1;
        let now = Instant::now();
        let rate = match &mut *held {
            Held::Tokens(l) if l.quotas == quotas && now.duration_since(l.taken) < LEASE_TTL => {
                if l.left > 0 {
                    l.left -= 1;
                    l.spent += 1;
                    return Ok(l.decision(now));
                }
                f64::from(l.spent) / now.duration_since(l.taken).as_secs_f64().max(1e-3)
            }
            Held::Refused {
                quotas: q,
                until,
                answer,
            } if *q == quotas && now < *until => return Ok(answer.clone()),
            _ => 0.0,
        };
        let smallest_burst = quotas
            .1
            .map_or(tenant_q.burst, |q| q.burst.min(tenant_q.burst));
        let wanted = lease_size(rate, waiting, smallest_burst);

        // The hash tag keeps a tenant's cells in one cluster slot.
        let mut inv = self.script.prepare_invoke();
        inv.arg(wanted);
        inv.key(format!("{}:rl:{{{}}}:t", self.prefix, tenant));
        inv.arg(tenant_q.interval_us()).arg(tenant_q.burst.max(1));
        if let Some((id, q)) = key {
            inv.key(format!("{}:rl:{{{}}}:k:{}", self.prefix, tenant, id));
            inv.arg(q.interval_us()).arg(q.burst.max(1));
        }
        if self.skip_until.lock().is_some_and(|t| now < t) {
            return Err(Error::Deadline("redis"));
        }
        let mut conn = self.conn.clone();
        let r: Vec<i64> =
            match tokio::time::timeout(ROUND_TRIP_WAIT, inv.invoke_async(&mut conn)).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    *self.skip_until.lock() = Some(now + SKIP_AFTER_FAILURE);
                    return Err(e.into());
                }
                Err(_) => {
                    *self.skip_until.lock() = Some(now + SKIP_AFTER_FAILURE);
                    return Err(Error::Deadline("redis"));
                }
            };
        self.round_trips.inc();
        let granted = r[0].max(0) as u32;
        let cell = |i: usize| (r[i].max(0) as u64, r[i + 1], r[i + 2]);
        let (t, k) = (cell(1), cell(4));
        if granted == 0 {
            let step = |(remaining, reset_us, retry_us): (u64, i64, i64)| Step {
                allowed: false,
                new_tat: 0,
                remaining,
                reset_us,
                retry_us,
            };
            let answer = decision((tenant_q, step(t)), quotas.1.map(|q| (q, step(k))));
            let retry_us = t.2.max(if key.is_some() { k.2 } else { 0 }).max(0);
            *held = Held::Refused {
                quotas,
                until: now + Duration::from_micros(retry_us as u64),
                answer: answer.clone(),
            };
            return Ok(answer);
        }
        let lease = Lease {
            quotas,
            left: granted - 1,
            spent: 1,
            taken: now,
            tenant: (t.0, t.1),
            key: (k.0, k.1),
        };
        let answer = lease.decision(now);
        *held = Held::Tokens(lease);
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: Quota = Quota {
        rate_per_sec: 10,
        burst: 3,
    };

    #[test]
    fn header_values_name_each_policy() {
        let d = decision(
            (
                Quota {
                    rate_per_sec: 100,
                    burst: 250,
                },
                Step {
                    allowed: true,
                    new_tat: 0,
                    remaining: 249,
                    reset_us: 10_001,
                    retry_us: 0,
                },
            ),
            Some((
                Quota {
                    rate_per_sec: 5,
                    burst: 5,
                },
                Step {
                    allowed: true,
                    new_tat: 0,
                    remaining: 4,
                    reset_us: 200_000,
                    retry_us: 0,
                },
            )),
        );
        let (policy, state) = d.header_values();
        assert_eq!(policy, "\"tenant\";q=250;w=3, \"key\";q=5;w=1");
        assert_eq!(state, "\"tenant\";r=249;t=1, \"key\";r=4;t=1");
    }

    #[test]
    fn unauthenticated_budget_per_address() {
        let limiter = ClientLimiter::new(3);
        let a: std::net::IpAddr = "192.0.2.1".parse().unwrap();
        let b: std::net::IpAddr = "192.0.2.2".parse().unwrap();
        assert_eq!(limiter.exhausted(a), None);
        for _ in 0..3 {
            assert_eq!(limiter.charge(a), None);
        }
        assert!(limiter.exhausted(a).is_some());
        assert!(limiter.charge(a).is_some());
        assert_eq!(
            limiter.charge(b),
            None,
            "another address has its own budget"
        );
    }

    #[test]
    fn burst_then_steady_rate() {
        let cells = LocalCells::default();
        let now = 1_000_000_000;
        for expected_remaining in [2, 1, 0] {
            let d = cells.check_at(now, Q, None);
            assert!(d.allowed);
            assert_eq!(d.policies[0].remaining, expected_remaining);
        }
        let d = cells.check_at(now, Q, None);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_secs, 1);
        // 100 ms later one more cell has dripped back.
        assert!(cells.check_at(now + 100_000, Q, None).allowed);
        assert!(!cells.check_at(now + 100_000, Q, None).allowed);
    }

    #[test]
    fn key_limit_refusal_does_not_spend_tenant_budget() {
        let cells = LocalCells::default();
        let key = ApiKeyId::new();
        let kq = Quota {
            rate_per_sec: 1,
            burst: 1,
        };
        let now = 5_000_000;
        let d = cells.check_at(now, Q, Some((key, kq)));
        assert!(d.allowed);
        assert_eq!(d.policies.len(), 2);
        let d = cells.check_at(now, Q, Some((key, kq)));
        assert!(!d.allowed);
        assert_eq!(
            d.policies[0].remaining, 1,
            "tenant budget untouched by the refusal"
        );
        // Without the key limit the tenant still has room.
        assert!(cells.check_at(now, Q, None).allowed);
    }

    #[test]
    fn reset_is_time_to_full() {
        let s = gcra(0, None, Q);
        assert!(s.allowed);
        assert_eq!(s.reset_us, 100_000);
        assert_eq!(ceil_secs(s.reset_us), 1);
    }

    #[test]
    fn leases_are_single_tokens_when_light_and_bounded_when_busy() {
        // A lone client: exact, one token per round trip.
        assert_eq!(lease_size(0.0, 0, 200), 1);
        assert_eq!(lease_size(20.0, 0, 200), 1);
        // 5,000 req/s covers 20 ms: 100 tokens, if the burst allows it.
        assert_eq!(lease_size(5_000.0, 0, 100_000), 100);
        // Never more than a tenth of the smallest burst, never above the cap.
        assert_eq!(lease_size(5_000.0, 0, 200), 20);
        assert_eq!(lease_size(5_000.0, 0, 5), 1);
        assert_eq!(lease_size(1e9, 0, u32::MAX), MAX_LEASE);
        // Requests already queued behind the refill get a token each.
        assert_eq!(lease_size(0.0, 31, 100_000), 32);
        assert_eq!(lease_size(0.0, 31, 100), 10);
    }
}
