//! Outbound sinks: what takes outbox rows out of a node. Each sink is one
//! file implementing [`Sink`], driven by the one relay actor type
//! ([`relay::RelayActor`]): claim the rows the sink owes, send them,
//! complete what it took and give back the rest. A sink that reports its
//! link down is reconnected after a capped backoff.
//!
//! Adding a sink: a file here implementing [`Sink`] (its settings,
//! counters, backfill and lake declared there), and its line in
//! [`SINKS`]. Outbox rows then record it by name; no migration. A sink
//! that writes files says so with [`Sink::batches`]: it is then sent named
//! batches that come back whole after a crash.

pub mod amqp;
pub mod mirror;
pub mod relay;
pub mod sink;
pub mod webhooks;

use chrono::{DateTime, Utc};
use fastack_core::{
    Config,
    metrics::CounterSpec,
    settings::Extension,
    store::{Emit, SinkName, TimeRange},
};
use fastack_entities::{Job, JobKind, TenantId};
use futures::future::BoxFuture;
use serde_json::json;

use crate::child::ChildSpec;
pub use crate::routing::Routing;
use relay::RelayActor;
pub use sink::{Backfill, BackfillRequest, Flush, Lake, Probe, Sent, Sink, Tracked};

/// Every sink of the product, each declared by its file: the one place an
/// output is added.
const SINKS: &[SinkKind] = &[
    SinkKind::of::<webhooks::WebhookSink>(),
    SinkKind::of::<amqp::AmqpSink>(),
    SinkKind::of::<mirror::MirrorSink>(),
];

/// A sink as the registry holds it: what its file declares.
struct SinkKind {
    name: SinkName,
    settings: Option<Extension>,
    backfill: Option<&'static dyn Backfill>,
    on: fn(&Config) -> bool,
    spec: fn() -> SinkSpec,
    lake: fn(&Config) -> Option<fastack_core::Result<Lake>>,
    check: fn(&Config) -> fastack_core::Result<()>,
    probe: for<'a> fn(&'a Config) -> BoxFuture<'a, Option<Probe>>,
}

fn probe_of<S: Sink>(config: &Config) -> BoxFuture<'_, Option<Probe>> {
    S::probe(config)
}

impl SinkKind {
    const fn of<S: Sink>() -> SinkKind {
        SinkKind {
            name: S::NAME,
            settings: S::SETTINGS,
            backfill: S::BACKFILL,
            on: S::on,
            spec: SinkSpec::of::<S>,
            lake: S::lake,
            check: S::check,
            probe: probe_of::<S>,
        }
    }
}

/// A sink a node runs, with what it takes.
pub struct SinkSpec {
    pub name: SinkName,
    /// Takes jobs' terminal events.
    pub jobs: bool,
    pub tracked: Tracked,
    /// Owed grouped rows ([`Sink::GROUPED`]).
    pub grouped: bool,
    /// Its counters ([`Sink::COUNTERS`]).
    pub counters: &'static [CounterSpec],
    /// Its relay and the actors it runs beside it, started under the root.
    pub children: Vec<ChildSpec>,
}

impl SinkSpec {
    fn of<S: Sink>() -> SinkSpec {
        SinkSpec {
            name: S::NAME,
            jobs: S::JOBS,
            tracked: S::TRACKED,
            grouped: S::GROUPED,
            counters: S::COUNTERS,
            children: std::iter::once(RelayActor::<S>::child(S::open))
                .chain(S::workers())
                .collect(),
        }
    }
}

/// The sinks of a node with this configuration.
pub fn enabled(config: &Config) -> Vec<SinkSpec> {
    SINKS
        .iter()
        .filter(|k| (k.on)(config))
        .map(|k| (k.spec)())
        .collect()
}

/// The sinks' settings sections: load the configuration with them
/// (`Config::load`), so every setting is known, documented and checked.
pub fn settings() -> Vec<Extension> {
    SINKS.iter().filter_map(|k| k.settings).collect()
}

/// The counters of the sinks of a node with this configuration.
pub fn counters(config: &Config) -> Vec<CounterSpec> {
    enabled(config)
        .iter()
        .flat_map(|s| s.counters.iter().copied())
        .collect()
}

/// The lake of a node with this configuration: the files of the first sink
/// on that keeps some (`None`: no sink keeping files is on).
pub fn lake(config: &Config) -> Option<fastack_core::Result<Lake>> {
    SINKS
        .iter()
        .filter(|k| (k.on)(config))
        .find_map(|k| (k.lake)(config))
}

/// Every sink's check of its settings: a node refuses to start on the
/// first error.
pub fn check(config: &Config) -> fastack_core::Result<()> {
    SINKS.iter().try_for_each(|k| (k.check)(config))
}

/// The probes of the links of the sinks on with this configuration.
pub async fn probes(config: &Config) -> Vec<Probe> {
    let mut found = Vec::new();
    for kind in SINKS.iter().filter(|k| (k.on)(config)) {
        found.extend((kind.probe)(config).await);
    }
    found
}

/// The sinks that have a backfill, by name.
pub fn with_backfill() -> Vec<SinkName> {
    SINKS
        .iter()
        .filter(|k| k.backfill.is_some())
        .map(|k| k.name)
        .collect()
}

/// The sink `name` and its backfill, if it is on with this configuration.
pub fn backfill_of(
    config: &Config,
    name: &str,
) -> Result<(SinkName, &'static dyn Backfill), String> {
    let (kind, backfill) = SINKS
        .iter()
        .filter(|k| k.name.0 == name)
        .find_map(|k| Some((k, k.backfill?)))
        .ok_or_else(|| {
            let names: Vec<&str> = with_backfill().iter().map(|n| n.0).collect();
            format!(
                "no sink named `{name}` has a backfill (sinks with one: {})",
                names.join(", ")
            )
        })?;
    if !(kind.on)(config) {
        return Err(format!(
            "the {name} sink is off: run this with the server's settings (`fastack config` lists them)"
        ));
    }
    Ok((kind.name, backfill))
}

/// A queued backfill for sink `sink` of the tenant's events of `[from,
/// to)`: an operator's job, like retention's (the tenant does not see it in
/// its job list; its terminal event goes to the operator's streams).
pub fn backfill_job(sink: SinkName, request: &BackfillRequest, now: DateTime<Utc>) -> Job {
    Job::queued(
        fastack_core::retention::SYSTEM_TENANT,
        JobKind::Backfill,
        json!({
            "sink": sink.0,
            "tenant": request.tenant.to_string(),
            "from": request.range.from.to_rfc3339(),
            "to": request.range.to.to_rfc3339(),
            "rewrite": request.rewrite,
        }),
        serde_json::Map::new(),
        now,
    )
}

/// Runs a `backfill` job: its sink's backfill of what its params ask. A
/// job without `sink` (queued by a release before sinks named theirs) is
/// the one sink's that has a backfill.
pub async fn run_backfill(
    store: &fastack_core::store::Storage,
    config: &Config,
    job: &Job,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<serde_json::Value, String> {
    let (_, backfill) = backfill_of(config, &sink_of(job)?)?;
    backfill
        .run(store, config, job, &backfill_request(job)?, progress)
        .await
}

/// The sink a backfill job is for.
fn sink_of(job: &Job) -> Result<String, String> {
    match job.params["sink"].as_str() {
        Some(name) => Ok(name.to_owned()),
        None => match with_backfill().as_slice() {
            [only] => Ok(only.0.to_owned()),
            _ => Err(format!("backfill job {} names no sink", job.id)),
        },
    }
}

/// What a backfill job's params ask.
fn backfill_request(job: &Job) -> Result<BackfillRequest, String> {
    let time = |field: &str| -> Result<DateTime<Utc>, String> {
        job.params[field]
            .as_str()
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.with_timezone(&Utc))
            .ok_or_else(|| format!("backfill job {} has no `{field}`", job.id))
    };
    let tenant: TenantId = job.params["tenant"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("backfill job {} has no `tenant`", job.id))?;
    let range = TimeRange::new(time("from")?, time("to")?)
        .ok_or("the range is empty: `to` must be after `from`")?;
    Ok(BackfillRequest {
        tenant,
        range,
        rewrite: job.params["rewrite"].as_bool().unwrap_or(false),
    })
}

impl Routing {
    pub fn of(sinks: &[SinkSpec]) -> Routing {
        let grouped = sinks.iter().filter(|s| s.grouped).map(|s| s.name);
        let pick = |f: &dyn Fn(&SinkSpec) -> bool| {
            Emit::to(sinks.iter().filter(|s| f(s)).map(|s| s.name)).grouping(grouped.clone())
        };
        Routing {
            jobs: pick(&|s| s.jobs),
            erased: pick(&|s| s.jobs),
            tracked: pick(&|s| s.tracked == Tracked::Every),
            tracked_if_subscribed: pick(&|s| s.tracked == Tracked::WhenSubscribed),
        }
    }

    /// For a configuration (the CLI finishing jobs outside a node).
    pub fn for_config(config: &Config) -> Routing {
        Routing::of(&enabled(config))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use fastack_core::metrics::{
        DependencyLabels, HttpLabels, Metrics, OutcomeLabels, PrivacyLabels, ResolvedLabels,
        SinkLabels,
    };

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Each variable is declared once, among the product's settings and
    /// every sink's. (The README's table is `fastack config --defaults`:
    /// its examples' run checks it.)
    #[test]
    fn every_variable_is_declared_once() {
        let mut names: Vec<String> = Config::docs(&settings())
            .into_iter()
            .flat_map(|d| d.names)
            .collect();
        let all = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all, "a variable is declared twice");
    }

    /// A sink's settings, declared in its file, load like the product's:
    /// from the environment or the file, checked, with typos caught, in
    /// `fastack config`, and absent from a configuration loaded without
    /// the sinks.
    #[test]
    fn a_sinks_settings_load_like_the_products() {
        let cfg = Config::load(
            vars(&[
                ("FASTACK_MIRROR_URL", "file:///lake"),
                ("FASTACK_MIRROR_FLUSH_SECS", "5"),
            ]),
            &settings(),
        )
        .unwrap();
        let mirror = cfg.sections.get::<mirror::MirrorSettings>().unwrap();
        assert_eq!(mirror.url.as_deref(), Some("file:///lake"));
        assert_eq!(mirror.flush, std::time::Duration::from_secs(5));
        assert_eq!(mirror.flush_rows, 100_000, "the declared default");
        assert!(
            enabled(&cfg)
                .iter()
                .any(|s| s.name == mirror::MirrorSink::NAME)
        );
        assert!(format!("{cfg:?}").contains("file:///lake"));

        let off = Config::load(vars(&[]), &settings()).unwrap();
        assert!(
            !enabled(&off)
                .iter()
                .any(|s| s.name == mirror::MirrorSink::NAME)
        );
        assert!(lake(&off).is_none());

        let err = |pairs: &[(&str, &str)]| {
            Config::load(vars(pairs), &settings())
                .unwrap_err()
                .to_string()
        };
        assert!(
            err(&[("FASTACK_MIRROR_URL", "ftp://x")]).contains(
                "FASTACK_MIRROR_URL must start with s3:// (a bucket and prefix) or file://"
            )
        );
        assert!(err(&[("FASTACK_MIRROR_FLUSH_ROWS", "0")]).contains("must be positive"));
        assert!(
            err(&[("FASTACK_MIRROR_UR", "file:///x")]).contains("did you mean FASTACK_MIRROR_URL?")
        );
        // Without the sinks' sections, their settings are unknown.
        assert!(
            Config::from_vars(vars(&[("FASTACK_MIRROR_URL", "file:///x")]))
                .unwrap_err()
                .to_string()
                .contains("unknown setting FASTACK_MIRROR_URL")
        );

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fastack.toml");
        std::fs::write(&file, "mirror_flush_rows = 7\n").unwrap();
        let rows = Config::in_force(
            vars(&[("FASTACK_CONFIG", file.to_str().unwrap())]),
            &settings(),
        )
        .unwrap();
        let row = rows
            .iter()
            .find(|r| r.doc.name == "FASTACK_MIRROR_FLUSH_ROWS")
            .unwrap();
        assert_eq!(row.set[0].shown, "7");
        assert_eq!(row.set[0].source, format!("file {}", file.display()));
    }

    /// A backfill job names its sink; one queued without (by an earlier
    /// release) is the one sink's that has a backfill.
    #[test]
    fn a_backfill_job_is_its_sinks() {
        assert_eq!(with_backfill(), vec![mirror::MirrorSink::NAME]);
        let on =
            Config::load(vars(&[("FASTACK_MIRROR_URL", "file:///lake")]), &settings()).unwrap();
        let request = BackfillRequest {
            tenant: fastack_entities::TenantId::new(),
            range: TimeRange::new(
                chrono::Utc::now() - chrono::Duration::hours(2),
                chrono::Utc::now(),
            )
            .unwrap(),
            rewrite: true,
        };
        let mut job = backfill_job(mirror::MirrorSink::NAME, &request, chrono::Utc::now());
        assert_eq!(sink_of(&job).unwrap(), "mirror");
        let read = backfill_request(&job).unwrap();
        assert_eq!((read.tenant, read.rewrite), (request.tenant, true));
        assert!(backfill_of(&on, "mirror").is_ok());
        job.params.as_object_mut().unwrap().remove("sink");
        assert_eq!(sink_of(&job).unwrap(), "mirror");
        let off = Config::default();
        assert!(
            backfill_of(&off, "mirror")
                .err()
                .unwrap()
                .contains("the mirror sink is off")
        );
    }

    /// `docs/metrics.md`: exposed name -> (type, label names).
    fn documented() -> BTreeMap<String, (String, Vec<String>)> {
        include_str!("../../../docs/metrics.md")
            .lines()
            .filter(|l| l.starts_with("| `fastack_"))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let labels = cells[3]
                    .split(',')
                    .map(|s| s.trim().trim_matches('`').to_owned())
                    .filter(|s| !s.is_empty() && s != "—")
                    .collect();
                (
                    cells[1].trim_matches('`').to_owned(),
                    (cells[2].to_owned(), labels),
                )
            })
            .collect()
    }

    /// Every metric a node can expose (every sink on) is in
    /// `docs/metrics.md`, and nothing else is.
    #[test]
    fn the_documented_metrics_are_the_exposed_ones() {
        let config = Config::load(
            [
                ("FASTACK_AMQP_URL", "amqp://localhost"),
                ("FASTACK_MIRROR_URL", "file:///lake"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
            &settings(),
        )
        .unwrap();
        let declared = counters(&config);
        let m = Metrics::with_counters(&declared);
        // One sample in every labelled family, so each is exposed.
        let http = HttpLabels {
            route: "/v1/core/track",
            method: "POST",
            status: 202,
        };
        m.http_requests.get_or_create(&http).inc();
        m.http_duration.get_or_create(&http).observe(0.001);
        m.restarted("processor");
        m.outbox_depth
            .get_or_create(&SinkLabels { sink: "amqp" })
            .set(1);
        m.sink_lag_seconds
            .get_or_create(&SinkLabels { sink: "amqp" })
            .set(1);
        m.webhook_attempts
            .get_or_create(&OutcomeLabels {
                outcome: "delivered",
            })
            .inc();
        m.privacy_dropped_events
            .get_or_create(&PrivacyLabels {
                tenant: "t".to_owned(),
                reason: "suppressed",
            })
            .inc();
        m.refused("connection_cap");
        m.identities_resolved
            .get_or_create(&ResolvedLabels { from: "memory" })
            .inc();
        m.dependency_up
            .get_or_create(&DependencyLabels {
                dependency: "database",
            })
            .set(1);
        let text = m.render();
        let mut exposed: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                let name = if kind == "counter" {
                    format!("{name}_total")
                } else {
                    name.to_owned()
                };
                exposed.insert(name, (kind.to_owned(), Vec::new()));
            }
        }
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, labels)) = line.split_once('{') else {
                continue;
            };
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| series.strip_suffix(s))
                .filter(|f| exposed.contains_key(*f))
                .unwrap_or(series);
            let names: Vec<String> = labels
                .split("\",")
                .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.trim().to_owned()))
                .filter(|k| k != "le")
                .collect();
            if let Some((_, seen)) = exposed.get_mut(family)
                && seen.is_empty()
            {
                *seen = names;
            }
        }
        let documented = documented();
        // A family added without a sample above would not be exposed here:
        // every registration is documented.
        // The node's own registrations (less the one that registers the
        // declared counters) and the sinks' counters.
        assert_eq!(
            include_str!("../../../core/src/node/metrics.rs")
                .matches("registry.register(")
                .count()
                - 1
                + declared.len(),
            documented.len(),
            "a registered metric is missing from docs/metrics.md (or from this test's samples)"
        );
        assert_eq!(
            documented.keys().collect::<Vec<_>>(),
            exposed.keys().collect::<Vec<_>>(),
            "docs/metrics.md lists other metrics than /metrics exposes"
        );
        for (name, (kind, labels)) in &exposed {
            let (doc_kind, doc_labels) = &documented[name];
            assert_eq!(doc_kind, kind, "{name}: type");
            let (mut a, mut b) = (doc_labels.clone(), labels.clone());
            a.sort();
            b.sort();
            assert_eq!(a, b, "{name}: labels");
        }
    }
}
