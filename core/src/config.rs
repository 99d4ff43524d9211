//! Configuration, loaded once at start from `FASTACK_*` environment variables
//! and, optionally, a TOML file named by `FASTACK_CONFIG` (environment wins).
//! Nothing else in the code base reads the environment: this struct is
//! passed down.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    path::PathBuf,
    time::Duration,
};

use fastack_entities::{NodeId, Plan, PlanLimits};

use crate::error::{Error, Result};

/// Every setting, with its environment name, default and meaning. The README
/// configuration table is generated from the same list (`fastack config`).
pub const SETTINGS: &[(&str, &str, &str)] = &[
    (
        "FASTACK_DATABASE_URL",
        "(embedded SQLite)",
        "`postgres://…` switches storage to PostgreSQL; unset uses SQLite under the data dir",
    ),
    (
        "FASTACK_DATA_DIR",
        "./fastack-data",
        "embedded database, bootstrap key and local object storage",
    ),
    (
        "FASTACK_REDIS_URL",
        "(in-process)",
        "`redis://…` moves rate limits to Redis, shared by all nodes",
    ),
    (
        "FASTACK_REDIS_PREFIX",
        "fastack",
        "prefix of every Redis key this deployment writes",
    ),
    (
        "FASTACK_LISTEN",
        "127.0.0.1:8080",
        "tenant API and ops endpoints",
    ),
    (
        "FASTACK_ADMIN_LISTEN",
        "127.0.0.1:8081",
        "admin listener (only started when FASTACK_ADMIN_TOKEN is set)",
    ),
    (
        "FASTACK_ADMIN_TOKEN",
        "(unset: admin listener off)",
        "bearer token of the admin listener; at least 24 characters",
    ),
    (
        "FASTACK_CONSOLE_LISTEN",
        "(unset: console off)",
        "the account console's listener (sign-in pages for tenants' users), e.g. 127.0.0.1:8082",
    ),
    (
        "FASTACK_CONSOLE_URL",
        "http://<FASTACK_CONSOLE_LISTEN>",
        "the console's address as browsers reach it (sign-in links; `https://…` marks cookies Secure)",
    ),
    (
        "FASTACK_HEADER_TIMEOUT_MS",
        "10000",
        "a request's headers must arrive within this, from its first byte",
    ),
    (
        "FASTACK_BODY_TIMEOUT_MS",
        "30000",
        "a request's body must arrive within this (408 `request_timeout`)",
    ),
    (
        "FASTACK_IDLE_TIMEOUT_MS",
        "60000",
        "a keep-alive connection with no request in flight is closed after this",
    ),
    (
        "FASTACK_MAX_CONNECTIONS",
        "4096",
        "open connections per listener; further clients wait in the accept queue",
    ),
    (
        "FASTACK_UNAUTH_RPS",
        "50",
        "requests per second per client address without a valid API key (then 429)",
    ),
    (
        "FASTACK_AMQP_URL",
        "(unset: streaming off)",
        "RabbitMQ for job and event streams",
    ),
    (
        "FASTACK_JOB_EVENTS_EXCHANGE",
        "fastack.job.events",
        "topic exchange of job.completed / job.failed",
    ),
    (
        "FASTACK_CORE_EVENTS_EXCHANGE",
        "fastack.core.events",
        "topic exchange of core.event.tracked",
    ),
    (
        "FASTACK_CLOUDEVENTS_SOURCE",
        "(none)",
        "ce-source of every emitted CloudEvent; required with AMQP",
    ),
    (
        "FASTACK_ENC_KEY",
        "(embedded: generated)",
        "base64 master key (>= 32 bytes) for encryption and HMAC keys",
    ),
    (
        "FASTACK_STORAGE_URL",
        "(data dir)",
        "object storage for exports and archives",
    ),
    (
        "FASTACK_S3_ENDPOINT / _REGION / _ACCESS_KEY_ID / _SECRET_ACCESS_KEY",
        "(none)",
        "S3-compatible storage for `FASTACK_STORAGE_URL=s3://bucket/prefix`",
    ),
    (
        "FASTACK_MIRROR_URL",
        "(unset: mirror off)",
        "Parquet mirror of every event: `s3://bucket/prefix` (with the `FASTACK_S3_*` settings) or `file:///path`",
    ),
    (
        "FASTACK_MIRROR_FLUSH_ROWS",
        "100000",
        "the mirror writes its next files once this many events wait",
    ),
    (
        "FASTACK_MIRROR_FLUSH_SECS",
        "60",
        "… or once the oldest waiting event has waited this long",
    ),
    (
        "FASTACK_SINGLE_TENANT",
        "false",
        "single-tenant deployment: events carry `ce-tenantid: single-tenant`",
    ),
    ("FASTACK_JOB_CONCURRENCY", "2", "jobs a node runs at once"),
    (
        "FASTACK_PARTITION_INTERVAL_MS",
        "3600000",
        "how often partitions are created ahead and retention is scheduled",
    ),
    (
        "FASTACK_REPAIR_INTERVAL_MS",
        "30000",
        "how often the repairer re-emits terminal events whose marker is still set",
    ),
    (
        "FASTACK_PLAN_REFRESH_MS",
        "1000",
        "how often a node reads which tracking plan version is the latest of each tenant",
    ),
    (
        "FASTACK_WEBHOOK_CLAIM_MS",
        "60000",
        "how long a node holds a webhook delivery it is attempting (a node that dies releases it after this)",
    ),
    (
        "FASTACK_WEBHOOK_MAX_CONCURRENCY",
        "64",
        "most requests in flight to one webhook endpoint (the limit adapts below it)",
    ),
    (
        "FASTACK_WEBHOOK_ALLOW_PRIVATE",
        "false",
        "allow webhook endpoints on private/loopback addresses",
    ),
    (
        "FASTACK_WEBHOOK_PROXY",
        "(none: direct)",
        "egress proxy for webhook deliveries; the proxy then enforces which addresses are reachable (environment proxies are ignored)",
    ),
    (
        "FASTACK_NODE_ID",
        "(random per start)",
        "this node's id in processing leases",
    ),
    (
        "FASTACK_BOOTSTRAP",
        "true",
        "on a database without tenants (either backend), one starting node creates tenant `default` and a key, written to `<data dir>/bootstrap-key`",
    ),
    (
        "FASTACK_PROCESSING",
        "true",
        "false makes an accept-only node: it queues events but leaves processing to other nodes",
    ),
    (
        "FASTACK_LOG",
        "info",
        "log filter (tracing EnvFilter syntax)",
    ),
    (
        "FASTACK_KEY_CACHE_TTL_MS",
        "2000",
        "how long a looked-up API key is trusted; bounds revocation delay",
    ),
    (
        "FASTACK_DEPENDENCY_CHECK_MS",
        "15000",
        "how often a node checks its dependencies (database, object storage, the lake, Redis, disk) for `/readyz`",
    ),
    (
        "FASTACK_POLL_INTERVAL_MS",
        "1000",
        "how often a processor checks its tenant's inbox besides being woken",
    ),
    (
        "FASTACK_PROCESS_GATHER_MS",
        "25",
        "a woken processor waits at most this long after its previous round, so many small rounds become fewer bigger ones",
    ),
    (
        "FASTACK_LEASE_TTL_MS",
        "10000",
        "processing lease lifetime; a dead node's tenants move after this",
    ),
    (
        "FASTACK_PROCESS_BATCH",
        "8000",
        "inbox rows a processor handles per transaction",
    ),
    (
        "FASTACK_PROCESS_MAX_ATTEMPTS",
        "5",
        "an event that fails processing this many times moves to quarantine",
    ),
    (
        "FASTACK_TENANT_IDLE_SECS",
        "300",
        "an idle tenant's actors stop after this and restart on demand",
    ),
    (
        "FASTACK_INGEST_BUDGET_MS",
        "1000",
        "`track`, `identify` and `batch` answer within this once their body is read: 202, a 4xx, or 503 `unavailable` with nothing accepted",
    ),
    (
        "FASTACK_INGEST_MAX_ROWS",
        "4000",
        "most rows in one group commit",
    ),
    (
        "FASTACK_INGEST_CONCURRENCY",
        "(PostgreSQL cores/2 in 2..4, SQLite 2)",
        "most group commits in flight at once",
    ),
    (
        "FASTACK_INGEST_SPLIT_ROWS",
        "16",
        "a group commit beyond the first starts only when this many rows wait (0: at once)",
    ),
    (
        "FASTACK_PLAN_<PLAN>_RPS / _BURST / _RETENTION_MONTHS",
        "see Plans",
        "override the plan table (PLAN = FREE, PRO, ENTERPRISE)",
    ),
    (
        "FASTACK_CONFIG",
        "(none)",
        "TOML file with the same settings in lowercase without the prefix",
    ),
];

/// The smallest answer budget: a group commit needs a few round trips
/// inside it, and the accept path keeps a margin for the answer itself.
pub const MIN_INGEST_BUDGET: Duration = Duration::from_millis(250);

/// How and where the node runs. `Debug` prints secrets as `[redacted]`.
#[derive(Clone)]
pub struct Config {
    pub database_url: Option<String>,
    pub data_dir: PathBuf,
    pub redis_url: Option<String>,
    pub redis_prefix: String,
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub admin_token: Option<String>,
    pub console_listen: Option<SocketAddr>,
    pub console_url: Option<String>,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub unauth_rps: u32,
    pub amqp_url: Option<String>,
    pub job_events_exchange: String,
    pub core_events_exchange: String,
    pub cloudevents_source: Option<String>,
    pub enc_key: Option<String>,
    pub storage_url: Option<String>,
    pub s3: S3Settings,
    pub mirror_url: Option<String>,
    pub mirror_flush_rows: u32,
    pub mirror_flush: Duration,
    pub single_tenant: bool,
    pub job_concurrency: usize,
    pub repair_interval: Duration,
    pub plan_refresh_interval: Duration,
    pub partition_interval: Duration,
    pub webhook_allow_private: bool,
    pub webhook_max_concurrency: usize,
    pub webhook_claim: Duration,
    pub webhook_proxy: Option<String>,
    pub node_id: NodeId,
    pub bootstrap: bool,
    pub processing: bool,
    pub log: String,
    pub key_cache_ttl: Duration,
    pub poll_interval: Duration,
    pub dependency_check: Duration,
    pub process_gather: Duration,
    pub lease_ttl: Duration,
    pub process_batch: u32,
    pub process_max_attempts: u32,
    pub tenant_idle: Duration,
    /// The answer budget of the accept path (see `FASTACK_INGEST_BUDGET_MS`).
    pub ingest_budget: Duration,
    pub ingest_max_rows: usize,
    pub ingest_concurrency: Option<usize>,
    pub ingest_split_rows: usize,
    pub plans: PlanTable,
}

/// Credentials of an S3-compatible bucket. `Debug` hides the secret.
#[derive(Clone, Default)]
pub struct S3Settings {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// The environment's `AWS_*` variables (the S3 client's usual chain:
    /// keys, a web identity token, container credentials, a region), read
    /// with the rest of the configuration; the `FASTACK_S3_*` settings win.
    pub aws_environment: Vec<(String, String)>,
}

/// Plan limits in force (defaults overridable per deployment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanTable {
    pub free: PlanLimits,
    pub pro: PlanLimits,
    pub enterprise: PlanLimits,
}

impl Default for PlanTable {
    fn default() -> Self {
        PlanTable {
            free: PlanLimits::default_for(Plan::Free),
            pro: PlanLimits::default_for(Plan::Pro),
            enterprise: PlanLimits::default_for(Plan::Enterprise),
        }
    }
}

impl PlanTable {
    pub fn get(&self, plan: Plan) -> PlanLimits {
        match plan {
            Plan::Free => self.free,
            Plan::Pro => self.pro,
            Plan::Enterprise => self.enterprise,
        }
    }

    /// Months a tenant's events are kept: its own setting, else its plan's.
    pub fn retention_for(&self, tenant: &fastack_entities::Tenant) -> u32 {
        tenant
            .retention_months
            .unwrap_or_else(|| self.get(tenant.plan).retention_months)
    }

    fn get_mut(&mut self, plan: Plan) -> &mut PlanLimits {
        match plan {
            Plan::Free => &mut self.free,
            Plan::Pro => &mut self.pro,
            Plan::Enterprise => &mut self.enterprise,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            database_url: None,
            data_dir: PathBuf::from("./fastack-data"),
            redis_url: None,
            redis_prefix: "fastack".to_owned(),
            listen: "127.0.0.1:8080".parse().expect("static address"),
            admin_listen: "127.0.0.1:8081".parse().expect("static address"),
            admin_token: None,
            console_listen: None,
            console_url: None,
            header_timeout: Duration::from_millis(10_000),
            body_timeout: Duration::from_millis(30_000),
            idle_timeout: Duration::from_millis(60_000),
            max_connections: 4096,
            unauth_rps: 50,
            amqp_url: None,
            job_events_exchange: "fastack.job.events".to_owned(),
            core_events_exchange: "fastack.core.events".to_owned(),
            cloudevents_source: None,
            enc_key: None,
            storage_url: None,
            s3: S3Settings::default(),
            mirror_url: None,
            mirror_flush_rows: 100_000,
            mirror_flush: Duration::from_secs(60),
            single_tenant: false,
            job_concurrency: 2,
            repair_interval: Duration::from_millis(30_000),
            plan_refresh_interval: Duration::from_millis(1_000),
            partition_interval: Duration::from_millis(3_600_000),
            webhook_allow_private: false,
            webhook_max_concurrency: 64,
            webhook_claim: Duration::from_millis(60_000),
            webhook_proxy: None,
            node_id: NodeId::new(),
            bootstrap: true,
            processing: true,
            log: "info".to_owned(),
            key_cache_ttl: Duration::from_millis(2_000),
            poll_interval: Duration::from_millis(1_000),
            dependency_check: Duration::from_millis(15_000),
            process_gather: Duration::from_millis(25),
            lease_ttl: Duration::from_millis(10_000),
            process_batch: 8_000,
            process_max_attempts: 5,
            tenant_idle: Duration::from_secs(300),
            ingest_budget: Duration::from_millis(1_000),
            ingest_max_rows: 4_000,
            ingest_concurrency: None,
            ingest_split_rows: 16,
            plans: PlanTable::default(),
        }
    }
}

impl Config {
    /// Where browsers reach the console (the base of its sign-in links).
    pub fn console_base_url(&self) -> String {
        match (&self.console_url, self.console_listen) {
            (Some(url), _) => url.clone(),
            (None, Some(addr)) => format!("http://{addr}"),
            (None, None) => "http://127.0.0.1:8082".to_owned(),
        }
    }

    /// Whether the console's cookies must only travel over TLS.
    pub fn console_secure_cookies(&self) -> bool {
        self.console_base_url().starts_with("https://")
    }

    /// Reads the process environment. Call once, in `main`.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(std::env::vars())
    }

    /// Builds a configuration from `FASTACK_*` variables (and the TOML file
    /// that `FASTACK_CONFIG` names, if any). Unknown `FASTACK_` variables are
    /// an error: a typo must not silently fall back to a default.
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Result<Self> {
        let vars: Vec<(String, String)> = vars.into_iter().collect();
        let aws_environment = vars
            .iter()
            .filter(|(k, _)| k.starts_with("AWS_"))
            .cloned()
            .collect();
        let merged = merged(vars)?;
        let mut cfg = Config::default();
        cfg.s3.aws_environment = aws_environment;
        for (key, (value, origin)) in merged {
            if !cfg.apply(&key, value).map_err(|e| origin.qualify(e))? {
                return Err(unknown_setting(&key, &origin));
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// What `fastack config` prints: each documented setting, its default,
    /// and the values in force with where each came from (the environment
    /// or the file `FASTACK_CONFIG` names); secrets are shown as set, not
    /// by value. An invalid configuration is the error `serve` would give.
    pub fn in_force(vars: impl IntoIterator<Item = (String, String)>) -> Result<Vec<InForce>> {
        let vars: Vec<(String, String)> = vars.into_iter().collect();
        Config::from_vars(vars.clone())?;
        let merged = merged(vars)?;
        let mut out = Vec::new();
        for (entry, default, meaning) in SETTINGS {
            let family = family_names(entry);
            let set = family
                .iter()
                .filter_map(|name| {
                    let (value, origin) = merged.get(name)?;
                    Some(SetValue {
                        name: name.clone(),
                        shown: shown(name, value),
                        source: match origin {
                            Origin::Env => "environment".to_owned(),
                            Origin::File { path, .. } => format!("file {path}"),
                        },
                    })
                })
                .collect();
            out.push(InForce {
                setting: entry,
                default,
                meaning,
                set,
            });
        }
        Ok(out)
    }
}

/// One documented setting (or family) and what is in force.
#[derive(Debug)]
pub struct InForce {
    pub setting: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
    /// The family's variables that are set; empty: the default is in force.
    pub set: Vec<SetValue>,
}

/// A variable that is set, and where.
#[derive(Debug)]
pub struct SetValue {
    pub name: String,
    /// The value, or `(set)` for a secret; a URL's password is hidden.
    pub shown: String,
    /// `environment` or `file <path>`.
    pub source: String,
}

/// A value as `fastack config` may print it.
fn shown(name: &str, value: &str) -> String {
    let secret = ["_TOKEN", "_SECRET", "_PASSWORD", "_MASTER_KEY", "_HMAC_KEY"]
        .iter()
        .any(|s| name.ends_with(s));
    if secret {
        return "(set)".to_owned();
    }
    // `scheme://user:password@host`: the password goes.
    if let Some((scheme, rest)) = value.split_once("://")
        && let Some((userinfo, host)) = rest.split_once('@')
        && let Some((user, _)) = userinfo.split_once(':')
    {
        return format!("{scheme}://{user}:***@{host}");
    }
    value.to_owned()
}

/// Every value given, by variable name, with where it was written: the
/// environment wins over the file `FASTACK_CONFIG` names.
fn merged(
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<BTreeMap<String, (String, Origin)>> {
    let env: HashMap<String, String> = vars
        .into_iter()
        .filter(|(k, _)| k.starts_with("FASTACK_") && !is_tooling(k))
        .collect();
    // Each value with where it came from, so an error names what the
    // user wrote: the file's own key, or the variable.
    let mut merged: BTreeMap<String, (String, Origin)> = BTreeMap::new();
    if let Some(path) = env.get("FASTACK_CONFIG") {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path.clone(), e))?;
        let table: toml::Table =
            toml::from_str(&text).map_err(|e| Error::Config(format!("{path}: {e}")))?;
        for (key, value) in table {
            let value = match value {
                toml::Value::String(s) => s,
                other => other.to_string(),
            };
            let name = format!("FASTACK_{}", key.to_ascii_uppercase());
            let origin = Origin::File {
                path: path.clone(),
                key,
            };
            merged.insert(name, (value, origin));
        }
    }
    merged.extend(env.into_iter().map(|(k, v)| (k, (v, Origin::Env))));
    merged.remove("FASTACK_CONFIG");
    Ok(merged)
}

impl Config {
    /// Sets one setting; `Ok(false)` when `key` names none.
    fn apply(&mut self, key: &str, value: String) -> Result<bool> {
        let non_empty = |v: String| if v.trim().is_empty() { None } else { Some(v) };
        match key {
            "FASTACK_DATABASE_URL" => self.database_url = non_empty(value),
            "FASTACK_DATA_DIR" => self.data_dir = PathBuf::from(value),
            "FASTACK_REDIS_URL" => self.redis_url = non_empty(value),
            "FASTACK_REDIS_PREFIX" => self.redis_prefix = value,
            "FASTACK_LISTEN" => self.listen = parse(key, &value)?,
            "FASTACK_ADMIN_LISTEN" => self.admin_listen = parse(key, &value)?,
            "FASTACK_ADMIN_TOKEN" => self.admin_token = non_empty(value),
            "FASTACK_CONSOLE_LISTEN" => {
                self.console_listen = match non_empty(value) {
                    Some(v) => Some(parse(key, &v)?),
                    None => None,
                }
            }
            "FASTACK_CONSOLE_URL" => {
                self.console_url = non_empty(value).map(|v| v.trim_end_matches('/').to_owned())
            }
            "FASTACK_HEADER_TIMEOUT_MS" => self.header_timeout = millis(key, &value)?,
            "FASTACK_BODY_TIMEOUT_MS" => self.body_timeout = millis(key, &value)?,
            "FASTACK_IDLE_TIMEOUT_MS" => self.idle_timeout = millis(key, &value)?,
            "FASTACK_MAX_CONNECTIONS" => self.max_connections = parse(key, &value)?,
            "FASTACK_UNAUTH_RPS" => self.unauth_rps = parse(key, &value)?,
            "FASTACK_AMQP_URL" => self.amqp_url = non_empty(value),
            "FASTACK_JOB_EVENTS_EXCHANGE" => self.job_events_exchange = value,
            "FASTACK_CORE_EVENTS_EXCHANGE" => self.core_events_exchange = value,
            "FASTACK_CLOUDEVENTS_SOURCE" => self.cloudevents_source = non_empty(value),
            "FASTACK_ENC_KEY" => self.enc_key = non_empty(value),
            "FASTACK_STORAGE_URL" => self.storage_url = non_empty(value),
            "FASTACK_S3_ENDPOINT" => self.s3.endpoint = non_empty(value),
            "FASTACK_S3_REGION" => self.s3.region = non_empty(value),
            "FASTACK_S3_ACCESS_KEY_ID" => self.s3.access_key_id = non_empty(value),
            "FASTACK_S3_SECRET_ACCESS_KEY" => self.s3.secret_access_key = non_empty(value),
            "FASTACK_MIRROR_URL" => self.mirror_url = non_empty(value),
            "FASTACK_MIRROR_FLUSH_ROWS" => self.mirror_flush_rows = parse(key, &value)?,
            "FASTACK_MIRROR_FLUSH_SECS" => {
                self.mirror_flush = Duration::from_secs(parse(key, &value)?)
            }
            "FASTACK_SINGLE_TENANT" => self.single_tenant = parse_bool(key, &value)?,
            "FASTACK_JOB_CONCURRENCY" => self.job_concurrency = parse(key, &value)?,
            "FASTACK_REPAIR_INTERVAL_MS" => self.repair_interval = millis(key, &value)?,
            "FASTACK_PLAN_REFRESH_MS" => self.plan_refresh_interval = millis(key, &value)?,
            "FASTACK_PARTITION_INTERVAL_MS" => self.partition_interval = millis(key, &value)?,
            "FASTACK_WEBHOOK_ALLOW_PRIVATE" => {
                self.webhook_allow_private = parse_bool(key, &value)?
            }
            "FASTACK_WEBHOOK_PROXY" => self.webhook_proxy = non_empty(value),
            "FASTACK_WEBHOOK_MAX_CONCURRENCY" => self.webhook_max_concurrency = parse(key, &value)?,
            "FASTACK_WEBHOOK_CLAIM_MS" => self.webhook_claim = millis(key, &value)?,
            "FASTACK_NODE_ID" => self.node_id = parse(key, &value)?,
            "FASTACK_BOOTSTRAP" => self.bootstrap = parse_bool(key, &value)?,
            "FASTACK_PROCESSING" => self.processing = parse_bool(key, &value)?,
            "FASTACK_LOG" => self.log = value,
            "FASTACK_KEY_CACHE_TTL_MS" => self.key_cache_ttl = millis(key, &value)?,
            "FASTACK_POLL_INTERVAL_MS" => self.poll_interval = millis(key, &value)?,
            "FASTACK_DEPENDENCY_CHECK_MS" => self.dependency_check = millis(key, &value)?,
            "FASTACK_PROCESS_GATHER_MS" => self.process_gather = millis(key, &value)?,
            "FASTACK_LEASE_TTL_MS" => self.lease_ttl = millis(key, &value)?,
            "FASTACK_PROCESS_BATCH" => self.process_batch = parse(key, &value)?,
            "FASTACK_PROCESS_MAX_ATTEMPTS" => self.process_max_attempts = parse(key, &value)?,
            "FASTACK_TENANT_IDLE_SECS" => {
                self.tenant_idle = Duration::from_secs(parse(key, &value)?)
            }
            "FASTACK_INGEST_BUDGET_MS" => self.ingest_budget = millis(key, &value)?,
            "FASTACK_INGEST_MAX_ROWS" => self.ingest_max_rows = parse(key, &value)?,
            "FASTACK_INGEST_CONCURRENCY" => self.ingest_concurrency = Some(parse(key, &value)?),
            "FASTACK_INGEST_SPLIT_ROWS" => self.ingest_split_rows = parse(key, &value)?,
            other => {
                if let Some(rest) = other.strip_prefix("FASTACK_PLAN_") {
                    return self.apply_plan(key, rest, &value);
                }
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn apply_plan(&mut self, key: &str, rest: &str, value: &str) -> Result<bool> {
        let Some((plan, field)) = rest.split_once('_') else {
            return Ok(false);
        };
        let plan: Plan = plan
            .to_ascii_lowercase()
            .parse()
            .map_err(|e: fastack_entities::UnknownPlan| Error::Config(format!("{key}: {e}")))?;
        let limits = self.plans.get_mut(plan);
        match field {
            "RPS" => limits.rate_per_sec = parse(key, value)?,
            "BURST" => limits.burst = parse(key, value)?,
            "RETENTION_MONTHS" => limits.retention_months = parse(key, value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn validate(&self) -> Result<()> {
        if let Some(url) = &self.database_url
            && !(url.starts_with("postgres://")
                || url.starts_with("postgresql://")
                || url.starts_with("sqlite:"))
        {
            return Err(Error::Config(
                "FASTACK_DATABASE_URL must start with postgres://, postgresql:// or sqlite:"
                    .to_owned(),
            ));
        }
        for plan in Plan::ALL {
            let limits = self.plans.get(plan);
            if limits.rate_per_sec == 0 || limits.burst == 0 || limits.retention_months == 0 {
                return Err(Error::Config(format!(
                    "plan {plan}: rate, burst and retention must be positive"
                )));
            }
        }
        if self.ingest_budget < MIN_INGEST_BUDGET {
            return Err(Error::Config(format!(
                "FASTACK_INGEST_BUDGET_MS must be at least {} (the group commit needs room \
                 inside it)",
                MIN_INGEST_BUDGET.as_millis()
            )));
        }
        if let Some(url) = &self.mirror_url
            && !(url.starts_with("s3://") || url.starts_with("file://"))
        {
            return Err(Error::Config(
                "FASTACK_MIRROR_URL must start with s3:// (a bucket and prefix) or file:// (a directory)"
                    .to_owned(),
            ));
        }
        if self.dependency_check < Duration::from_millis(100) {
            return Err(Error::Config(
                "FASTACK_DEPENDENCY_CHECK_MS must be at least 100".to_owned(),
            ));
        }
        if self.process_batch == 0 || self.ingest_max_rows == 0 || self.mirror_flush_rows == 0 {
            return Err(Error::Config("batch sizes must be positive".to_owned()));
        }
        if self.process_max_attempts == 0 || self.max_connections == 0 || self.unauth_rps == 0 {
            return Err(Error::Config(
                "FASTACK_PROCESS_MAX_ATTEMPTS, FASTACK_MAX_CONNECTIONS and FASTACK_UNAUTH_RPS must be positive"
                    .to_owned(),
            ));
        }
        if let Some(token) = &self.admin_token
            && token.chars().count() < MIN_ADMIN_TOKEN_CHARS
        {
            return Err(Error::Config(format!(
                "FASTACK_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN_CHARS} characters \
                 (e.g. `head -c 24 /dev/urandom | base64`)"
            )));
        }
        Ok(())
    }

    /// With AMQP configured, the event contract needs exchange names and a
    /// CloudEvents source: a node refuses to start without them.
    pub fn check_streaming(&self) -> Result<()> {
        if self.amqp_url.is_none() {
            return Ok(());
        }
        if self.job_events_exchange.trim().is_empty() || self.core_events_exchange.trim().is_empty()
        {
            return Err(Error::Config(
                "FASTACK_AMQP_URL is set but FASTACK_JOB_EVENTS_EXCHANGE or FASTACK_CORE_EVENTS_EXCHANGE is empty"
                    .to_owned(),
            ));
        }
        if self
            .cloudevents_source
            .as_deref()
            .is_none_or(|s| s.trim().is_empty())
        {
            return Err(Error::Config(
                "FASTACK_AMQP_URL is set but FASTACK_CLOUDEVENTS_SOURCE is empty: job events need a ce-source"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    /// Embedded mode: SQLite under the data dir, in-process rate limits.
    pub fn is_embedded(&self) -> bool {
        self.database_url
            .as_deref()
            .is_none_or(|url| url.starts_with("sqlite:"))
    }

    pub fn sqlite_path(&self) -> PathBuf {
        match self
            .database_url
            .as_deref()
            .and_then(|u| u.strip_prefix("sqlite:"))
        {
            Some(path) => PathBuf::from(path.trim_start_matches("//")),
            None => self.data_dir.join("fastack.db"),
        }
    }
}

/// Variables of fastack's own tooling, not settings of a node: the test
/// harnesses' (`FASTACK_TEST_*`) and the SDK suites' binary path
/// (`FASTACK_BIN`). A node ignores them, so a shell or CI job that exports
/// them can still run `fastack`.
/// Where a setting's value was written.
enum Origin {
    Env,
    File { path: String, key: String },
}

impl Origin {
    /// A value error of a file's key names the file and the key as written.
    fn qualify(&self, e: Error) -> Error {
        match (self, e) {
            (Origin::File { path, key }, Error::Config(msg)) => {
                Error::Config(format!("{path}: `{key}`: {msg}"))
            }
            (_, e) => e,
        }
    }
}

/// Every concrete setting name (`SETTINGS` lists some as families).
fn known_names() -> Vec<String> {
    SETTINGS
        .iter()
        .flat_map(|(entry, _, _)| family_names(entry))
        .collect()
}

/// The concrete names of one `SETTINGS` entry (`A_X / _Y` is `A_X`, `A_Y`;
/// `<PLAN>` is each plan).
fn family_names(entry: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut parts = entry.split(" / ");
    let Some(first) = parts.next() else {
        return names;
    };
    let base = first.rsplit_once('_').map_or(first, |(b, _)| b);
    let family: Vec<String> = std::iter::once(first.to_owned())
        .chain(parts.map(|suffix| format!("{base}{suffix}")))
        .collect();
    for name in family {
        if name.contains("<PLAN>") {
            for plan in Plan::ALL {
                names.push(name.replace("<PLAN>", &plan.to_string().to_ascii_uppercase()));
            }
        } else {
            names.push(name);
        }
    }
    names
}

/// The known name closest to `name`, when one is close enough to be a typo.
fn closest(name: &str) -> Option<String> {
    let known = known_names();
    crate::validate::closest(name, known.iter().map(String::as_str)).map(str::to_owned)
}

fn unknown_setting(name: &str, origin: &Origin) -> Error {
    match origin {
        Origin::Env => {
            let hint = closest(name)
                .map(|known| format!(" (did you mean {known}?)"))
                .unwrap_or_default();
            Error::Config(format!(
                "unknown setting {name}{hint}; `fastack config` lists every setting"
            ))
        }
        Origin::File { path, key } => {
            let as_file_key =
                |known: &str| known.trim_start_matches("FASTACK_").to_ascii_lowercase();
            let hint = match key.to_ascii_uppercase().strip_prefix("FASTACK_") {
                // `FASTACK_LISTEN = …` in the file: the prefix is the mistake.
                Some(rest)
                    if known_names()
                        .iter()
                        .any(|k| k.trim_start_matches("FASTACK_") == rest) =>
                {
                    format!(
                        " (keys in the file are written without the FASTACK_ prefix: `{}`)",
                        rest.to_ascii_lowercase()
                    )
                }
                _ => closest(name)
                    .map(|known| format!(" (did you mean `{}`?)", as_file_key(&known)))
                    .unwrap_or_default(),
            };
            Error::Config(format!(
                "{path}: unknown setting `{key}`{hint}; `fastack config` lists every setting \
                 (in the file: lowercase, without FASTACK_)"
            ))
        }
    }
}

fn is_tooling(name: &str) -> bool {
    name == "FASTACK_BIN" || name.starts_with("FASTACK_TEST_")
}

/// The admin token guards every tenant; a short one is guessable.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 24;

const REDACTED: &str = "[redacted]";

/// A URL with its password (if any) replaced, for logs and `Debug`.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some(REDACTED));
            u.to_string()
        }
        Ok(u) => u.to_string(),
        Err(_) => REDACTED.to_owned(),
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret = |v: &Option<String>| v.as_ref().map(|_| REDACTED);
        let url = |v: &Option<String>| v.as_deref().map(redact_url);
        f.debug_struct("Config")
            .field("database_url", &url(&self.database_url))
            .field("data_dir", &self.data_dir)
            .field("redis_url", &url(&self.redis_url))
            .field("redis_prefix", &self.redis_prefix)
            .field("listen", &self.listen)
            .field("admin_listen", &self.admin_listen)
            .field("admin_token", &secret(&self.admin_token))
            .field("console_listen", &self.console_listen)
            .field("console_url", &self.console_url)
            .field("header_timeout", &self.header_timeout)
            .field("body_timeout", &self.body_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_connections", &self.max_connections)
            .field("unauth_rps", &self.unauth_rps)
            .field("amqp_url", &url(&self.amqp_url))
            .field("job_events_exchange", &self.job_events_exchange)
            .field("core_events_exchange", &self.core_events_exchange)
            .field("cloudevents_source", &self.cloudevents_source)
            .field("enc_key", &secret(&self.enc_key))
            .field("storage_url", &self.storage_url)
            .field("s3", &self.s3)
            .field("single_tenant", &self.single_tenant)
            .field("job_concurrency", &self.job_concurrency)
            .field("repair_interval", &self.repair_interval)
            .field("plan_refresh_interval", &self.plan_refresh_interval)
            .field("partition_interval", &self.partition_interval)
            .field("webhook_allow_private", &self.webhook_allow_private)
            .field("webhook_max_concurrency", &self.webhook_max_concurrency)
            .field("webhook_claim", &self.webhook_claim)
            .field(
                "webhook_proxy",
                &self.webhook_proxy.as_deref().map(redact_url),
            )
            .field("node_id", &self.node_id)
            .field("bootstrap", &self.bootstrap)
            .field("processing", &self.processing)
            .field("log", &self.log)
            .field("key_cache_ttl", &self.key_cache_ttl)
            .field("poll_interval", &self.poll_interval)
            .field("dependency_check", &self.dependency_check)
            .field("process_gather", &self.process_gather)
            .field("lease_ttl", &self.lease_ttl)
            .field("process_batch", &self.process_batch)
            .field("process_max_attempts", &self.process_max_attempts)
            .field("tenant_idle", &self.tenant_idle)
            .field("ingest_budget", &self.ingest_budget)
            .field("ingest_max_rows", &self.ingest_max_rows)
            .field("ingest_concurrency", &self.ingest_concurrency)
            .field("ingest_split_rows", &self.ingest_split_rows)
            .field("plans", &self.plans)
            .finish()
    }
}

impl std::fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| REDACTED),
            )
            .field(
                "aws_environment",
                &self
                    .aws_environment
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

fn parse<T: std::str::FromStr>(key: &str, value: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    value
        .trim()
        .parse()
        .map_err(|e| Error::Config(format!("{key}={value:?}: {e}")))
}

fn parse_bool(key: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(Error::Config(format!(
            "{key}={value:?}: expected true or false"
        ))),
    }
}

fn millis(key: &str, value: &str) -> Result<Duration> {
    Ok(Duration::from_millis(parse(key, value)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn in_force_says_where_each_value_came_from_and_hides_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fastack.toml");
        std::fs::write(&file, "listen = \"127.0.0.1:7777\"\nplan_pro_rps = 50\n").unwrap();
        let rows = Config::in_force(vars(&[
            ("FASTACK_CONFIG", file.to_str().unwrap()),
            ("FASTACK_LISTEN", "127.0.0.1:9999"),
            ("FASTACK_ADMIN_TOKEN", "an-admin-token-of-enough-length"),
            ("FASTACK_DATABASE_URL", "postgres://app:hunter2@db:5432/x"),
        ]))
        .unwrap();
        let row = |name: &str| rows.iter().find(|r| r.setting.starts_with(name)).unwrap();
        let listen = &row("FASTACK_LISTEN").set[0];
        assert_eq!(
            (listen.shown.as_str(), listen.source.as_str()),
            ("127.0.0.1:9999", "environment")
        );
        let plan = &row("FASTACK_PLAN_<PLAN>_RPS").set[0];
        assert_eq!(plan.name, "FASTACK_PLAN_PRO_RPS");
        assert_eq!(plan.source, format!("file {}", file.display()));
        assert_eq!(row("FASTACK_ADMIN_TOKEN").set[0].shown, "(set)");
        assert_eq!(
            row("FASTACK_DATABASE_URL").set[0].shown,
            "postgres://app:***@db:5432/x"
        );
        assert!(
            row("FASTACK_DATA_DIR").set.is_empty(),
            "the default is in force"
        );
        // An invalid configuration is the error serve would give.
        assert!(Config::in_force(vars(&[("FASTACK_LISTN", "x")])).is_err());
    }

    #[test]
    fn defaults_are_embedded() {
        let cfg = Config::from_vars(vars(&[("PATH", "/bin")])).unwrap();
        assert!(cfg.is_embedded());
        assert_eq!(cfg.listen.port(), 8080);
        assert_eq!(
            cfg.sqlite_path(),
            PathBuf::from("./fastack-data/fastack.db")
        );
        assert_eq!(cfg.plans.free.rate_per_sec, 100);
    }

    #[test]
    fn env_overrides_and_plan_table() {
        let cfg = Config::from_vars(vars(&[
            ("FASTACK_DATABASE_URL", "postgres://localhost/x"),
            ("FASTACK_PLAN_PRO_RPS", "3000"),
            ("FASTACK_PLAN_ENTERPRISE_RETENTION_MONTHS", "48"),
            ("FASTACK_WEBHOOK_ALLOW_PRIVATE", "true"),
        ]))
        .unwrap();
        assert!(!cfg.is_embedded());
        assert_eq!(cfg.plans.pro.rate_per_sec, 3000);
        assert_eq!(cfg.plans.enterprise.retention_months, 48);
        assert!(cfg.webhook_allow_private);
    }

    #[test]
    fn streaming_needs_exchange_and_source() {
        let amqp = ("FASTACK_AMQP_URL", "amqp://localhost");
        let cfg = Config::from_vars(vars(&[amqp])).unwrap();
        assert!(
            cfg.check_streaming()
                .unwrap_err()
                .to_string()
                .contains("FASTACK_CLOUDEVENTS_SOURCE")
        );
        let cfg = Config::from_vars(vars(&[
            amqp,
            ("FASTACK_CLOUDEVENTS_SOURCE", "//x"),
            ("FASTACK_JOB_EVENTS_EXCHANGE", ""),
        ]))
        .unwrap();
        assert!(
            cfg.check_streaming()
                .unwrap_err()
                .to_string()
                .contains("EXCHANGE")
        );
        let cfg = Config::from_vars(vars(&[amqp, ("FASTACK_CLOUDEVENTS_SOURCE", "//x")])).unwrap();
        assert!(cfg.check_streaming().is_ok());
        assert!(
            Config::from_vars(vars(&[]))
                .unwrap()
                .check_streaming()
                .is_ok()
        );
    }

    #[test]
    fn typos_and_bad_values_are_errors() {
        // Tooling variables are not settings (and not typos).
        assert!(
            Config::from_vars(vars(&[
                ("FASTACK_BIN", "/x/fastack"),
                ("FASTACK_TEST_REQUIRE_SERVICES", "1")
            ]))
            .is_ok()
        );
        let err = Config::from_vars(vars(&[("FASTACK_LISTN", "x")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: unknown setting FASTACK_LISTN (did you mean FASTACK_LISTEN?); \
             `fastack config` lists every setting"
        );
        let err = Config::from_vars(vars(&[("FASTACK_PLAN_PRO_BRUST", "1")])).unwrap_err();
        assert!(
            err.to_string()
                .contains("did you mean FASTACK_PLAN_PRO_BURST?"),
            "{err}"
        );
        let err = Config::from_vars(vars(&[("FASTACK_S3_REGON", "x")])).unwrap_err();
        assert!(
            err.to_string().contains("did you mean FASTACK_S3_REGION?"),
            "{err}"
        );
        let err = Config::from_vars(vars(&[("FASTACK_WHATEVER_ELSE", "1")])).unwrap_err();
        assert!(!err.to_string().contains("did you mean"), "{err}");
        let err = Config::from_vars(vars(&[("FASTACK_LISTEN", "nope")])).unwrap_err();
        assert!(err.to_string().contains("FASTACK_LISTEN"));
        let err = Config::from_vars(vars(&[("FASTACK_DATABASE_URL", "mysql://x")])).unwrap_err();
        assert!(err.to_string().contains("must start with"));
    }

    #[test]
    fn a_config_file_error_names_the_file_and_its_own_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fastack.toml");
        let path = file.display().to_string();
        let from_file = |text: &str| {
            std::fs::write(&file, text).unwrap();
            Config::from_vars(vars(&[("FASTACK_CONFIG", &path)]))
                .unwrap_err()
                .to_string()
        };
        let err = from_file("listn = \"127.0.0.1:9090\"\n");
        assert!(
            err.contains(&format!(
                "{path}: unknown setting `listn` (did you mean `listen`?)"
            )),
            "{err}"
        );
        let err = from_file("FASTACK_LISTEN = \"127.0.0.1:9090\"\n");
        assert!(
            err.contains("unknown setting `FASTACK_LISTEN` (keys in the file are written without the FASTACK_ prefix: `listen`)"),
            "{err}"
        );
        assert!(!err.contains("FASTACK_FASTACK"), "{err}");
        let err = from_file("listen = \"nope\"\n");
        assert!(err.contains(&format!("{path}: `listen`:")), "{err}");
        std::fs::write(&file, "listen = \"127.0.0.1:9090\"\n").unwrap();
        let cfg = Config::from_vars(vars(&[("FASTACK_CONFIG", &path)])).unwrap();
        assert_eq!(cfg.listen.port(), 9090);
    }

    #[test]
    fn debug_never_shows_secrets_and_short_admin_tokens_are_refused() {
        let cfg = Config::from_vars(vars(&[
            (
                "FASTACK_DATABASE_URL",
                "postgres://app:pg-pass-123@db/fastack",
            ),
            ("FASTACK_REDIS_URL", "redis://:redis-pass-456@cache:6379"),
            ("FASTACK_ADMIN_TOKEN", "admin-token-abcdefghijklmnop"),
            (
                "FASTACK_ENC_KEY",
                "ZmFzdGFjay10ZXN0LW1hc3Rlci1rZXktMzItYnl0ZXMh",
            ),
            ("FASTACK_S3_SECRET_ACCESS_KEY", "s3-secret-789"),
        ]))
        .unwrap();
        let shown = format!("{cfg:?}");
        for secret in [
            "pg-pass-123",
            "redis-pass-456",
            "admin-token-abcdefghijklmnop",
            "ZmFzdGFjay10ZXN0",
            "s3-secret-789",
        ] {
            assert!(!shown.contains(secret), "{secret} leaked: {shown}");
        }
        assert!(shown.contains("[redacted]"));
        assert!(shown.contains("db/fastack"));
        let err = Config::from_vars(vars(&[("FASTACK_ADMIN_TOKEN", "short")])).unwrap_err();
        assert!(err.to_string().contains("at least 24"), "{err}");
    }

    #[test]
    fn toml_file_is_read_and_env_wins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fastack.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:9000\"\nredis_prefix = \"file\"\n",
        )
        .unwrap();
        let cfg = Config::from_vars(vars(&[
            ("FASTACK_CONFIG", path.to_str().unwrap()),
            ("FASTACK_REDIS_PREFIX", "env"),
        ]))
        .unwrap();
        assert_eq!(cfg.listen.port(), 9000);
        assert_eq!(cfg.redis_prefix, "env");
    }
}
