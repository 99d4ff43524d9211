//! Holds (the identifiers whose events processing drops while their
//! erasure runs) and suppressions (until lifted), kept as hashes.

use super::*;

impl Erasures<'_> {
    /// A tenant's suppressions, newest first; of one identifier when given.
    pub async fn suppressions(
        self,
        tenant: TenantId,
        only: Option<&Subject>,
        limit: u32,
    ) -> Result<Vec<Suppression>> {
        let (filter, kind, sha) = match only.and_then(|s| Some((s.kind.identity()?, s))) {
            Some((kind, s)) => (
                " AND kind = $3 AND sha256 = $4",
                i64::from(kind.as_i16()),
                s.sha256.clone(),
            ),
            None => ("", 0, String::new()),
        };
        let mut q = Q::new(format!(
            "SELECT kind, sha256, request_id, created_at, dropped FROM suppressions \
             WHERE tenant_id = $1{filter} ORDER BY created_at DESC, kind, sha256 LIMIT $2"
        ))
        .bind(tenant.0)
        .bind(i64::from(limit));
        if !filter.is_empty() {
            q = q.bind(kind).bind(sha);
        }
        self.db
            .read(q)
            .await?
            .iter()
            .map(|r| {
                Ok(Suppression {
                    kind: subject_kind(r.int("kind")?)?,
                    sha256: r.text("sha256")?,
                    request_id: JobId(r.uuid("request_id")?),
                    created_at: r.time("created_at")?,
                    dropped: r.int("dropped")?,
                })
            })
            .collect()
    }

    /// Lifts a suppression; whether there was one.
    pub async fn lift(self, tenant: TenantId, subject: &Subject) -> Result<bool> {
        let Some(kind) = subject.kind.identity() else {
            return Ok(false);
        };
        Ok(self
            .db
            .execute(
                Q::new(
                    "DELETE FROM suppressions WHERE tenant_id = $1 AND kind = $2 AND sha256 = $3",
                )
                .bind(tenant.0)
                .bind(i64::from(kind.as_i16()))
                .bind(subject.sha256.clone()),
            )
            .await?
            == 1)
    }
}

/// Holds every identity of the person for erasure `id` (and suppresses
/// them when asked); identities held already are left as they are.
pub(super) async fn hold(
    tx: &mut Tx<'_>,
    tenant: TenantId,
    id: JobId,
    person: &Person,
    suppress: bool,
    now: DateTime<Utc>,
) -> Result<()> {
    let d = tx.dialect();
    let ids: Vec<(i64, String)> = person
        .identities()
        .map(|(kind, v)| (i64::from(kind.as_i16()), sha256_hex(v)))
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    let k = ids.len();
    let kinds = || Col::Int(ids.iter().map(|(kind, _)| *kind).collect());
    let shas = || Col::Text(ids.iter().map(|(_, sha)| sha.clone()).collect());
    tx.insert(d.insert(
        "erasure_holds",
        &[
            ("tenant_id", Col::Uuid(vec![tenant.0; k])),
            ("kind", kinds()),
            ("sha256", shas()),
            ("request_id", Col::Uuid(vec![id.0; k])),
        ],
        "ON CONFLICT DO NOTHING",
    ))
    .await?;
    if suppress {
        tx.insert(d.insert(
            "suppressions",
            &[
                ("tenant_id", Col::Uuid(vec![tenant.0; k])),
                ("kind", kinds()),
                ("sha256", shas()),
                ("request_id", Col::Uuid(vec![id.0; k])),
                ("created_at", Col::Time(vec![now; k])),
            ],
            "ON CONFLICT DO NOTHING",
        ))
        .await?;
    }
    Ok(())
}
