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

pub use crate::settings::redact_url;
use crate::{
    error::{Error, Result},
    settings::{self, AnySection, Extension, Section, Sections, SettingDoc, check, parse},
};

/// The smallest answer budget: a group commit needs a few round trips
/// inside it, and the accept path keeps a margin for the answer itself.
pub const MIN_INGEST_BUDGET: Duration = Duration::from_millis(250);

/// The admin token guards every tenant; a short one is guessable.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 24;

crate::settings! {
    /// How and where the node runs: every setting of the product except
    /// those a sink declares in its own file (loaded with these, see
    /// [`Config::load`]). `Debug` prints secrets as `[redacted]`.
    pub struct Config {
        /// `postgres://…` switches storage to PostgreSQL; unset uses SQLite under the data dir
        pub database_url: Option<String> = "FASTACK_DATABASE_URL" {
            default: "",
            shown: "(embedded SQLite)",
            parse: parse::optional_text,
            check: database_url,
            show: url,
        },
        /// embedded database, bootstrap key and local object storage
        pub data_dir: PathBuf = "FASTACK_DATA_DIR" {
            default: "./fastack-data",
            parse: parse::path,
        },
        /// `redis://…` moves rate limits to Redis, shared by all nodes
        pub redis_url: Option<String> = "FASTACK_REDIS_URL" {
            default: "",
            shown: "(in-process)",
            parse: parse::optional_text,
            show: url,
        },
        /// prefix of every Redis key this deployment writes
        pub redis_prefix: String = "FASTACK_REDIS_PREFIX" {
            default: "fastack",
            parse: parse::text,
        },
        /// tenant API and ops endpoints
        pub listen: SocketAddr = "FASTACK_LISTEN" {
            default: "127.0.0.1:8080",
            parse: parse::from_str,
        },
        /// admin listener (only started when FASTACK_ADMIN_TOKEN is set)
        pub admin_listen: SocketAddr = "FASTACK_ADMIN_LISTEN" {
            default: "127.0.0.1:8081",
            parse: parse::from_str,
        },
        /// bearer token of the admin listener; at least 24 characters
        pub admin_token: Option<String> = "FASTACK_ADMIN_TOKEN" {
            default: "",
            shown: "(unset: admin listener off)",
            parse: parse::optional_text,
            check: admin_token,
            show: secret,
        },
        /// the account console's listener (sign-in pages for tenants' users), e.g. 127.0.0.1:8082
        pub console_listen: Option<SocketAddr> = "FASTACK_CONSOLE_LISTEN" {
            default: "",
            shown: "(unset: console off)",
            parse: parse::optional,
        },
        /// the console's address as browsers reach it (sign-in links; `https://…` marks cookies Secure)
        pub console_url: Option<String> = "FASTACK_CONSOLE_URL" {
            default: "",
            shown: "http://<FASTACK_CONSOLE_LISTEN>",
            parse: |v: &str| {
                parse::optional_text(v).map(|u| u.map(|u| u.trim_end_matches('/').to_owned()))
            },
        },
        /// a request's headers must arrive within this, from its first byte
        pub header_timeout: Duration = "FASTACK_HEADER_TIMEOUT_MS" {
            default: "10000",
            parse: parse::millis,
        },
        /// a request's body must arrive within this (408 `request_timeout`)
        pub body_timeout: Duration = "FASTACK_BODY_TIMEOUT_MS" {
            default: "30000",
            parse: parse::millis,
        },
        /// a keep-alive connection with no request in flight is closed after this
        pub idle_timeout: Duration = "FASTACK_IDLE_TIMEOUT_MS" {
            default: "60000",
            parse: parse::millis,
        },
        /// open connections per listener; further clients wait in the accept queue
        pub max_connections: usize = "FASTACK_MAX_CONNECTIONS" {
            default: "4096",
            parse: parse::from_str,
            check: check::positive,
        },
        /// requests per second per client address without a valid API key (then 429)
        pub unauth_rps: u32 = "FASTACK_UNAUTH_RPS" {
            default: "50",
            parse: parse::from_str,
            check: check::positive,
        },
        /// base64 master key (>= 32 bytes) for encryption and HMAC keys
        pub enc_key: Option<String> = "FASTACK_ENC_KEY" {
            default: "",
            shown: "(embedded: generated)",
            parse: parse::optional_text,
            show: secret,
        },
        /// object storage for exports and archives
        pub storage_url: Option<String> = "FASTACK_STORAGE_URL" {
            default: "",
            shown: "(data dir)",
            parse: parse::optional_text,
        },
        /// single-tenant deployment: events carry `ce-tenantid: single-tenant`
        pub single_tenant: bool = "FASTACK_SINGLE_TENANT" {
            default: "false",
            parse: parse::boolean,
        },
        /// jobs a node runs at once
        pub job_concurrency: usize = "FASTACK_JOB_CONCURRENCY" {
            default: "2",
            parse: parse::from_str,
        },
        /// how often partitions are created ahead and retention is scheduled
        pub partition_interval: Duration = "FASTACK_PARTITION_INTERVAL_MS" {
            default: "3600000",
            parse: parse::millis,
        },
        /// how often the repairer re-emits terminal events whose marker is still set
        pub repair_interval: Duration = "FASTACK_REPAIR_INTERVAL_MS" {
            default: "30000",
            parse: parse::millis,
        },
        /// how often a node reads which tracking plan version is the latest of each tenant
        pub plan_refresh_interval: Duration = "FASTACK_PLAN_REFRESH_MS" {
            default: "1000",
            parse: parse::millis,
        },
        /// this node's id in processing leases
        pub node_id: NodeId = "FASTACK_NODE_ID" {
            default: "",
            shown: "(random per start)",
            parse: |v: &str| {
                if v.trim().is_empty() { Ok(NodeId::new()) } else { parse::from_str(v) }
            },
        },
        /// on a database without tenants (either backend), one starting node creates tenant `default` and a key, written to `<data dir>/bootstrap-key`
        pub bootstrap: bool = "FASTACK_BOOTSTRAP" {
            default: "true",
            parse: parse::boolean,
        },
        /// false makes an accept-only node: it queues events but leaves processing to other nodes
        pub processing: bool = "FASTACK_PROCESSING" {
            default: "true",
            parse: parse::boolean,
        },
        /// log filter (tracing EnvFilter syntax)
        pub log: String = "FASTACK_LOG" {
            default: "info",
            parse: parse::text,
        },
        /// how long a looked-up API key is trusted; bounds revocation delay
        pub key_cache_ttl: Duration = "FASTACK_KEY_CACHE_TTL_MS" {
            default: "2000",
            parse: parse::millis,
        },
        /// how often a node checks its dependencies (database, object storage, the lake, Redis, disk) for `/readyz`
        pub dependency_check: Duration = "FASTACK_DEPENDENCY_CHECK_MS" {
            default: "15000",
            parse: parse::millis,
            check: |d: &Duration| {
                if *d < Duration::from_millis(100) { Err("must be at least 100".to_owned()) } else { Ok(()) }
            },
        },
        /// how often a processor checks its tenant's inbox besides being woken
        pub poll_interval: Duration = "FASTACK_POLL_INTERVAL_MS" {
            default: "1000",
            parse: parse::millis,
        },
        /// a woken processor waits at most this long after its previous round, so many small rounds become fewer bigger ones
        pub process_gather: Duration = "FASTACK_PROCESS_GATHER_MS" {
            default: "25",
            parse: parse::millis,
        },
        /// processing lease lifetime; a dead node's tenants move after this
        pub lease_ttl: Duration = "FASTACK_LEASE_TTL_MS" {
            default: "10000",
            parse: parse::millis,
        },
        /// inbox rows a processor handles per transaction
        pub process_batch: u32 = "FASTACK_PROCESS_BATCH" {
            default: "8000",
            parse: parse::from_str,
            check: check::positive,
        },
        /// identities (user and anonymous ids) whose contact a node keeps in memory between processing rounds, over all tenants; 0 looks every one up
        pub contacts_cached: usize = "FASTACK_CONTACTS_CACHED" {
            default: "200000",
            parse: parse::from_str,
        },
        /// the embedded database's page cache for processing's writes, in MiB: a round's pages fit in it, so none is written to the WAL twice before its commit
        pub sqlite_cache_mib: u32 = "FASTACK_SQLITE_CACHE_MIB" {
            default: "64",
            parse: parse::from_str,
            check: check::positive,
        },
        /// an event that fails processing this many times moves to quarantine
        pub process_max_attempts: u32 = "FASTACK_PROCESS_MAX_ATTEMPTS" {
            default: "5",
            parse: parse::from_str,
            check: check::positive,
        },
        /// an idle tenant's actors stop after this and restart on demand
        pub tenant_idle: Duration = "FASTACK_TENANT_IDLE_SECS" {
            default: "300",
            parse: parse::secs,
        },
        /// `track`, `identify` and `batch` answer within this once their body is read: 202, a 4xx, or 503 `unavailable` with nothing accepted
        pub ingest_budget: Duration = "FASTACK_INGEST_BUDGET_MS" {
            default: "1000",
            parse: parse::millis,
            check: |d: &Duration| {
                if *d < MIN_INGEST_BUDGET {
                    Err(format!(
                        "must be at least {} (the group commit needs room inside it)",
                        MIN_INGEST_BUDGET.as_millis()
                    ))
                } else {
                    Ok(())
                }
            },
        },
        /// most rows in one group commit
        pub ingest_max_rows: usize = "FASTACK_INGEST_MAX_ROWS" {
            default: "4000",
            parse: parse::from_str,
            check: check::positive,
        },
        /// most group commits in flight at once
        pub ingest_concurrency: Option<usize> = "FASTACK_INGEST_CONCURRENCY" {
            default: "",
            shown: "(PostgreSQL cores/2 in 2..4, SQLite 2)",
            parse: parse::optional,
        },
        /// a group commit beyond the first starts only when this many rows wait (0: at once)
        pub ingest_split_rows: usize = "FASTACK_INGEST_SPLIT_ROWS" {
            default: "16",
            parse: parse::from_str,
        },
    }
    nested {
        /// The S3-compatible storage behind `s3://` URLs.
        pub s3: S3Settings,
        /// Plan limits in force.
        pub plans: PlanTable,
    }
    internal {
        /// The sections declared outside this crate (a sink's), by type.
        pub sections: Sections,
    }
}

fn database_url(url: &Option<String>) -> std::result::Result<(), String> {
    match url {
        Some(url)
            if !(url.starts_with("postgres://")
                || url.starts_with("postgresql://")
                || url.starts_with("sqlite:")) =>
        {
            Err("must start with postgres://, postgresql:// or sqlite:".to_owned())
        }
        _ => Ok(()),
    }
}

fn admin_token(token: &Option<String>) -> std::result::Result<(), String> {
    match token {
        Some(token) if token.chars().count() < MIN_ADMIN_TOKEN_CHARS => Err(format!(
            "must be at least {MIN_ADMIN_TOKEN_CHARS} characters \
             (e.g. `head -c 24 /dev/urandom | base64`)"
        )),
        _ => Ok(()),
    }
}

crate::settings! {
    /// Credentials of an S3-compatible bucket. `Debug` hides the secret.
    pub struct S3Settings {
        /// endpoint of the S3-compatible storage behind `s3://…` URLs (`FASTACK_STORAGE_URL`, a sink's); unset: AWS
        pub endpoint: Option<String> = "FASTACK_S3_ENDPOINT" {
            default: "",
            shown: "(none)",
            parse: parse::optional_text,
        },
        /// region of that storage
        pub region: Option<String> = "FASTACK_S3_REGION" {
            default: "",
            shown: "(none)",
            parse: parse::optional_text,
        },
        /// access key id for it (unset: the `AWS_*` environment's credentials)
        pub access_key_id: Option<String> = "FASTACK_S3_ACCESS_KEY_ID" {
            default: "",
            shown: "(none)",
            parse: parse::optional_text,
        },
        /// secret access key for it
        pub secret_access_key: Option<String> = "FASTACK_S3_SECRET_ACCESS_KEY" {
            default: "",
            shown: "(none)",
            parse: parse::optional_text,
            show: secret,
        },
    }
    internal {
        /// The environment's `AWS_*` variables (the S3 client's usual chain:
        /// keys, a web identity token, container credentials, a region), read
        /// with the rest of the configuration; the `FASTACK_S3_*` settings win.
        pub aws_environment: AwsEnvironment,
    }
}

/// The environment's `AWS_*` variables. `Debug` shows their names only.
#[derive(Clone, Default)]
pub struct AwsEnvironment(pub Vec<(String, String)>);

impl std::fmt::Debug for AwsEnvironment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, _)| k))
            .finish()
    }
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

/// The plan table's family: `FASTACK_PLAN_<PLAN>_<LIMIT>`, one limit of
/// one plan, each positive.
impl Section for PlanTable {
    fn docs() -> Vec<SettingDoc> {
        let names = Plan::ALL
            .into_iter()
            .flat_map(|plan| {
                let plan = plan.to_string().to_ascii_uppercase();
                ["RPS", "BURST", "RETENTION_MONTHS"]
                    .map(|limit| format!("FASTACK_PLAN_{plan}_{limit}"))
            })
            .collect();
        vec![SettingDoc {
            name: "FASTACK_PLAN_<PLAN>_RPS / _BURST / _RETENTION_MONTHS",
            default: "see Plans",
            meaning: "override the plan table (PLAN = FREE, PRO, ENTERPRISE)".to_owned(),
            secret: false,
            names,
        }]
    }

    fn apply(&mut self, key: &str, value: &str) -> Result<bool> {
        let Some((plan, limit)) = key
            .strip_prefix("FASTACK_PLAN_")
            .and_then(|rest| rest.split_once('_'))
        else {
            return Ok(false);
        };
        let plan: Plan = plan
            .to_ascii_lowercase()
            .parse()
            .map_err(|e: fastack_entities::UnknownPlan| Error::Config(format!("{key}: {e}")))?;
        let limits = self.get_mut(plan);
        let field = match limit {
            "RPS" => &mut limits.rate_per_sec,
            "BURST" => &mut limits.burst,
            "RETENTION_MONTHS" => &mut limits.retention_months,
            _ => return Ok(false),
        };
        let parsed: u32 =
            parse::from_str(value).map_err(|why| settings::invalid(key, value, why))?;
        check::positive(&parsed).map_err(|why| settings::refused(key, why))?;
        *field = parsed;
        Ok(true)
    }
}

/// The configuration file's own row: read before every other setting.
fn config_file_doc() -> SettingDoc {
    SettingDoc::one(
        "FASTACK_CONFIG",
        "(none)",
        &["TOML file with the same settings in lowercase without the prefix"],
        false,
    )
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

    /// The settings this crate declares; [`Config::load`] adds the
    /// extensions' (a node's: `fastack_actors::sinks::settings()`).
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Result<Self> {
        Self::load(vars, &[])
    }

    /// Builds a configuration from `FASTACK_*` variables (and the TOML file
    /// that `FASTACK_CONFIG` names, if any), with the sections of
    /// `extensions` besides this crate's. Each value is parsed and checked
    /// where it is declared; unknown `FASTACK_` variables are an error: a
    /// typo must not silently fall back to a default. Call once, in `main`
    /// (with `std::env::vars()`).
    pub fn load(
        vars: impl IntoIterator<Item = (String, String)>,
        extensions: &[Extension],
    ) -> Result<Self> {
        let vars: Vec<(String, String)> = vars.into_iter().collect();
        let aws_environment = vars
            .iter()
            .filter(|(k, _)| k.starts_with("AWS_"))
            .cloned()
            .collect();
        let merged = merged(vars)?;
        let mut cfg = Config::default();
        cfg.s3.aws_environment = AwsEnvironment(aws_environment);
        let mut loaded: Vec<Box<dyn AnySection>> = extensions.iter().map(Extension::make).collect();
        for (key, (value, origin)) in merged {
            let mut applied = Section::apply(&mut cfg, &key, &value);
            for section in &mut loaded {
                if !matches!(applied, Ok(false)) {
                    break;
                }
                applied = section.apply(&key, &value);
            }
            if !applied.map_err(|e| origin.qualify(e))? {
                return Err(unknown_setting(&key, &origin, extensions));
            }
        }
        cfg.sections = Sections::from_loaded(loaded);
        Ok(cfg)
    }

    /// The configuration table: every setting declared here, then the
    /// extensions', then the file's own.
    pub fn docs(extensions: &[Extension]) -> Vec<SettingDoc> {
        let mut docs = <Config as Section>::docs();
        docs.extend(extensions.iter().flat_map(|e| e.make().docs()));
        docs.push(config_file_doc());
        docs
    }

    /// What `fastack config` prints: each documented setting, its default,
    /// and the values in force with where each came from (the environment
    /// or the file `FASTACK_CONFIG` names); secrets are shown as set, not
    /// by value. An invalid configuration is the error `serve` would give.
    pub fn in_force(
        vars: impl IntoIterator<Item = (String, String)>,
        extensions: &[Extension],
    ) -> Result<Vec<InForce>> {
        let vars: Vec<(String, String)> = vars.into_iter().collect();
        Config::load(vars.clone(), extensions)?;
        let merged = merged(vars)?;
        let mut out = Vec::new();
        for doc in Config::docs(extensions) {
            let set = doc
                .names
                .iter()
                .filter_map(|name| {
                    let (value, origin) = merged.get(name)?;
                    Some(SetValue {
                        name: name.clone(),
                        shown: shown(doc.secret, value),
                        source: match origin {
                            Origin::Env => "environment".to_owned(),
                            Origin::File { path, .. } => format!("file {path}"),
                        },
                    })
                })
                .collect();
            out.push(InForce { doc, set });
        }
        Ok(out)
    }
}

/// One documented setting (or family) and what is in force.
#[derive(Debug)]
pub struct InForce {
    pub doc: SettingDoc,
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
fn shown(secret: bool, value: &str) -> String {
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

/// Every concrete setting name.
fn known_names(extensions: &[Extension]) -> Vec<String> {
    Config::docs(extensions)
        .into_iter()
        .flat_map(|doc| doc.names)
        .collect()
}

fn unknown_setting(name: &str, origin: &Origin, extensions: &[Extension]) -> Error {
    let known = known_names(extensions);
    let closest = |name: &str| {
        crate::validate::closest(name, known.iter().map(String::as_str)).map(str::to_owned)
    };
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
                    if known
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

/// Variables of fastack's own tooling, not settings of a node: the test
/// harnesses' (`FASTACK_TEST_*`) and the SDK suites' binary path
/// (`FASTACK_BIN`). A node ignores them, so a shell or CI job that exports
/// them can still run `fastack`.
fn is_tooling(name: &str) -> bool {
    name == "FASTACK_BIN" || name.starts_with("FASTACK_TEST_")
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
        let rows = Config::in_force(
            vars(&[
                ("FASTACK_CONFIG", file.to_str().unwrap()),
                ("FASTACK_LISTEN", "127.0.0.1:9999"),
                ("FASTACK_ADMIN_TOKEN", "an-admin-token-of-enough-length"),
                ("FASTACK_DATABASE_URL", "postgres://app:hunter2@db:5432/x"),
            ]),
            &[],
        )
        .unwrap();
        let row = |name: &str| rows.iter().find(|r| r.doc.name.starts_with(name)).unwrap();
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
        assert!(Config::in_force(vars(&[("FASTACK_LISTN", "x")]), &[]).is_err());
    }

    /// Every declared default parses (`Config::default` parses them), and
    /// `fastack config` shows no secret by value, whatever its name.
    #[test]
    fn defaults_parse_and_fastack_config_hides_every_secret() {
        let cfg = Config::default();
        assert_eq!(cfg.ingest_budget, Duration::from_millis(1_000));
        assert_eq!(cfg.s3.endpoint, None);
        let secrets = [
            ("FASTACK_ADMIN_TOKEN", "admin-token-abcdefghijklmnop"),
            (
                "FASTACK_ENC_KEY",
                "ZmFzdGFjay10ZXN0LW1hc3Rlci1rZXktMzItYnl0ZXMh",
            ),
            ("FASTACK_S3_SECRET_ACCESS_KEY", "s3-secret-789"),
        ];
        let rows = Config::in_force(vars(&secrets), &[]).unwrap();
        for (name, _) in secrets {
            let row = rows.iter().find(|r| r.doc.name == name).unwrap();
            assert!(row.doc.secret, "{name}");
            assert_eq!(row.set[0].shown, "(set)", "{name}");
        }
        let docs = Config::docs(&[]);
        assert_eq!(docs.last().unwrap().name, "FASTACK_CONFIG");
        assert!(docs.iter().all(|d| !d.meaning.is_empty()));
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
            ("FASTACK_UNAUTH_RPS", "7"),
        ]))
        .unwrap();
        assert!(!cfg.is_embedded());
        assert_eq!(cfg.plans.pro.rate_per_sec, 3000);
        assert_eq!(cfg.plans.enterprise.retention_months, 48);
        assert_eq!(cfg.unauth_rps, 7);
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
