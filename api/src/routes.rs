//! The tenant API (`/v1/core/…`) and the ops endpoints, as one poem-openapi
//! service so the committed spec covers all of them.

use chrono::{DateTime, FixedOffset, Utc};
use fastack_core::{
    domain::{EventQuery, TimeRange},
    health::Dependency,
    validate::{FieldError, normalize},
};
use fastack_entities::{ContactId, EventId, IdentityKind, PlanVersion};
use poem::web::Data;
use poem_openapi::{
    ApiResponse, OpenApi, Tags,
    param::{Path, Query},
    payload::{Json, PlainText},
};
use uuid::Uuid;

use crate::{
    body::JsonBody,
    dto::{
        Ack, BatchAck, BatchRequest, ContactOut, DependencyOut, EventOut, EventsPage, Health,
        IdentifyRequest, Readiness, Timestamp, TrackRequest, TrackingPlanOut, decode_cursor,
        encode_cursor,
    },
    gate::ApiKeyAuth,
    ingest::Operation,
    problem::{ApiError, Errors, FindErrors, GetErrors, IngestErrors, ListErrors, ProblemCode},
    state::SharedState,
};

#[derive(Tags)]
enum Tag {
    /// Send events: answered 202 once durably queued.
    Ingest,
    /// Read what was processed.
    Read,
    /// Health, readiness and metrics.
    Ops,
}

#[derive(ApiResponse)]
pub enum Accepted {
    /// Durably queued (or a duplicate of an earlier event). Processing has
    /// not happened yet: read-after-write is not guaranteed.
    #[oai(status = 202)]
    Accepted(Json<Ack>),
}

#[derive(ApiResponse)]
pub enum BatchAccepted {
    /// Every item durably queued (or a duplicate), in request order.
    #[oai(status = 202)]
    Accepted(Json<BatchAck>),
}

#[derive(ApiResponse)]
pub enum Ready {
    /// The database answers (`ready`, or `degraded` while another
    /// dependency is down).
    #[oai(status = 200)]
    Ready(Json<Readiness>),
    /// The database does not answer.
    #[oai(status = 503)]
    NotReady(Json<Readiness>),
}

pub const DEFAULT_PAGE: u32 = 100;
pub const MAX_PAGE: u32 = 1000;

/// The tenant API. Its ingest operations (`track`, `identify`, `batch`)
/// are served by the front door ([`crate::front_door`]) with the same
/// [`Operation::accept`] before the router is reached; they are declared
/// here for the document, and answer the same way here.
pub struct CoreApi;

#[OpenApi]
impl CoreApi {
    /// Track an event
    ///
    /// Authenticates, validates, rate-limits, durably queues and answers
    /// 202 with the event id. Same `idempotency_key` and content: the
    /// original id with `duplicate: true`. Same key, other content: 409.
    #[oai(
        path = "/v1/core/track",
        method = "post",
        operation_id = "track",
        tag = "Tag::Ingest"
    )]
    async fn track(
        &self,
        state: Data<&SharedState>,
        auth: ApiKeyAuth,
        body: JsonBody<TrackRequest>,
    ) -> Result<Accepted, Errors<IngestErrors>> {
        let mut acks = Operation::Track
            .accept(&state, &auth.0, &body.bytes)
            .await?;
        Ok(Accepted::Accepted(Json(acks.remove(0))))
    }

    /// Identify a user
    ///
    /// Links `user_id` and `anonymous_id` (merging their contacts) and
    /// merges `traits` into the contact. Answered like track.
    #[oai(
        path = "/v1/core/identify",
        method = "post",
        operation_id = "identify",
        tag = "Tag::Ingest"
    )]
    async fn identify(
        &self,
        state: Data<&SharedState>,
        auth: ApiKeyAuth,
        body: JsonBody<IdentifyRequest>,
    ) -> Result<Accepted, Errors<IngestErrors>> {
        let mut acks = Operation::Identify
            .accept(&state, &auth.0, &body.bytes)
            .await?;
        Ok(Accepted::Accepted(Json(acks.remove(0))))
    }

    /// Send a batch
    ///
    /// 1–500 track/identify items. All or nothing: one invalid item rejects
    /// the request (422, item indexes in `errors`); 501 items is a 400
    /// `batch_too_large`.
    #[oai(
        path = "/v1/core/batch",
        method = "post",
        operation_id = "batch",
        tag = "Tag::Ingest"
    )]
    async fn batch(
        &self,
        state: Data<&SharedState>,
        auth: ApiKeyAuth,
        body: JsonBody<BatchRequest>,
    ) -> Result<BatchAccepted, Errors<IngestErrors>> {
        let items = Operation::Batch
            .accept(&state, &auth.0, &body.bytes)
            .await?;
        Ok(BatchAccepted::Accepted(Json(BatchAck { items })))
    }

    /// List events
    ///
    /// Events with `from <= occurred_at < to` (both required: they are the
    /// partition key; `to` must be after `from`), ordered by `occurred_at`
    /// then id. One person's events by at most one of `contact_id`,
    /// `user_id` or `anonymous_id` (400 `invalid_query` for more): an id is
    /// resolved to its contact, and a contact includes the contacts merged
    /// into it, so every event of the person is listed, sent under any of
    /// their ids. An id nobody sent answers an empty page.
    #[oai(
        path = "/v1/core/events",
        method = "get",
        operation_id = "list_events",
        tag = "Tag::Read"
    )]
    #[allow(clippy::too_many_arguments)]
    async fn events(
        &self,
        state: Data<&SharedState>,
        auth: ApiKeyAuth,
        /// Inclusive lower bound of `occurred_at` (RFC 3339 with an offset).
        from: Query<DateTime<FixedOffset>>,
        /// Exclusive upper bound of `occurred_at` (RFC 3339 with an offset).
        to: Query<DateTime<FixedOffset>>,
        /// Only this contact's events (and those of contacts merged into it).
        contact_id: Query<Option<Uuid>>,
        /// Only the events of the person with this user id (resolved to
        /// their contact).
        #[oai(validator(min_length = 1, max_length = 255))]
        user_id: Query<Option<String>>,
        /// Only the events of the person with this anonymous id (resolved
        /// to their contact).
        #[oai(validator(min_length = 1, max_length = 255))]
        anonymous_id: Query<Option<String>>,
        /// Only events with this name.
        #[oai(validator(min_length = 1, max_length = 200))]
        event: Query<Option<String>>,
        /// Page size, 1–1000 (default 100).
        #[oai(validator(minimum(value = "1"), maximum(value = "1000")))]
        limit: Query<Option<u32>>,
        /// `next_cursor` of the previous page: only a `next_cursor` this
        /// endpoint returned is accepted.
        #[oai(validator(min_length = 1))]
        cursor: Query<Option<String>>,
    ) -> Result<Json<EventsPage>, Errors<ListErrors>> {
        let mut errors = Vec::new();
        let people = [
            contact_id.0.is_some(),
            user_id.0.is_some(),
            anonymous_id.0.is_some(),
        ];
        if people.iter().filter(|given| **given).count() > 1 {
            errors.push(FieldError {
                field: ["contact_id", "user_id", "anonymous_id"]
                    .iter()
                    .zip(people)
                    .filter(|(_, given)| *given)
                    .map(|(name, _)| *name)
                    .next_back()
                    .unwrap_or_default()
                    .to_owned(),
                index: None,
                code: "invalid_value",
                message: "give at most one of `contact_id`, `user_id` or `anonymous_id`".to_owned(),
            });
        }
        let from = Some(normalize(from.0).with_timezone(&Utc));
        let to = Some(normalize(to.0).with_timezone(&Utc));
        let limit = limit.0.unwrap_or(DEFAULT_PAGE);
        let after = match cursor.0.as_deref() {
            None => None,
            Some(c) => match decode_cursor(c) {
                Some((at, id)) => Some((at, EventId(id))),
                None => {
                    errors.push(FieldError {
                        field: "cursor".to_owned(),
                        index: None,
                        code: "invalid_value",
                        message: "`cursor` is not a cursor returned by this endpoint".to_owned(),
                    });
                    None
                }
            },
        };
        let range = match (from, to) {
            (Some(f), Some(t)) => match TimeRange::new(f, t) {
                Some(r) => Some(r),
                None => {
                    errors.push(FieldError {
                        field: "to".to_owned(),
                        index: None,
                        code: "invalid_value",
                        message: "`to` must be after `from`".to_owned(),
                    });
                    None
                }
            },
            _ => None,
        };
        if !errors.is_empty() {
            let mut err = ApiError::validation(errors);
            err.status = poem::http::StatusCode::BAD_REQUEST;
            err.code = ProblemCode::InvalidQuery;
            return Err(err.into());
        }
        let range = range.expect("checked above");
        let tenant_row = auth.0.shared.tenant();
        let tenant = tenant_row.id;
        // Events past the tenant's retention are not served, even while their
        // partition waits for its archive-and-drop.
        let oldest = fastack_core::retention::cutoff(
            state.clock.now(),
            state.config.plans.retention_for(&tenant_row),
        );
        let Some(range) = TimeRange::new(range.from.max(oldest), range.to) else {
            return Ok(Json(EventsPage {
                events: Vec::new(),
                next_cursor: None,
            }));
        };
        // The person asked for: `Some(None)` is an id nobody sent.
        let by_id = match (user_id.0, anonymous_id.0) {
            (Some(value), _) => Some((IdentityKind::User, value)),
            (None, Some(value)) => Some((IdentityKind::Anonymous, value)),
            (None, None) => None,
        };
        let contact = match (contact_id.0, by_id) {
            (Some(id), _) => Some(Some(ContactId(id))),
            (None, Some((kind, value))) => Some(
                state
                    .runtime
                    .find_contact(tenant, kind, &value)
                    .await?
                    .map(|c| c.id),
            ),
            (None, None) => None,
        };
        let contact_ids = match contact {
            Some(None) => {
                return Ok(Json(EventsPage {
                    events: Vec::new(),
                    next_cursor: None,
                }));
            }
            Some(Some(id)) => {
                let family = state.runtime.contact_family(tenant, id).await?;
                if family.is_empty() {
                    return Ok(Json(EventsPage {
                        events: Vec::new(),
                        next_cursor: None,
                    }));
                }
                Some(family)
            }
            None => None,
        };
        let query = EventQuery {
            tenant_id: tenant,
            range,
            contact_ids,
            event: event.0,
            after,
            limit: limit + 1,
        };
        let mut events = state.runtime.query_events(&query).await?;
        let next_cursor = if events.len() > limit as usize {
            events.truncate(limit as usize);
            events
                .last()
                .map(|e| encode_cursor(e.occurred_at.with_timezone(&Utc), e.id.0))
        } else {
            None
        };
        Ok(Json(EventsPage {
            events: events.into_iter().map(EventOut::from).collect(),
            next_cursor,
        }))
    }

    /// Get the tracking plan in force
    ///
    /// The tenant's tracking plan (read-only: plans are installed by an
    /// operator with `fastack admin taxonomy install` or the admin
    /// listener, never with an API key). 404 when the tenant has none.
    #[oai(
        path = "/v1/core/taxonomy",
        method = "get",
        operation_id = "get_taxonomy",
        tag = "Tag::Read"
    )]
    async fn taxonomy(
        &self,
        state: Data<&SharedState>,
        auth: ApiKeyAuth,
    ) -> Result<Json<TrackingPlanOut>, Errors<GetErrors>> {
        let tenant = auth.0.shared.tenant().id;
        match state.runtime.plan_version(tenant, None).await? {
            Some(PlanVersion {
                version,
                document: Some(document),
                installed_at,
                ..
            }) => Ok(Json(TrackingPlanOut {
                version,
                installed_at: Timestamp::of(&installed_at),
                document,
            })),
            _ => Err(ApiError::not_found("tracking plan").into()),
        }
    }

    /// Get a contact
    ///
    /// A merged contact's id answers the contact it was merged into.
    #[oai(
        path = "/v1/core/contacts/:id",
        method = "get",
        operation_id = "get_contact",
        tag = "Tag::Read"
    )]
    async fn contact(
        &self,
        state: Data<&SharedState>,
        auth: ApiKeyAuth,
        id: Path<String>,
    ) -> Result<Json<ContactOut>, Errors<GetErrors>> {
        let id: Uuid = id.0.parse().map_err(|_| ApiError::not_found("contact"))?;
        let tenant = auth.0.shared.tenant().id;
        state
            .runtime
            .contact(tenant, ContactId(id))
            .await?
            .map(|c| Json(ContactOut::from(c)))
            .ok_or_else(|| ApiError::not_found("contact").into())
    }

    /// Find a contact by user id or anonymous id
    ///
    /// Give exactly one of `user_id` or `anonymous_id` (400 `invalid_query`
    /// otherwise).
    #[oai(
        path = "/v1/core/contacts",
        method = "get",
        operation_id = "find_contact",
        tag = "Tag::Read"
    )]
    async fn find_contact(
        &self,
        state: Data<&SharedState>,
        auth: ApiKeyAuth,
        /// A user id (1–255 characters); not with `anonymous_id`.
        #[oai(validator(min_length = 1, max_length = 255))]
        user_id: Query<Option<String>>,
        /// An anonymous id (1–255 characters); not with `user_id`.
        #[oai(validator(min_length = 1, max_length = 255))]
        anonymous_id: Query<Option<String>>,
    ) -> Result<Json<ContactOut>, Errors<FindErrors>> {
        let (kind, value) = match (user_id.0, anonymous_id.0) {
            (Some(u), None) => (IdentityKind::User, u),
            (None, Some(a)) => (IdentityKind::Anonymous, a),
            _ => {
                return Err(ApiError::bad_request(
                    ProblemCode::InvalidQuery,
                    "give exactly one of `user_id` or `anonymous_id`",
                )
                .into());
            }
        };
        let tenant = auth.0.shared.tenant().id;
        state
            .runtime
            .find_contact(tenant, kind, &value)
            .await?
            .map(|c| Json(ContactOut::from(c)))
            .ok_or_else(|| ApiError::not_found("contact").into())
    }

    /// Liveness
    #[oai(
        path = "/healthz",
        method = "get",
        operation_id = "healthz",
        tag = "Tag::Ops"
    )]
    async fn healthz(&self) -> Json<Health> {
        Json(Health {
            status: "ok".to_owned(),
        })
    }

    /// Readiness: ready when the database answers; every dependency with
    /// its state and last error
    #[oai(
        path = "/readyz",
        method = "get",
        operation_id = "readyz",
        tag = "Tag::Ops"
    )]
    async fn readyz(&self, state: Data<&SharedState>) -> Ready {
        let db = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            state.runtime.storage_ready(),
        )
        .await;
        let health = state.runtime.health();
        match &db {
            Ok(Ok(())) => health.up(Dependency::Database, None),
            Ok(Err(e)) => health.down(Dependency::Database, e),
            Err(_) => health.down(Dependency::Database, "did not answer within 2 s"),
        }
        let dependencies = health
            .snapshot()
            .into_iter()
            .map(|(name, s)| (name.to_owned(), DependencyOut::from(s)))
            .collect();
        match db {
            Ok(Ok(())) => Ready::Ready(Json(Readiness {
                status: if health.degraded() {
                    "degraded"
                } else {
                    "ready"
                }
                .to_owned(),
                dependencies,
            })),
            _ => Ready::NotReady(Json(Readiness {
                status: "database unavailable".to_owned(),
                dependencies,
            })),
        }
    }

    /// Prometheus metrics
    #[oai(
        path = "/metrics",
        method = "get",
        operation_id = "metrics",
        tag = "Tag::Ops"
    )]
    async fn metrics(&self, state: Data<&SharedState>) -> PlainText<String> {
        state
            .metrics
            .ingest_queue_depth
            .set(state.runtime.ingest_depth() as i64);
        PlainText(state.metrics.render())
    }
}
