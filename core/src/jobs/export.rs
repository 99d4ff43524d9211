//! Export jobs: a tenant's events over a time range as NDJSON (one event
//! per line, the JSON of `GET /v1/core/events`), HMAC-SHA256 over the
//! plaintext with the tenant's external HMAC key, stored AES-256-GCM
//! encrypted. Streams page by page: memory stays bounded whatever the size.

use chrono::{DateTime, Utc};
use fastack_entities::{EventId, Job, JobKind, JobStatus, TenantId};
use hmac::{KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{
    crypto::{Encryptor, HmacSha256, Keys},
    error::{Error, Result},
    objects::Objects,
    store::{EventQuery, Store, TimeRange, tracked_body},
};

const PAGE: u32 = 1_000;

/// What an export job was asked to do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExportParams {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
}

pub fn object_path(tenant: TenantId, job: &Job) -> String {
    format!("exports/{tenant}/{}.ndjson", job.id)
}

/// The `result` block of a completed export.
pub fn result_json(path: &str, size_bytes: u64, row_count: u64, hmac_hex: &str) -> Value {
    json!({
        "path": path,
        "size_bytes": size_bytes,
        "row_count": row_count,
        "format": "ndjson",
        "hmac": hmac_hex,
        "integrity": {"algorithm": "HMAC-SHA256", "signature": hmac_hex},
        "protection": {"encrypted": true, "applied_by": "adapter", "mode": "adapter-managed"},
    })
}

/// Runs an export and returns its `result` block.
pub async fn run(store: &Store, objects: &Objects, keys: &Keys, job: &Job) -> Result<Value> {
    let params: ExportParams = serde_json::from_value(job.params.clone())
        .map_err(|e| Error::Corrupt(format!("export parameters: {e}")))?;
    let range = TimeRange::new(params.from, params.to)
        .ok_or_else(|| Error::Corrupt("export range is empty".to_owned()))?;
    let path = object_path(job.tenant_id, job);
    let mut mac = HmacSha256::new_from_slice(&keys.tenant_hmac(job.tenant_id))
        .expect("HMAC takes any key length");
    let mut enc = Encryptor::new(&keys.storage_key());
    let mut writer = objects.writer(&path);
    let mut rows = 0u64;
    let mut size = 0u64;
    let mut after: Option<(DateTime<Utc>, EventId)> = None;
    let outcome: Result<()> = async {
        loop {
            let page = store
                .events()
                .query(&EventQuery {
                    tenant_id: job.tenant_id,
                    range,
                    contact_ids: None,
                    event: params.event.clone(),
                    after,
                    limit: PAGE,
                })
                .await?;
            let mut chunk = Vec::with_capacity(page.len() * 256);
            for ev in &page {
                chunk.extend_from_slice(tracked_body(ev).as_bytes());
                chunk.push(b'\n');
            }
            rows += page.len() as u64;
            size += chunk.len() as u64;
            mac.update(&chunk);
            enc.update(&chunk);
            writer.write(&enc.take_output()).await?;
            match page.last() {
                Some(last) if page.len() == PAGE as usize => {
                    after = Some((last.occurred_at.with_timezone(&Utc), last.id));
                }
                _ => break,
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = outcome {
        writer.abort().await;
        return Err(e);
    }
    writer.write(&enc.finish()).await?;
    writer.finish().await?;
    let hmac_hex = hex::encode(mac.finalize().into_bytes());
    Ok(result_json(&path, size, rows, &hmac_hex))
}

/// The decrypted NDJSON of a completed export.
pub async fn read(objects: &Objects, keys: &Keys, path: &str) -> Result<Vec<u8>> {
    let bytes = objects.get(path).await?;
    crate::crypto::decrypt(&keys.storage_key(), &bytes)
}

/// The `result` block of a job whose result can be downloaded (a completed
/// export); otherwise why not, as a sentence.
pub fn downloadable(job: &Job) -> std::result::Result<&Value, String> {
    match (&job.status, &job.kind, &job.result) {
        (JobStatus::Completed, JobKind::Export, Some(r)) => Ok(r),
        _ => Err(format!(
            "job {} is {}, there is no result to download",
            job.id, job.status
        )),
    }
}

/// The NDJSON of a completed export's `result` block, decrypted and checked
/// against its HMAC (a mismatch is corruption, never served).
pub async fn read_result(
    objects: &Objects,
    keys: &Keys,
    job: &Job,
    result: &Value,
) -> Result<Vec<u8>> {
    let path = result["path"].as_str().unwrap_or_default();
    let plain = read(objects, keys, path).await?;
    let expected = result["hmac"].as_str().unwrap_or_default();
    if !crate::crypto::hmac_verify_hex(&keys.tenant_hmac(job.tenant_id), &[&plain], expected) {
        return Err(Error::Corrupt(format!(
            "export {} does not match its HMAC",
            job.id
        )));
    }
    Ok(plain)
}

/// A completed export's stored result, decrypted; `None` when it is gone.
async fn stored_plain(objects: &Objects, keys: &Keys, path: &str) -> Result<Option<Vec<u8>>> {
    if !objects.exists(path).await? {
        return Ok(None);
    }
    read(objects, keys, path).await.map(Some)
}

/// The events of a completed export's stored result that `pick` wants.
pub async fn count_in_result(
    objects: &Objects,
    keys: &Keys,
    job: &Job,
    pick: &(dyn Fn(&[u8]) -> bool + Sync),
) -> Result<u64> {
    let Some(path) = job.result.as_ref().and_then(|r| r["path"].as_str()) else {
        return Ok(0);
    };
    let Some(plain) = stored_plain(objects, keys, path).await? else {
        return Ok(0);
    };
    Ok(plain
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty() && pick(l))
        .count() as u64)
}

/// Writes a completed export's result (at `path`) again without the
/// events `pick` wants, encrypted, as `to`; reads it back, decrypts it and
/// checks its new HMAC. Returns the events removed and the new `result`
/// block (naming `path`), or `None` (nothing written) when it holds none.
pub async fn rewrite_result(
    objects: &Objects,
    keys: &Keys,
    job: &Job,
    to: &str,
    path: &str,
    pick: &(dyn Fn(&[u8]) -> bool + Sync),
) -> Result<Option<(u64, Value)>> {
    let Some(plain) = stored_plain(objects, keys, path).await? else {
        return Ok(None);
    };
    let (mut kept, mut removed) = (Vec::with_capacity(plain.len()), 0u64);
    for line in plain.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        if pick(line) {
            removed += 1;
        } else {
            kept.extend_from_slice(line);
            kept.push(b'\n');
        }
    }
    if removed == 0 {
        return Ok(None);
    }
    let mut enc = Encryptor::new(&keys.storage_key());
    enc.update(&kept);
    let mut sealed = enc.take_output();
    sealed.extend(enc.finish());
    objects.put(to, sealed).await?;
    Ok(Some((
        removed,
        checked_result(objects, keys, job, to, path).await?,
    )))
}

/// The `result` block of a result staged at `to` for `path`, read back
/// from storage (decrypted, its lines counted, its HMAC computed).
async fn checked_result(
    objects: &Objects,
    keys: &Keys,
    job: &Job,
    to: &str,
    path: &str,
) -> Result<Value> {
    let back = read(objects, keys, to).await?;
    let mut mac = HmacSha256::new_from_slice(&keys.tenant_hmac(job.tenant_id))
        .expect("HMAC takes any key length");
    mac.update(&back);
    let rows = back.iter().filter(|b| **b == b'\n').count() as u64;
    let hmac_hex = hex::encode(mac.finalize().into_bytes());
    Ok(result_json(path, back.len() as u64, rows, &hmac_hex))
}

/// The new `result` block of a rewrite staged at `to` before a crash;
/// `None` when nothing is staged there any more.
pub async fn staged_result(
    objects: &Objects,
    keys: &Keys,
    job: &Job,
    to: &str,
    path: &str,
) -> Result<Option<Value>> {
    if !objects.exists(to).await? {
        return Ok(None);
    }
    checked_result(objects, keys, job, to, path).await.map(Some)
}
