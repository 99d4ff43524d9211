//! How a job ends, the same whoever ran it (a node's job runner, or
//! `fastack admin retention run` from a shell): the terminal status, the
//! result or the redacted error, the timings. Writing it (exactly once,
//! with its event) is [`crate::store::Jobs::finish`]. The kinds' own work
//! is beside it: exports ([`export`]) and retention ([`retention`]).

pub mod export;
pub mod retention;

use std::time::Duration;

use chrono::{DateTime, Utc};
use fastack_entities::{Job, JobStatus};
use serde_json::{Map, Value, json};

use crate::redact::redact;

/// Sets the job's terminal fields from its outcome: `Ok(result)` completes
/// it, `Err(message)` fails it with `metadata.error.message` (redacted).
pub fn conclude(
    job: &mut Job,
    outcome: Result<Value, String>,
    finished_at: DateTime<Utc>,
    took: Duration,
) {
    job.finished_at = Some(finished_at);
    match outcome {
        Ok(result) => {
            job.status = JobStatus::Completed;
            job.result = Some(result);
            job.execution_time_ms = Some(took.as_millis() as i64);
        }
        Err(message) => {
            job.status = JobStatus::Failed;
            job.result = None;
            set_error(&mut job.metadata, &message);
        }
    }
}

/// `metadata.error = {"message": …}` (redacted), replacing any caller value.
pub fn set_error(metadata: &mut Map<String, Value>, message: &str) {
    metadata.insert("error".to_owned(), json!({ "message": redact(message) }));
}

/// An error with its sources: `a: b: c`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_metadata_replaces_caller_error_and_is_redacted() {
        let mut m: Map<String, Value> = json!({"source": "payments", "error": "caller value"})
            .as_object()
            .cloned()
            .unwrap();
        set_error(
            &mut m,
            "dial tcp 10.0.0.5:5432: connect: connection refused",
        );
        assert_eq!(m["source"], "payments");
        assert_eq!(
            m["error"]["message"],
            "dial tcp [redacted]: connect: connection refused"
        );
    }
}
