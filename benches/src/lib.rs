//! Inputs shared by fastack's criterion micro-benchmarks (`benches/`).
//! Run them with `cargo bench -p fastack-benches`; CI only compiles them.

use serde_json::{Value, json};

/// A typical track event as a client sends it.
pub fn typical_track() -> Value {
    json!({
        "event": "Order Completed",
        "user_id": "user-4821",
        "anonymous_id": "7f9c2ba4-e88f-4d1b-9a1e-2c3c7d8b9a10",
        "properties": {
            "order_id": "ord_93jd8",
            "total": 129.9,
            "currency": "EUR",
            "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}],
            "coupon": null
        },
        "occurred_at": "2026-11-30T09:15:00.123+01:00",
        "idempotency_key": "ord_93jd8-completed",
        "sent_at": "2026-11-30T09:15:00.456+01:00"
    })
}
