//! Administrative operations shared by the CLI and the admin listener (both
//! through the runtime's service): tenants, API keys, webhook endpoints and
//! quarantined events. Secrets are returned once and never logged.

use chrono::Utc;
use fastack_entities::{ApiKey, ApiKeyId, Plan, Tenant, TenantId};

use crate::{
    auth::generate_key,
    error::{Error, Result},
    store::Storage,
};

/// A key as shown once at creation.
#[derive(Debug, serde::Serialize)]
pub struct CreatedKey {
    #[serde(flatten)]
    pub key: ApiKey,
    /// The secret: shown here once, stored only as a hash.
    pub secret: String,
}

pub async fn create_tenant(
    store: &Storage,
    name: &str,
    plan: Plan,
    retention_months: Option<u32>,
) -> Result<Tenant> {
    let name = name.trim();
    if name.is_empty() || name.len() > 100 {
        return Err(Error::Config(
            "tenant name must be 1 to 100 characters".to_owned(),
        ));
    }
    let tenant = Tenant {
        id: TenantId::new(),
        name: name.to_owned(),
        plan,
        retention_months,
        created_at: Utc::now(),
    };
    store.tenants().insert(&tenant).await?;
    Ok(tenant)
}

/// Finds a tenant by id or by name.
pub async fn resolve_tenant(store: &Storage, id_or_name: &str) -> Result<Tenant> {
    let found = match id_or_name.parse::<TenantId>() {
        Ok(id) => store.tenants().get(id).await?,
        Err(_) => store.tenants().find_by_name(id_or_name).await?,
    };
    found.ok_or(Error::NotFound { what: "tenant" })
}

pub async fn create_key(
    store: &Storage,
    tenant: TenantId,
    rate_limit_rps: Option<u32>,
) -> Result<CreatedKey> {
    if rate_limit_rps == Some(0) {
        return Err(Error::Config(
            "a key's rate limit must be positive".to_owned(),
        ));
    }
    let generated = generate_key();
    let key = ApiKey {
        id: ApiKeyId::new(),
        tenant_id: tenant,
        prefix: generated.prefix,
        rate_limit_rps,
        created_at: Utc::now(),
        revoked_at: None,
        last_used_at: None,
    };
    store.keys().insert(&key, &generated.hash).await?;
    Ok(CreatedKey {
        key,
        secret: generated.secret,
    })
}

/// The keys whose display prefix (`fsk_` and 8 characters, as `key list`
/// prints it) is `prefix`, across tenants.
pub async fn keys_with_prefix(
    store: &Storage,
    prefix: &str,
) -> Result<Vec<fastack_entities::ApiKey>> {
    let mut found = Vec::new();
    for tenant in store.tenants().list().await? {
        found.extend(
            store
                .keys()
                .list(tenant.id)
                .await?
                .into_iter()
                .filter(|k| k.prefix == prefix),
        );
    }
    Ok(found)
}

/// Sets a tenant's plan and retention (`None`: the plan's); the tenant as
/// it now is.
pub async fn set_plan(
    store: &Storage,
    tenant: TenantId,
    plan: Plan,
    retention_months: Option<u32>,
) -> Result<Tenant> {
    store
        .tenants()
        .update_plan(tenant, plan, retention_months)
        .await?;
    store
        .tenants()
        .get(tenant)
        .await?
        .ok_or(Error::NotFound { what: "tenant" })
}

/// A key an operator names by its id or by its display prefix (`fsk_` and
/// 8 characters, as `key list` prints them), across tenants. Never a
/// secret: a longer value is refused without being echoed.
pub async fn key_named(store: &Storage, given: &str) -> Result<ApiKeyId> {
    use crate::auth::{DISPLAY_CHARS, KEY_PREFIX};
    if let Ok(id) = given.parse::<ApiKeyId>() {
        return Ok(id);
    }
    let prefix_len = KEY_PREFIX.len() + DISPLAY_CHARS;
    if !given.starts_with(KEY_PREFIX) {
        return Err(Error::InvalidInput(format!(
            "`{given}` is neither a key id (a UUID, the ID column of `fastack admin key list`) \
             nor a key prefix (`{KEY_PREFIX}` and {DISPLAY_CHARS} characters, its PREFIX column)"
        )));
    }
    if given.len() > prefix_len {
        // Never echo what may be a whole secret.
        return Err(Error::InvalidInput(
            "that is longer than a key prefix (it may be the secret itself): pass the key's id \
             or its prefix, as `fastack admin key list` prints them"
                .to_owned(),
        ));
    }
    let keys = keys_with_prefix(store, given).await?;
    match keys.as_slice() {
        [key] => Ok(key.id),
        [] => Err(Error::InvalidInput(format!(
            "no key has the prefix {given} (`fastack admin key list --tenant …` lists them)"
        ))),
        _ => Err(Error::Conflict(format!(
            "{} keys have the prefix {given}; pass the key's id (the ID column of `key list`)",
            keys.len()
        ))),
    }
}

pub async fn revoke_key(store: &Storage, id: ApiKeyId) -> Result<()> {
    if store.keys().revoke(id, Utc::now()).await? {
        Ok(())
    } else {
        Err(Error::NotFound {
            what: "active api key",
        })
    }
}

/// On a database without tenants: tenant `default` and one key. Returns the
/// key when one was created; `None` when a tenant exists, including one
/// another node created meanwhile (tenant names are unique, so of several
/// nodes starting at once on one empty database exactly one creates it).
pub async fn bootstrap(store: &Storage) -> Result<Option<(Tenant, CreatedKey)>> {
    if !store.tenants().list().await?.is_empty() {
        return Ok(None);
    }
    let tenant = match create_tenant(store, "default", Plan::Free, None).await {
        Ok(t) => t,
        Err(Error::Conflict(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let key = create_key(store, tenant.id, None).await?;
    Ok(Some((tenant, key)))
}

/// A node's first start, on any backend (`FASTACK_BOOTSTRAP`): on a
/// database without tenants, [`bootstrap`] and the key written to
/// `<data dir>/bootstrap-key` (owner-only). On a database that has tenants,
/// a `bootstrap-key` file holding a key it does not know (left by a run on
/// another database) is pointed out rather than left to mislead.
pub async fn bootstrap_node(store: &Storage, config: &crate::Config) -> Result<()> {
    let path = config.data_dir.join("bootstrap-key");
    if store.tenants().list().await?.is_empty() {
        // Before anything is created: a data directory that cannot be
        // written fails the start with nothing half made.
        crate::owner_only::ensure_dir(&config.data_dir)?;
        if let Some((tenant, key)) = bootstrap(store).await? {
            crate::owner_only::write_secret(&path, &key.secret)?;
            tracing::info!(
                tenant = %tenant.id,
                path = %path.display(),
                "created tenant `default`; its API key is in the bootstrap-key file"
            );
            return Ok(());
        }
    }
    if let Ok(text) = std::fs::read_to_string(&path)
        && store
            .keys()
            .lookup(&crate::auth::hash_key(text.trim()))
            .await?
            .is_none()
    {
        tracing::warn!(
            path = %path.display(),
            "the bootstrap-key file holds a key this database does not know (left by a run on \
             another database?): delete it; `fastack admin key create` makes a key"
        );
    }
    Ok(())
}

/// A webhook endpoint as shown once at registration (with its secret).
#[derive(Debug, serde::Serialize)]
pub struct CreatedEndpoint {
    #[serde(flatten)]
    pub endpoint: fastack_entities::Endpoint,
    /// `whsec_…`: shown here once, stored encrypted.
    pub secret: String,
    /// Something the operator should know (the host does not resolve yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// Registers an endpoint after checking its URL (scheme, and no private
/// addresses unless allowed).
pub async fn add_webhook(
    store: &Storage,
    keys: &crate::crypto::Keys,
    tenant: fastack_entities::TenantId,
    url: &str,
    events: Option<&str>,
    allow_private: bool,
) -> Result<CreatedEndpoint> {
    use crate::webhooks::{Secret, check_url, parse_events};
    let checked = check_url(url, allow_private).await?;
    let events = parse_events(events)?;
    let url = checked.url;
    let warning = checked.unresolved.then(|| {
        "the host does not resolve now; deliveries fail (and are retried) until it does, \
         and its addresses are checked at every delivery"
            .to_owned()
    });
    let secret = Secret::generate();
    let now = Utc::now();
    let endpoint = fastack_entities::Endpoint {
        id: fastack_entities::EndpointId::new(),
        tenant_id: tenant,
        url,
        events,
        enabled: true,
        disabled_reason: None,
        previous_secret_until: None,
        created_at: now,
        updated_at: now,
    };
    store
        .endpoints()
        .insert(&endpoint, &secret.seal(&keys.webhook_secrets_key()))
        .await?;
    Ok(CreatedEndpoint {
        endpoint,
        secret: secret.to_string(),
        warning,
    })
}

/// A new secret; the old one keeps signing alongside it for 24 hours.
pub async fn rotate_webhook_secret(
    store: &Storage,
    keys: &crate::crypto::Keys,
    id: fastack_entities::EndpointId,
) -> Result<CreatedEndpoint> {
    let secret = crate::webhooks::Secret::generate();
    let now = Utc::now();
    if !store
        .endpoints()
        .rotate_secret(
            id,
            &secret.seal(&keys.webhook_secrets_key()),
            now + crate::webhooks::ROTATION_OVERLAP,
            now,
        )
        .await?
    {
        return Err(Error::NotFound { what: "endpoint" });
    }
    let endpoint = store
        .endpoints()
        .get(id)
        .await?
        .ok_or(Error::NotFound { what: "endpoint" })?;
    Ok(CreatedEndpoint {
        endpoint,
        secret: secret.to_string(),
        warning: None,
    })
}

pub async fn set_webhook_enabled(
    store: &Storage,
    id: fastack_entities::EndpointId,
    enabled: bool,
    reason: Option<&str>,
) -> Result<fastack_entities::Endpoint> {
    if !store
        .deliveries()
        .set_endpoint_enabled(
            id,
            enabled,
            reason.or(Some("disabled by an operator")),
            Utc::now(),
        )
        .await?
    {
        return Err(Error::NotFound { what: "endpoint" });
    }
    store
        .endpoints()
        .get(id)
        .await?
        .ok_or(Error::NotFound { what: "endpoint" })
}

/// Puts a quarantined event back into its tenant's inbox (same event id,
/// so its idempotency key still answers it).
pub async fn retry_quarantined(
    store: &Storage,
    tenant: TenantId,
    event: fastack_entities::EventId,
) -> Result<()> {
    if store.quarantine().retry(tenant, event).await? {
        Ok(())
    } else {
        Err(Error::NotFound {
            what: "quarantined event",
        })
    }
}

/// Discards a quarantined event for good. Its idempotency key stays taken:
/// a retry of the same request answers the same id as a duplicate.
pub async fn drop_quarantined(
    store: &Storage,
    tenant: TenantId,
    event: fastack_entities::EventId,
) -> Result<()> {
    if store.quarantine().discard(tenant, event).await? {
        Ok(())
    } else {
        Err(Error::NotFound {
            what: "quarantined event",
        })
    }
}

/// A time as people type it: RFC 3339, or `YYYY-MM-DD HH:MM[:SS]` in UTC
/// (a space or `T` between date and time, ` UTC` or `Z` after), as the
/// console and `fastack admin deliveries` show them.
pub fn parse_time(raw: &str) -> Result<chrono::DateTime<Utc>> {
    use chrono::{DateTime, NaiveDateTime};
    let raw = raw.trim();
    let plain = raw
        .trim_end_matches(" UTC")
        .trim_end_matches('Z')
        .replacen(' ', "T", 1);
    let plain = plain.as_str();
    DateTime::parse_from_rfc3339(raw)
        .map(|t| t.with_timezone(&Utc))
        .or_else(|_| NaiveDateTime::parse_from_str(plain, "%Y-%m-%dT%H:%M:%S").map(|t| t.and_utc()))
        .or_else(|_| NaiveDateTime::parse_from_str(plain, "%Y-%m-%dT%H:%M").map(|t| t.and_utc()))
        .map_err(|_| {
            Error::InvalidInput(format!(
                "`{raw}` is not a time: write it as RFC 3339 or YYYY-MM-DD HH:MM[:SS] UTC"
            ))
        })
}
