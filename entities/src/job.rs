//! Jobs: long work (exports, retention archives, erasures, sinks' backfills) that
//! ends in exactly one terminal event.

use std::{fmt, str::FromStr};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ids::{JobId, TenantId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    Export,
    Retention,
    /// Writes a tenant's stored events to the sink its `sink` param names.
    Backfill,
    /// Removes a person from every store (`POST /v1/core/erasures`).
    Erasure,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    Queued,
    Processing,
    Completed,
    Failed,
}

macro_rules! str_enum {
    ($ty:ident { $($variant:ident => $s:literal),* $(,)? }) => {
        impl $ty {
            pub fn as_str(&self) -> &'static str {
                match self {
                    $($ty::$variant => $s),*
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($s => Ok($ty::$variant),)*
                    other => Err(format!(concat!("unknown ", stringify!($ty), " `{}`"), other)),
                }
            }
        }
    };
}

str_enum!(JobKind {
    Export => "export",
    Retention => "retention",
    Backfill => "backfill",
    Erasure => "erasure",
});
str_enum!(JobStatus {
    Queued => "queued",
    Processing => "processing",
    Completed => "completed",
    Failed => "failed",
});

impl JobStatus {
    pub fn is_terminal(&self) -> bool {
        matches!(self, JobStatus::Completed | JobStatus::Failed)
    }
}

/// A job as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub id: JobId,
    pub tenant_id: TenantId,
    pub kind: JobKind,
    pub status: JobStatus,
    /// What to do (export: `{from, to, event?}`).
    pub params: Value,
    /// The caller's metadata; on failure `error.message` (redacted).
    pub metadata: Map<String, Value>,
    pub result: Option<Value>,
    pub execution_time_ms: Option<i64>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The exact JSON of the terminal event (and of `GET /jobs/{id}`) once
    /// the job ended: re-emits send these bytes again.
    pub event_body: Option<String>,
    /// Set with the terminal state; cleared once the event is out.
    pub event_pending: bool,
    /// Runs started (a run whose node died counts).
    pub attempts: u32,
}

fn ts(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The job document: `GET /v1/core/jobs/{id}`, the webhook body and the AMQP
/// body share it. Field order is fixed, so the bytes are stable.
#[derive(Serialize)]
struct JobDoc<'a> {
    job_id: JobId,
    kind: JobKind,
    status: JobStatus,
    metadata: &'a Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    execution_time_ms: Option<i64>,
    created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    completed_at: Option<String>,
}

impl Job {
    /// A new job, queued.
    pub fn queued(
        tenant_id: TenantId,
        kind: JobKind,
        params: Value,
        metadata: Map<String, Value>,
        now: DateTime<Utc>,
    ) -> Job {
        Job {
            id: JobId::new(),
            tenant_id,
            kind,
            status: JobStatus::Queued,
            params,
            metadata,
            result: None,
            execution_time_ms: None,
            created_at: now,
            finished_at: None,
            event_body: None,
            event_pending: false,
            attempts: 0,
        }
    }

    /// The job document. A failed job has no `result` and no
    /// `completed_at`; a terminal job answers its stored event body.
    pub fn document(&self) -> String {
        if let Some(body) = &self.event_body {
            return body.clone();
        }
        self.render()
    }

    /// Renders the document from the fields (used to build the event body).
    pub fn render(&self) -> String {
        let completed = self.status == JobStatus::Completed;
        let doc = JobDoc {
            job_id: self.id,
            kind: self.kind,
            status: self.status,
            metadata: &self.metadata,
            result: if completed {
                self.result.as_ref()
            } else {
                None
            },
            execution_time_ms: if completed {
                self.execution_time_ms
            } else {
                None
            },
            created_at: ts(&self.created_at),
            completed_at: if completed {
                self.finished_at.as_ref().map(ts)
            } else {
                None
            },
        };
        serde_json::to_string(&doc).expect("job document serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(status: JobStatus) -> Job {
        Job {
            id: JobId::new(),
            tenant_id: TenantId::new(),
            kind: JobKind::Export,
            status,
            params: json!({}),
            metadata: json!({"source": "payments"}).as_object().cloned().unwrap(),
            result: Some(json!({"row_count": 3})),
            execution_time_ms: Some(12),
            created_at: "2026-11-30T10:00:00Z".parse().unwrap(),
            finished_at: Some("2026-11-30T10:00:01Z".parse().unwrap()),
            event_body: None,
            event_pending: false,
            attempts: 0,
        }
    }

    #[test]
    fn failed_jobs_have_no_result_and_no_completed_at() {
        let doc: Value = serde_json::from_str(&job(JobStatus::Failed).render()).unwrap();
        assert!(doc.get("result").is_none());
        assert!(doc.get("completed_at").is_none());
        assert_eq!(doc["status"], "failed");
        let doc: Value = serde_json::from_str(&job(JobStatus::Completed).render()).unwrap();
        assert_eq!(doc["result"]["row_count"], 3);
        assert_eq!(doc["completed_at"], "2026-11-30T10:00:01.000Z");
        assert_eq!(doc["execution_time_ms"], 12);
    }
}
