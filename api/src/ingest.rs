//! The accept path after authentication: validate, dedupe within the
//! request, answer duplicates from the tenant's cache, hand the rest to the
//! group commit, answer. The rules applied here are the front door's own
//! (validation, the request's duplicates, the tracking plan's check, the
//! rate limit); identity resolution and storage happen after the commit,
//! in processing.

use std::{collections::HashMap, time::Instant};

use fastack_actors::{IngestError, ItemOutcome};
use fastack_core::{
    domain::{IngestRow, TakenKey},
    taxonomy::{CompiledPlan, Mode, Verdict, keyword_code},
    validate::{
        EnvelopeError, FieldError, MAX_BATCH_ITEMS, MAX_EVENT_BYTES, ValidationContext,
        batch_items, event_from_json, fingerprint, item_pointer,
    },
};
use fastack_entities::{EventKind, NewEvent, TenantId};
use poem::http::StatusCode;

use crate::{
    dto::Ack,
    gate::{ANSWER_MARGIN, Authed, within},
    problem::{ApiError, ProblemCode},
    state::AppState,
};

fn context(state: &AppState, auth: &Authed) -> ValidationContext {
    ValidationContext {
        now: state.clock.now(),
        retention_months: state.config.plans.retention_for(&auth.shared.tenant()),
    }
}

fn conflict(index: Option<usize>, key: &str) -> ApiError {
    let mut err = ApiError::new(
        StatusCode::CONFLICT,
        ProblemCode::IdempotencyKeyConflict,
        format!("idempotency_key `{key}` was already used with a different payload"),
    );
    err.errors.push(FieldError {
        field: format!("{}/idempotency_key", item_pointer(index)),
        index,
        code: "idempotency_key_conflict",
        message: "already used with a different payload".to_owned(),
    });
    err
}

/// The ingest operations, as the front door ([`crate::front_door`]) and
/// the OpenAPI document ([`crate::routes::CoreApi`]) name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Track,
    Identify,
    Batch,
}

impl Operation {
    /// The operation a `POST` to `path` is.
    pub fn of(path: &str) -> Option<Operation> {
        match path {
            "/v1/core/track" => Some(Operation::Track),
            "/v1/core/identify" => Some(Operation::Identify),
            "/v1/core/batch" => Some(Operation::Batch),
            _ => None,
        }
    }

    /// Validates and durably accepts the body: one ack for `track` and
    /// `identify`, one per item, in order, for `batch`.
    pub async fn accept(
        self,
        state: &AppState,
        auth: &Authed,
        bytes: &[u8],
    ) -> Result<Vec<Ack>, ApiError> {
        let (events, batched) = match self {
            Operation::Track => (vec![single(state, auth, bytes, EventKind::Track)?], false),
            Operation::Identify => (
                vec![single(state, auth, bytes, EventKind::Identify)?],
                false,
            ),
            Operation::Batch => (batch(state, auth, bytes)?, true),
        };
        accept(state, auth, events, batched).await
    }
}

/// Validates the single event of `/track` or `/identify`.
pub fn single(
    state: &AppState,
    auth: &Authed,
    bytes: &[u8],
    kind: EventKind,
) -> Result<NewEvent, ApiError> {
    if bytes.len() > MAX_EVENT_BYTES {
        return Err(ApiError::payload_too_large(format!(
            "an event may be at most {MAX_EVENT_BYTES} bytes"
        )));
    }
    let mut errors = Vec::new();
    let ctx = context(state, auth);
    event_from_json(bytes, Some(kind), None, &ctx, &mut errors)
        .map_err(|e| ApiError::invalid_json(format!("request body is not valid JSON: {e}")))?
        .ok_or_else(|| ApiError::validation(errors))
}

/// Validates a batch: 1–500 items, each at most 32 KiB, all valid.
pub fn batch(state: &AppState, auth: &Authed, bytes: &[u8]) -> Result<Vec<NewEvent>, ApiError> {
    let items = batch_items(bytes).map_err(|e| match e {
        EnvelopeError::Json(message) => {
            ApiError::invalid_json(format!("request body is not valid JSON: {message}"))
        }
        EnvelopeError::Shape(field) => ApiError::validation(vec![field]),
    })?;
    if items.is_empty() {
        return Err(ApiError::validation(vec![FieldError {
            field: "/batch".to_owned(),
            index: None,
            code: "invalid_length",
            message: "a batch needs at least one item".to_owned(),
        }]));
    }
    if items.len() > MAX_BATCH_ITEMS {
        return Err(ApiError::bad_request(
            ProblemCode::BatchTooLarge,
            format!(
                "a batch holds at most {MAX_BATCH_ITEMS} items; this one has {}",
                items.len()
            ),
        ));
    }
    let oversize: Vec<FieldError> = items
        .iter()
        .enumerate()
        .filter(|(_, raw)| raw.get().len() > MAX_EVENT_BYTES)
        .map(|(i, _)| FieldError {
            field: item_pointer(Some(i)),
            index: Some(i),
            code: "payload_too_large",
            message: format!("an event may be at most {MAX_EVENT_BYTES} bytes"),
        })
        .collect();
    if !oversize.is_empty() {
        let mut err = ApiError::payload_too_large(format!(
            "{} batch item(s) over {MAX_EVENT_BYTES} bytes",
            oversize.len()
        ));
        err.errors = oversize;
        return Err(err);
    }
    let ctx = context(state, auth);
    let mut errors = Vec::new();
    let mut events = Vec::with_capacity(items.len());
    for (i, raw) in items.into_iter().enumerate() {
        let parsed = event_from_json(raw.get().as_bytes(), None, Some(i), &ctx, &mut errors)
            .map_err(|e| {
                let mut err = ApiError::invalid_json(format!("batch item {i}: {e}"));
                err.errors.push(FieldError {
                    field: item_pointer(Some(i)),
                    index: Some(i),
                    code: "invalid_json",
                    message: e.to_string(),
                });
                err
            })?;
        events.extend(parsed);
    }
    if !errors.is_empty() {
        return Err(ApiError::validation(errors));
    }
    Ok(events)
}

/// Checks the events still to be stored against the tenant's tracking
/// plan: each records the plan version (and, in flag mode, its
/// violations); in enforce mode a violation refuses the whole request. An
/// event the plan refuses whose key the tenant already used for the same
/// content is a duplicate, answered as before the plan changed.
async fn apply_plan(
    state: &AppState,
    tenant: TenantId,
    plan: &CompiledPlan,
    events: &mut [NewEvent],
    alias: &[Option<usize>],
    fps: &[[u8; 32]],
    outcome: &mut [Option<ItemOutcome>],
    batched: bool,
    deadline: Instant,
) -> Result<(), ApiError> {
    let mut refused: Vec<(usize, Vec<FieldError>)> = Vec::new();
    for (i, ev) in events.iter_mut().enumerate() {
        if alias[i].is_some() || outcome[i].is_some() {
            continue;
        }
        let index = batched.then_some(i);
        let at = item_pointer(index);
        match plan.check(ev) {
            Verdict::Conforms => ev.plan = Some(plan.record(Vec::new())),
            Verdict::Violates(v) if plan.mode == Mode::Flag => ev.plan = Some(plan.record(v)),
            Verdict::Violates(v) => refused.push((
                i,
                v.into_iter()
                    .map(|v| FieldError {
                        field: format!("{at}{}", v.field),
                        index,
                        code: keyword_code(&v.code),
                        message: v.message,
                    })
                    .collect(),
            )),
            Verdict::Unplanned => refused.push((
                i,
                vec![FieldError {
                    field: format!("{at}/event"),
                    index,
                    code: "unplanned_event",
                    message: format!(
                        "`{}` is not an event of the tracking plan",
                        ev.event.as_deref().unwrap_or_default()
                    ),
                }],
            )),
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    // Keys already used: the events they answered were accepted under an
    // earlier plan (or none), so these are duplicates, or conflicts.
    let keys: Vec<String> = refused
        .iter()
        .map(|(i, _)| events[*i].idempotency_key.clone())
        .collect();
    let taken: HashMap<String, TakenKey> = within(deadline, "the idempotency key lookup", async {
        Ok(state.runtime.taken_keys(tenant, &keys).await?)
    })
    .await?
    .into_iter()
    .map(|t| (t.key.clone(), t))
    .collect();
    let mut errors = Vec::new();
    let mut unplanned_only = true;
    for (i, errs) in refused {
        match taken.get(&events[i].idempotency_key) {
            Some(t) if t.fingerprint == fps[i] => {
                outcome[i] = Some(ItemOutcome::Duplicate(t.event_id));
            }
            Some(_) => {
                return Err(conflict(batched.then_some(i), &events[i].idempotency_key));
            }
            None => {
                unplanned_only &= errs.iter().all(|e| e.code == "unplanned_event");
                errors.extend(errs);
            }
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    let (code, what) = if unplanned_only {
        (ProblemCode::UnplannedEvent, "is not in the tracking plan")
    } else {
        (ProblemCode::SchemaViolation, "breaks the tracking plan")
    };
    let mut err = ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        code,
        format!(
            "{} {what} (version {}); nothing of the request was accepted",
            if batched { "the batch" } else { "the event" },
            plan.version
        ),
    );
    err.errors = errors;
    Err(err)
}

/// Durably accepts validated events (all or none) and returns one ack per
/// event, in order — within the answer budget (`FASTACK_INGEST_BUDGET_MS`,
/// counted from when the body has been read, plus what the gate spent):
/// past it the answer is `503` and nothing of the request is stored.
pub async fn accept(
    state: &AppState,
    auth: &Authed,
    mut events: Vec<NewEvent>,
    batched: bool,
) -> Result<Vec<Ack>, ApiError> {
    let deadline = Instant::now()
        + state
            .config
            .ingest_budget
            .saturating_sub(ANSWER_MARGIN + auth.gate_time);
    let index_of = |i: usize| batched.then_some(i);
    let now = state.clock.now();
    let tenant_id = auth.shared.tenant().id;
    let fps: Vec<[u8; 32]> = events.iter().map(fingerprint).collect();

    // Same key twice in one request: the later one is a duplicate of the
    // first, or a conflict.
    let mut alias: Vec<Option<usize>> = vec![None; events.len()];
    if events.len() > 1 {
        let mut first: HashMap<&str, usize> = HashMap::with_capacity(events.len());
        for (i, ev) in events.iter().enumerate() {
            match first.get(ev.idempotency_key.as_str()) {
                Some(&j) if fps[j] == fps[i] => alias[i] = Some(j),
                Some(_) => return Err(conflict(index_of(i), &ev.idempotency_key)),
                None => {
                    first.insert(&ev.idempotency_key, i);
                }
            }
        }
    }

    let mut outcome: Vec<Option<ItemOutcome>> = vec![None; events.len()];
    for (i, ev) in events.iter().enumerate() {
        if alias[i].is_some() {
            continue;
        }
        if let Some((id, fp)) = state.runtime.recent_key(tenant_id, &ev.idempotency_key) {
            if fp != fps[i] {
                return Err(conflict(index_of(i), &ev.idempotency_key));
            }
            outcome[i] = Some(ItemOutcome::Duplicate(id));
        }
    }
    if let Some(plan) = state.runtime.plans().get(tenant_id) {
        // Boxed: only tenants with a plan pay for its future's space.
        Box::pin(apply_plan(
            state,
            tenant_id,
            &plan,
            &mut events,
            &alias,
            &fps,
            &mut outcome,
            batched,
            deadline,
        ))
        .await?;
    }

    // The events move into their rows: what follows needs only the count.
    let n = events.len();
    let mut rows = Vec::new();
    let mut row_index = Vec::new();
    for (i, ev) in events.into_iter().enumerate() {
        if alias[i].is_some() || outcome[i].is_some() {
            continue;
        }
        rows.push(IngestRow::new(tenant_id, ev, fps[i], now));
        row_index.push(i);
    }
    if !rows.is_empty() {
        match state.runtime.submit(rows, deadline).await {
            Ok(results) => {
                for (r, i) in results.into_iter().zip(&row_index) {
                    outcome[*i] = Some(r);
                }
            }
            Err(IngestError::Conflict { index, key }) => {
                return Err(conflict(index_of(row_index[index]), &key));
            }
            Err(IngestError::Refused { reason }) => {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    ProblemCode::InvalidPayload,
                    format!(
                        "the event store cannot keep this request's values; nothing of it was accepted ({reason})"
                    ),
                ));
            }
            Err(IngestError::Unavailable) => {
                return Err(ApiError::unavailable(
                    "the event store did not take the events within the answer budget; \
                     nothing was accepted, retry with the same idempotency keys",
                ));
            }
        }
    }
    let mut acks = Vec::with_capacity(n);
    for i in 0..n {
        let o = match alias[i] {
            Some(j) => ItemOutcome::Duplicate(
                outcome[j]
                    .map(|o| o.id())
                    .expect("first occurrence answered"),
            ),
            None => outcome[i].expect("every row answered"),
        };
        acks.push(Ack {
            id: o.id().0,
            duplicate: matches!(o, ItemOutcome::Duplicate(_)),
        });
    }
    Ok(acks)
}
