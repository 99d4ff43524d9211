//! Typed identifiers: a tenant id can never be passed where an event id is
//! expected. All are UUIDs on the wire and in storage.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! typed_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
            sea_orm::DeriveValueType,
        )]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        /// Ids are made by us, never by the database.
        impl sea_orm::TryFromU64 for $name {
            fn try_from_u64(_: u64) -> Result<Self, sea_orm::DbErr> {
                Err(sea_orm::DbErr::ConvertFromU64(stringify!($name)))
            }
        }

        impl $name {
            /// A new time-ordered (v7) id.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }

        impl From<Uuid> for $name {
            fn from(value: Uuid) -> Self {
                Self(value)
            }
        }

        impl From<$name> for Uuid {
            fn from(value: $name) -> Self {
                value.0
            }
        }
    };
}

typed_id!(
    /// A tenant: the unit of isolation, rate limiting and retention.
    TenantId
);
typed_id!(
    /// An API key row (not the secret itself).
    ApiKeyId
);
typed_id!(
    /// An accepted event; returned by the 202 and stable across duplicates.
    EventId
);
typed_id!(
    /// A contact (person) resolved from user and anonymous ids.
    ContactId
);
typed_id!(
    /// A server process; owns tenant processing leases.
    NodeId
);
typed_id!(
    /// A long-running job (export, retention archive).
    JobId
);
typed_id!(
    /// A webhook endpoint registered through the admin surface.
    EndpointId
);
typed_id!(
    /// One event for one endpoint; its `webhook-id` is stable across retries.
    DeliveryId
);
typed_id!(
    /// A person who signs in to the account console (never an API key).
    UserId
);

impl DeliveryId {
    /// The Standard Webhooks `webhook-id` of this delivery.
    pub fn webhook_id(&self) -> String {
        format!("msg_{}", self.0.simple())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_strings_and_json() {
        let id = EventId::new();
        let parsed: EventId = id.to_string().parse().unwrap();
        assert_eq!(id, parsed);
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{id}\""));
        assert!("not-a-uuid".parse::<TenantId>().is_err());
    }
}
