//! An erasure's work on the database, each step with its part of the
//! report in the same transaction: the person's events partition by
//! partition (the partition key on every statement), contacts and
//! identities, quarantined events, owed outbox rows, stored webhook
//! payloads; and the verification pass that looks for them everywhere
//! again, changing nothing.

use super::*;

impl Erasures<'_> {
    /// The partitions of `tracked_events`, oldest first.
    pub async fn partitions(self) -> Result<Vec<PartitionKey>> {
        self.engine.partition_keys().await
    }

    /// Where the tenant's events are, month by month: a table and the
    /// month's time range, once per table (PostgreSQL's partitioned
    /// `tracked_events` takes a month's range across its classes; SQLite's
    /// tables are a month and a class each), cut to `window`.
    async fn months(
        self,
        window: Window,
    ) -> Result<Vec<(Month, String, (DateTime<Utc>, DateTime<Utc>))>> {
        let mut out: Vec<(Month, String, (DateTime<Utc>, DateTime<Utc>))> = Vec::new();
        for key in self.partitions().await? {
            let Some(range) = window.clamp(key.month.start(), key.month.end()) else {
                continue;
            };
            let table = self.engine.layout().table(&key);
            if !out.iter().any(|(m, t, _)| *m == key.month && *t == table) {
                out.push((key.month, table, range));
            }
        }
        Ok(out)
    }

    /// `{verb} FROM <table> WHERE <the person's events in it, from-to>
    /// {tail}`: the month's time range on the statement (the partition
    /// key), the person's contacts through the contact index.
    fn in_month(
        self,
        verb: &str,
        tail: &str,
        tenant: TenantId,
        table: &str,
        (from, to): (DateTime<Utc>, DateTime<Utc>),
        person: &Person,
    ) -> Q {
        let d = self.d();
        Q::new(format!(
            "{verb} FROM {table}{} WHERE tenant_id = $1 \
             AND occurred_at >= $2 AND occurred_at < $3 AND {} {tail}",
            by_contact(d, table),
            d.in_list("contact_id", 4, ListKind::Uuid)
        ))
        .bind(tenant.0)
        .bind(from)
        .bind(to)
        .bind(person.contact_uuids())
    }

    /// Deletes the person's events, month by month (every statement names
    /// its month's time range: the partition key), and, within a window,
    /// the traits their erased `identify` events set, unless set again
    /// since; then writes `report(events by month, traits)` — one
    /// transaction. Returns the events removed by month.
    pub async fn erase_events(
        self,
        id: JobId,
        tenant: TenantId,
        person: &Person,
        window: Window,
        report: impl FnOnce(&BTreeMap<Month, u64>, u64) -> Value,
    ) -> Result<BTreeMap<Month, u64>> {
        let returning = if window.is_whole() {
            "RETURNING id"
        } else {
            "RETURNING kind, contact_id, properties"
        };
        let months = self.months(window).await?;
        let mut tx = self.db.begin_relaxed().await?;
        let mut erased: BTreeMap<Month, u64> = BTreeMap::new();
        let mut set: Vec<(ContactId, Map<String, Value>)> = Vec::new();
        for (month, table, range) in months {
            let rows = tx
                .fetch(self.in_month("DELETE", returning, tenant, &table, range, person))
                .await?;
            if rows.is_empty() {
                continue;
            }
            *erased.entry(month).or_default() += rows.len() as u64;
            if !window.is_whole() {
                for r in &rows {
                    if r.text("kind")? == "identify"
                        && let Value::Object(t) = r.json("properties")?
                    {
                        set.push((ContactId(r.uuid("contact_id")?), t));
                    }
                }
            }
        }
        let traits = strip_traits(&mut tx, tenant, &set).await?;
        if !erased.is_empty() || traits > 0 {
            save(&mut tx, id, report(&erased, traits)).await?;
        }
        tx.commit().await?;
        Ok(erased)
    }

    /// Deletes the person's contacts and identities, then writes
    /// `report(contacts, identities)` — one transaction.
    pub async fn erase_contacts(
        self,
        id: JobId,
        tenant: TenantId,
        person: &Person,
        report: impl FnOnce(u64, u64) -> Value,
    ) -> Result<()> {
        let mut tx = self.db.begin_relaxed().await?;
        let (contacts, identities) = crate::store::contacts::erase(&mut tx, tenant, person).await?;
        if contacts + identities > 0 {
            save(&mut tx, id, report(contacts, identities)).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Drops the person's quarantined events, then writes `report(n)` —
    /// one transaction. Returns how many (with `act` false, only counts).
    pub async fn erase_quarantine(
        self,
        id: JobId,
        tenant: TenantId,
        matcher: &Matcher,
        act: bool,
        report: impl FnOnce(u64) -> Value,
    ) -> Result<u64> {
        let d = self.d();
        let mut theirs = Vec::new();
        for r in self
            .db
            .read(
                Q::new("SELECT event_id, payload FROM quarantine WHERE tenant_id = $1")
                    .bind(tenant.0),
            )
            .await?
        {
            if payload_matches(matcher, &r.text("payload")?) {
                theirs.push(r.uuid("event_id")?);
            }
        }
        let n = theirs.len() as u64;
        // A row put back in the inbox meanwhile is deleted nowhere here:
        // processing drops it (its person is held).
        if act && !theirs.is_empty() {
            let mut tx = self.db.begin_relaxed().await?;
            tx.execute(
                Q::new(format!(
                    "DELETE FROM quarantine WHERE tenant_id = $1 AND {}",
                    d.in_list("event_id", 2, ListKind::Uuid)
                ))
                .bind(tenant.0)
                .bind(theirs),
            )
            .await?;
            save(&mut tx, id, report(n)).await?;
            tx.commit().await?;
        }
        Ok(n)
    }

    /// The person's events still owed to a sink: a row that only carries
    /// theirs is no longer sent, a grouped row that carries others' too is
    /// written again without theirs; then `report(scrub)` — one
    /// transaction. Nothing changes while a sink holds one of those rows in
    /// a claimed batch ([`OutboxScrub::busy`]): its files are being written
    /// from the rows as they were. With `act` false, only counts.
    pub async fn cancel_outbox(
        self,
        id: JobId,
        tenant: TenantId,
        matcher: &Matcher,
        now: DateTime<Utc>,
        act: bool,
        report: impl FnOnce(&OutboxScrub) -> Value,
    ) -> Result<OutboxScrub> {
        let d = self.d();
        let owed = |lock: &str| {
            Q::new(format!(
                "SELECT id, body FROM outbox WHERE tenant_id = $1 AND topic = $2 \
                 AND routing_key = 'core.event.tracked' ORDER BY id{lock}"
            ))
            .bind(tenant.0)
            .bind(Topic::Core.as_str())
        };
        // A look without locks first: most erasures find nothing owed.
        let (scrub, ..) = owed_scrub(&self.db.read(owed("")).await?, matcher)?;
        if !act || scrub.events_removed == 0 {
            return Ok(scrub);
        }
        let mut tx = self.db.begin_relaxed().await?;
        let rows = tx.fetch(owed(d.lock())).await?;
        let (scrub, cancel, rewrite) = owed_scrub(&rows, matcher)?;
        let touched: Vec<i64> = cancel
            .iter()
            .copied()
            .chain(rewrite.iter().map(|(id, _, _)| *id))
            .collect();
        if touched.is_empty() {
            tx.commit().await?;
            return Ok(scrub);
        }
        let claimed = tx
            .fetch_opt(
                Q::new(format!(
                    "SELECT outbox_id FROM outbox_sinks WHERE {} AND batch IS NOT NULL \
                     AND claimed_until >= $2 LIMIT 1",
                    d.in_list("outbox_id", 1, ListKind::Int)
                ))
                .bind(touched.clone())
                .bind(now),
            )
            .await?;
        if claimed.is_some() {
            tx.commit().await?;
            return Ok(OutboxScrub {
                busy: true,
                ..OutboxScrub::default()
            });
        }
        if !cancel.is_empty() {
            for table_col in [("outbox_sinks", "outbox_id"), ("outbox", "id")] {
                tx.execute(
                    Q::new(format!(
                        "DELETE FROM {} WHERE {}",
                        table_col.0,
                        d.in_list(table_col.1, 1, ListKind::Int)
                    ))
                    .bind(cancel.clone()),
                )
                .await?;
            }
        }
        for (row_id, body, events) in rewrite {
            tx.execute(
                Q::new("UPDATE outbox SET body = $2 WHERE id = $1")
                    .bind(row_id)
                    .bind(body),
            )
            .await?;
            tx.execute(
                Q::new("UPDATE outbox_sinks SET events = $2 WHERE outbox_id = $1")
                    .bind(row_id)
                    .bind(events),
            )
            .await?;
        }
        save(&mut tx, id, report(&scrub)).await?;
        tx.commit().await?;
        Ok(scrub)
    }

    /// Scrubs the stored payloads of the person's `core.event.tracked`
    /// deliveries (the delivery and its attempts stay, the content goes);
    /// those still pending are not sent. Then `report(cancelled,
    /// scrubbed)` — one transaction. With `act` false, only counts.
    pub async fn scrub_deliveries(
        self,
        id: JobId,
        tenant: TenantId,
        person: &Person,
        matcher: &Matcher,
        act: bool,
        report: impl FnOnce(u64, u64) -> Value,
    ) -> Result<u64> {
        let d = self.d();
        let rows = self
            .db
            .read(
                Q::new(format!(
                    "SELECT id, body FROM webhook_deliveries WHERE tenant_id = $1 \
                     AND event_type = 'core.event.tracked' AND body <> '' AND {}",
                    d.in_list(&d.json_member("body", "contact_id"), 2, ListKind::Text)
                ))
                .bind(tenant.0)
                .bind(person.contact_texts()),
            )
            .await?;
        let mut theirs = Vec::new();
        for r in &rows {
            let doc: Value = serde_json::from_str(&r.text("body")?).unwrap_or(Value::Null);
            if matcher.matches_json(&doc) {
                theirs.push(r.uuid("id")?);
            }
        }
        let scrubbed = theirs.len() as u64;
        if act && !theirs.is_empty() {
            let mut tx = self.db.begin_relaxed().await?;
            let cancelled = tx
                .execute(
                    Q::new(format!(
                        "UPDATE webhook_deliveries SET status = 'failed', next_attempt_at = NULL \
                             WHERE status = 'pending' AND {}",
                        d.in_list("id", 1, ListKind::Uuid)
                    ))
                    .bind(theirs.clone()),
                )
                .await?;
            tx.execute(
                Q::new(format!(
                    "UPDATE webhook_deliveries SET body = '' WHERE {}",
                    d.in_list("id", 1, ListKind::Uuid)
                ))
                .bind(theirs),
            )
            .await?;
            save(&mut tx, id, report(cancelled, scrubbed)).await?;
            tx.commit().await?;
        }
        Ok(scrubbed)
    }

    /// Events of the person's the tenant's inbox still holds in `[from,
    /// to]` (none once processing has passed it).
    async fn inbox_matches(
        self,
        tenant: TenantId,
        (from, to): (i64, i64),
        matcher: &Matcher,
    ) -> Result<u64> {
        let payloads = self
            .waiting
            .waiting_payloads(self.db, None, tenant, (from, to), false)
            .await?;
        Ok(payloads
            .iter()
            .filter(|p| payload_matches(matcher, p))
            .count() as u64)
    }

    /// Looks for the person everywhere in the database, changing nothing:
    /// the verification pass.
    pub async fn search(
        self,
        tenant: TenantId,
        person: &Person,
        window: Window,
        inbox: (i64, i64),
        now: DateTime<Utc>,
    ) -> Result<Found> {
        let matcher = Matcher::new(person, window);
        let mut found = Found::default();
        for (_, table, range) in self.months(window).await? {
            let r = self
                .db
                .read_one(self.in_month("SELECT COUNT(*) AS n", "", tenant, &table, range, person))
                .await?;
            found.tracked_events += r.int("n")? as u64;
        }
        if window.is_whole() {
            (found.contacts, found.identities) =
                crate::store::contacts::count(self.db, tenant, person).await?;
        }
        found.inbox = self.inbox_matches(tenant, inbox, &matcher).await?;
        let nothing = |_: u64| Value::Null;
        found.quarantine = self
            .erase_quarantine(JobId(Uuid::nil()), tenant, &matcher, false, nothing)
            .await?;
        found.outbox = self
            .cancel_outbox(JobId(Uuid::nil()), tenant, &matcher, now, false, |_| {
                Value::Null
            })
            .await?
            .events_removed;
        found.webhook_payloads = self
            .scrub_deliveries(
                JobId(Uuid::nil()),
                tenant,
                person,
                &matcher,
                false,
                |_, _| Value::Null,
            )
            .await?;
        Ok(found)
    }
}

/// What owed outbox rows carry of the person: the counts, the rows that
/// carry only their events, and the others with the person's events taken
/// out (id, the body without them, events left).
fn owed_scrub(
    rows: &[Row],
    matcher: &Matcher,
) -> Result<(OutboxScrub, Vec<i64>, Vec<(i64, String, i64)>)> {
    let mut scrub = OutboxScrub::default();
    let (mut cancel, mut rewrite) = (Vec::new(), Vec::new());
    for r in rows {
        let body = r.text("body")?;
        let (mut kept, mut theirs, mut all) = (String::new(), 0u64, 0u64);
        for record in records_in(&body) {
            // A row this build cannot read is left to its sink, which
            // reports it.
            let Ok(record) = record else {
                theirs = 0;
                break;
            };
            all += 1;
            if matcher.matches(
                Some(&record.contact_id),
                record.user_id.as_deref(),
                record.anonymous_id.as_deref(),
                record.occurred_at,
            ) {
                theirs += 1;
            } else {
                write_event_record(&mut kept, &record);
            }
        }
        if theirs == 0 {
            continue;
        }
        scrub.events_removed += theirs;
        let row_id = r.int("id")?;
        if theirs == all {
            scrub.rows_cancelled += 1;
            cancel.push(row_id);
        } else {
            scrub.rows_rewritten += 1;
            rewrite.push((row_id, kept, (all - theirs) as i64));
        }
    }
    Ok((scrub, cancel, rewrite))
}

/// Whether an inbox or quarantine payload is the person's event.
fn payload_matches(matcher: &Matcher, payload: &str) -> bool {
    serde_json::from_str::<Value>(payload).is_ok_and(|doc| matcher.matches_json(&doc))
}

/// Within a window the contact stays, but what an erased `identify` set
/// goes: each trait it set is removed from its contact (and the contact it
/// was merged into) where the contact still holds that value. Returns the
/// traits removed.
async fn strip_traits(
    tx: &mut Tx<'_>,
    tenant: TenantId,
    set: &[(ContactId, Map<String, Value>)],
) -> Result<u64> {
    if set.is_empty() {
        return Ok(0);
    }
    let ids: Vec<Uuid> = set.iter().map(|(c, _)| c.0).collect();
    let mut merged: HashMap<Uuid, Uuid> = HashMap::new();
    let mut traits: BTreeMap<Uuid, Map<String, Value>> = BTreeMap::new();
    let mut survivors = Vec::new();
    for (id, into, t) in crate::store::contacts::traits_of(tx, tenant, ids).await? {
        if let Some(s) = into {
            merged.insert(id, s);
            survivors.push(s);
        }
        traits.insert(id, t);
    }
    survivors.retain(|s| !traits.contains_key(s));
    for (id, _, t) in crate::store::contacts::traits_of(tx, tenant, survivors).await? {
        traits.insert(id, t);
    }
    let mut changed: HashSet<Uuid> = HashSet::new();
    let mut removed = 0u64;
    for (contact, erased) in set {
        for target in [Some(contact.0), merged.get(&contact.0).copied()]
            .into_iter()
            .flatten()
        {
            let Some(current) = traits.get_mut(&target) else {
                continue;
            };
            for (k, v) in erased {
                if current.get(k) == Some(v) {
                    current.remove(k);
                    changed.insert(target);
                    removed += 1;
                }
            }
        }
    }
    for id in changed {
        let t = traits.remove(&id).unwrap_or_default();
        crate::store::contacts::set_traits(tx, tenant, id, t).await?;
    }
    Ok(removed)
}

/// What follows a `tracked_events` table's name so a search by contact
/// uses the contact index: SQLite's planner, without statistics, takes
/// the primary key's month-wide range instead (every row of the month
/// read for one person's); PostgreSQL picks the index by itself.
fn by_contact(d: Dialect, table: &str) -> String {
    match d {
        Dialect::Postgres => String::new(),
        Dialect::Sqlite => format!(" INDEXED BY {table}_contact"),
    }
}
