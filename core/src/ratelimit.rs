//! Rate limits by GCRA (generic cell rate algorithm), per tenant and per key.
//!
//! One pure decision function, [`gcra`], is used in process (embedded) and
//! mirrored exactly by the Redis Lua script (production), so both modes give
//! the same answers and the same `RateLimit` header values. The Redis script
//! decides tenant and key in one atomic round trip (`EVALSHA`) using the
//! server's clock, so nodes with skewed clocks share one budget.

use std::time::Instant;

use fastack_entities::{ApiKeyId, TenantId};
use parking_lot::Mutex;
use redis::{Script, aio::ConnectionManager};

use crate::error::Result;

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
    keys: std::collections::HashMap<ApiKeyId, i64>,
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

const SCRIPT: &str = r#"
-- KEYS[1] tenant cell, KEYS[2] key cell (optional)
-- ARGV: tenant interval us, tenant burst, key interval us, key burst
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function step(key, interval, burst)
  local tat = tonumber(redis.call('GET', key))
  if tat == nil or tat < now then tat = now end
  local new_tat = tat + interval
  local allow_at = new_tat - burst * interval
  if now < allow_at then
    return {0, tat, 0, tat - now, allow_at - now}
  end
  return {1, new_tat, math.floor((now + burst * interval - new_tat) / interval), new_tat - now, 0}
end
local a = step(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]))
local b = {1, now, 0, 0, 0}
if #KEYS > 1 then b = step(KEYS[2], tonumber(ARGV[3]), tonumber(ARGV[4])) end
if a[1] == 1 and b[1] == 1 then
  redis.call('SET', KEYS[1], a[2], 'PX', math.floor((a[2] - now) / 1000) + 1000)
  if #KEYS > 1 then
    redis.call('SET', KEYS[2], b[2], 'PX', math.floor((b[2] - now) / 1000) + 1000)
  end
end
return {a[1], a[3], a[4], a[5], b[1], b[3], b[4], b[5]}
"#;

/// Redis-backed limiter shared by all nodes.
#[derive(Clone)]
pub struct RedisLimiter {
    conn: ConnectionManager,
    script: std::sync::Arc<Script>,
    prefix: String,
}

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl RedisLimiter {
    pub async fn connect(url: &str, prefix: &str) -> Result<Self> {
        let client = redis::Client::open(url)?;
        let conn = ConnectionManager::new(client).await?;
        Ok(RedisLimiter {
            conn,
            script: std::sync::Arc::new(Script::new(SCRIPT)),
            prefix: prefix.to_owned(),
        })
    }

    pub async fn check(
        &self,
        tenant: TenantId,
        tenant_q: Quota,
        key: Option<(ApiKeyId, Quota)>,
    ) -> Result<Decision> {
        // The hash tag keeps a tenant's cells in one cluster slot.
        let mut inv = self.script.prepare_invoke();
        inv.key(format!("{}:rl:{{{}}}:t", self.prefix, tenant));
        inv.arg(tenant_q.interval_us()).arg(tenant_q.burst.max(1));
        if let Some((id, q)) = key {
            inv.key(format!("{}:rl:{{{}}}:k:{}", self.prefix, tenant, id));
            inv.arg(q.interval_us()).arg(q.burst.max(1));
        }
        let mut conn = self.conn.clone();
        let r: Vec<i64> = inv.invoke_async(&mut conn).await?;
        let step = |i: usize| Step {
            allowed: r[i] == 1,
            new_tat: 0,
            remaining: r[i + 1].max(0) as u64,
            reset_us: r[i + 2],
            retry_us: r[i + 3],
        };
        Ok(decision(
            (tenant_q, step(0)),
            key.map(|(_, q)| (q, step(4))),
        ))
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
}
