//! fastack's data model: typed ids, plans and the event and contact records
//! that storage, actors and the HTTP surface exchange.

pub mod db;
pub mod ids;
pub mod job;
pub mod model;
pub mod taxonomy;
pub mod webhook;

pub use ids::{
    ApiKeyId, ContactId, DeliveryId, EndpointId, EventId, JobId, NodeId, TenantId, UserId,
};
pub use job::{Job, JobKind, JobStatus};
pub use model::{
    ApiKey, Contact, EventKind, IdentityKind, NewEvent, Plan, PlanCheck, PlanLimits,
    QuarantinedEvent, SchemaViolation, StoredEvent, Tenant, UnknownPlan,
};
pub use taxonomy::PlanVersion;
pub use webhook::{Attempt, Delivery, DeliveryStatus, Endpoint};
