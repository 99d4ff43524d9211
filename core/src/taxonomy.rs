//! Tracking plans: a tenant's one JSON document of JSON Schemas (draft
//! 2020-12), checked whole when installed, compiled once per (tenant,
//! version) and applied at the front door to `track` properties (by exact
//! event name) and `identify` traits.
//!
//! Every node keeps the tenants' compiled plans in [`Plans`] and asks the
//! store once a second which version is the latest of each tenant (one
//! grouped read of `tracking_plans`); a node that installs refreshes at
//! once. So a new version is in force everywhere within about a second of
//! `install` returning, and an event records the version it was checked
//! against.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use chrono::{DateTime, Utc};
use fastack_entities::{EventKind, NewEvent, PlanCheck, PlanVersion, SchemaViolation, TenantId};
use jsonschema::Validator;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{
    error::{Error, Result},
    store::Storage,
};

/// What a violation does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Refuse the request (`422 schema_violation`).
    #[default]
    Enforce,
    /// Accept it and store the violations with the event.
    Flag,
}

/// What happens to a `track` whose name the plan does not list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unplanned {
    #[default]
    Allow,
    /// Refuse it (`422 unplanned_event`).
    Reject,
}

/// A plan document as installed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    #[serde(default)]
    events: BTreeMap<String, Value>,
    #[serde(default)]
    identify: Option<Value>,
    #[serde(default)]
    unplanned: Unplanned,
    #[serde(default)]
    mode: Mode,
    /// Schemas the event schemas share (`{"$ref": "#/$defs/money"}`).
    #[serde(default, rename = "$defs")]
    defs: Map<String, Value>,
}

/// A plan ready to check events.
pub struct CompiledPlan {
    pub version: u32,
    pub mode: Mode,
    pub unplanned: Unplanned,
    events: HashMap<String, Validator>,
    identify: Option<Validator>,
}

impl std::fmt::Debug for CompiledPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledPlan")
            .field("version", &self.version)
            .field("events", &self.events.len())
            .finish()
    }
}

/// What a plan says of one event.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Conforms,
    /// The event breaks its schema (pointers relative to the event).
    Violates(Vec<SchemaViolation>),
    /// A `track` the plan does not list, under `unplanned: reject`.
    Unplanned,
}

/// Violations reported (and, in flag mode, stored) per event at most: an
/// event breaking a schema everywhere should not grow without bound.
pub const MAX_VIOLATIONS: usize = 50;

/// JSON Schema keywords as stable error codes (anything else: `schema`).
const KEYWORDS: [&str; 38] = [
    "additionalItems",
    "additionalProperties",
    "allOf",
    "anyOf",
    "const",
    "contains",
    "contentEncoding",
    "contentMediaType",
    "contentSchema",
    "dependentRequired",
    "dependentSchemas",
    "enum",
    "exclusiveMaximum",
    "exclusiveMinimum",
    "false",
    "format",
    "if",
    "items",
    "maxContains",
    "maxItems",
    "maxLength",
    "maxProperties",
    "maximum",
    "minContains",
    "minItems",
    "minLength",
    "minProperties",
    "minimum",
    "multipleOf",
    "not",
    "oneOf",
    "pattern",
    "prefixItems",
    "propertyNames",
    "required",
    "type",
    "unevaluatedItems",
    "unevaluatedProperties",
];

/// A keyword as a `'static` code.
pub fn keyword_code(keyword: &str) -> &'static str {
    KEYWORDS
        .iter()
        .find(|k| **k == keyword)
        .copied()
        .unwrap_or("schema")
}

fn compile(schema: &Value, defs: &Map<String, Value>, what: &str) -> Result<Validator> {
    // Shared `$defs` go into each schema's own root, so `#/$defs/…`
    // resolves; the schema's own definitions win.
    let mut schema = schema.clone();
    if let Value::Object(obj) = &mut schema {
        if !defs.is_empty() {
            let own = obj
                .entry("$defs")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(own) = own {
                for (k, v) in defs {
                    own.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
        }
    } else if !schema.is_boolean() {
        return Err(Error::InvalidPlan(format!(
            "{what}: a schema is a JSON object or a boolean"
        )));
    }
    // Formats are asserted (an `email` must be one); without the crate's
    // resolver features every reference outside the document is refused.
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(&schema)
        .map_err(|e| {
            let at = e.instance_path().to_string();
            let at = if at.is_empty() {
                String::new()
            } else {
                format!(" (at {at})")
            };
            Error::InvalidPlan(format!("{what}: invalid schema: {e}{at}"))
        })
}

impl CompiledPlan {
    /// Checks a whole document and compiles every schema in it; the error
    /// names the event whose schema is broken and why.
    pub fn compile(version: u32, document: &Value) -> Result<CompiledPlan> {
        let doc: Document = serde_json::from_value(document.clone())
            .map_err(|e| Error::InvalidPlan(format!("plan document: {e}")))?;
        let mut events = HashMap::with_capacity(doc.events.len());
        for (name, schema) in &doc.events {
            if name.is_empty() {
                return Err(Error::InvalidPlan(
                    "events: an event name cannot be empty".to_owned(),
                ));
            }
            let v = compile(schema, &doc.defs, &format!("events.{name:?}"))?;
            events.insert(name.clone(), v);
        }
        let identify = doc
            .identify
            .as_ref()
            .map(|s| compile(s, &doc.defs, "identify"))
            .transpose()?;
        Ok(CompiledPlan {
            version,
            mode: doc.mode,
            unplanned: doc.unplanned,
            events,
            identify,
        })
    }

    /// Checks one event's properties (a `track`) or traits (an
    /// `identify`).
    pub fn check(&self, ev: &mut NewEvent) -> Verdict {
        let (validator, field) = match ev.kind {
            EventKind::Track => {
                let name = ev.event.as_deref().unwrap_or_default();
                match self.events.get(name) {
                    Some(v) => (v, "/properties"),
                    None if self.unplanned == Unplanned::Reject => return Verdict::Unplanned,
                    None => return Verdict::Conforms,
                }
            }
            EventKind::Identify => match &self.identify {
                Some(v) => (v, "/traits"),
                None => return Verdict::Conforms,
            },
        };
        // The validator reads a `Value`: lend it the map, then take it back.
        let instance = Value::Object(std::mem::take(&mut ev.properties));
        let violations: Vec<SchemaViolation> = if validator.is_valid(&instance) {
            Vec::new()
        } else {
            validator
                .iter_errors(&instance)
                .take(MAX_VIOLATIONS)
                .map(|e| SchemaViolation {
                    field: format!("{field}{}", e.instance_path()),
                    code: keyword_code(e.kind().keyword()).to_owned(),
                    message: e.to_string(),
                })
                .collect()
        };
        if let Value::Object(map) = instance {
            ev.properties = map;
        }
        if violations.is_empty() {
            Verdict::Conforms
        } else {
            Verdict::Violates(violations)
        }
    }

    /// What an accepted event records.
    pub fn record(&self, violations: Vec<SchemaViolation>) -> PlanCheck {
        PlanCheck {
            plan_version: self.version,
            schema_violations: violations,
        }
    }
}

/// Compiled plans kept at most (versions of tenants that have one).
const COMPILED_KEPT: usize = 10_000;

/// Every tenant's plan in force on this node.
#[derive(Debug)]
pub struct Plans {
    current: RwLock<HashMap<TenantId, Arc<CompiledPlan>>>,
    /// Latest version per tenant as last read, removals included.
    seen: RwLock<HashMap<TenantId, u32>>,
    compiled: quick_cache::sync::Cache<(TenantId, u32), Arc<CompiledPlan>>,
}

impl Default for Plans {
    fn default() -> Self {
        Plans {
            current: RwLock::default(),
            seen: RwLock::default(),
            compiled: quick_cache::sync::Cache::new(COMPILED_KEPT),
        }
    }
}

impl Plans {
    /// The tenant's plan in force, if any.
    pub fn get(&self, tenant: TenantId) -> Option<Arc<CompiledPlan>> {
        self.current.read().get(&tenant).cloned()
    }

    /// Reads which version is the latest of each tenant and loads what
    /// changed since the last read. A stored plan that no longer compiles
    /// (it did when installed) is logged and left out.
    pub async fn refresh(&self, store: &Storage) -> Result<()> {
        let latest = store.plans().latest_versions().await?;
        let changed: Vec<(TenantId, u32)> = {
            let seen = self.seen.read();
            latest
                .into_iter()
                .filter(|(t, v)| seen.get(t) != Some(v))
                .collect()
        };
        for (tenant, version) in changed {
            let plan = match self.compiled.get(&(tenant, version)) {
                Some(p) => Some(p),
                None => match store.plans().version(tenant, Some(version)).await? {
                    Some(PlanVersion {
                        document: Some(doc),
                        ..
                    }) => match CompiledPlan::compile(version, &doc) {
                        Ok(p) => {
                            let p = Arc::new(p);
                            self.compiled.insert((tenant, version), p.clone());
                            Some(p)
                        }
                        Err(error) => {
                            tracing::warn!(%tenant, version, %error, "stored tracking plan does not compile; not enforced");
                            None
                        }
                    },
                    _ => None,
                },
            };
            match plan {
                Some(p) => self.current.write().insert(tenant, p),
                None => self.current.write().remove(&tenant),
            };
            self.seen.write().insert(tenant, version);
        }
        Ok(())
    }
}

/// Installs `document` as the tenant's next plan version after checking it
/// whole (nothing is stored when any schema is broken).
pub async fn install(
    store: &Storage,
    tenant: TenantId,
    document: &Value,
    now: DateTime<Utc>,
) -> Result<PlanVersion> {
    CompiledPlan::compile(0, document)?;
    let version = store.plans().install(tenant, Some(document), now).await?;
    Ok(PlanVersion {
        tenant_id: tenant,
        version,
        document: Some(document.clone()),
        installed_at: now,
    })
}

/// Removes the tenant's plan (a new version without a document); `None`
/// when it has none in force.
pub async fn remove(
    store: &Storage,
    tenant: TenantId,
    now: DateTime<Utc>,
) -> Result<Option<PlanVersion>> {
    match store.plans().version(tenant, None).await? {
        Some(PlanVersion {
            document: Some(_), ..
        }) => {
            let version = store.plans().install(tenant, None, now).await?;
            Ok(Some(PlanVersion {
                tenant_id: tenant,
                version,
                document: None,
                installed_at: now,
            }))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use serde_json::json;

    use super::*;

    fn track(name: &str, props: Value) -> NewEvent {
        NewEvent {
            kind: EventKind::Track,
            event: Some(name.to_owned()),
            user_id: Some("u".into()),
            anonymous_id: None,
            properties: props.as_object().cloned().unwrap_or_default(),
            occurred_at: Utc::now().fixed_offset(),
            idempotency_key: "k".into(),
            plan: None,
        }
    }

    #[test]
    fn checks_properties_by_event_name() {
        let plan = CompiledPlan::compile(
            3,
            &json!({
                "$defs": {"money": {"type": "number", "minimum": 0}},
                "events": {"Order Completed": {
                    "type": "object",
                    "properties": {"amount": {"$ref": "#/$defs/money"}, "email": {"format": "email"}},
                    "required": ["amount"]
                }},
                "unplanned": "reject"
            }),
        )
        .unwrap();
        let mut ok = track("Order Completed", json!({"amount": 3}));
        assert_eq!(plan.check(&mut ok), Verdict::Conforms);
        assert_eq!(ok.properties["amount"], json!(3), "the map is given back");
        let mut bad = track("Order Completed", json!({"amount": -1, "email": "nope"}));
        let Verdict::Violates(v) = plan.check(&mut bad) else {
            panic!("expected violations")
        };
        let mut fields: Vec<(&str, &str)> = v
            .iter()
            .map(|v| (v.field.as_str(), v.code.as_str()))
            .collect();
        fields.sort();
        assert_eq!(
            fields,
            [
                ("/properties/amount", "minimum"),
                ("/properties/email", "format")
            ]
        );
        assert_eq!(
            plan.check(&mut track("Other", json!({}))),
            Verdict::Unplanned
        );
    }

    #[test]
    fn a_broken_plan_names_the_event() {
        let err = CompiledPlan::compile(1, &json!({"events": {"Signed Up": {"type": "strnig"}}}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("Signed Up"), "{err}");
        let err = CompiledPlan::compile(1, &json!({"events": {}, "mode": "loud"}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("mode") || err.contains("loud"), "{err}");
        let err = CompiledPlan::compile(
            1,
            &json!({"events": {"E": {"$ref": "https://example.com/s.json"}}}),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("\"E\""),
            "remote references are refused: {err}"
        );
    }
}
