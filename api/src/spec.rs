//! The OpenAPI documents as served and committed: poem-openapi's output
//! with what its derive cannot say, and the endpoints that serve a
//! document (`/openapi.json`, `/docs`).
//!
//! The server refuses a member a request body's schema does not name
//! (`unknown_field`), so each object schema a request body reaches says
//! `additionalProperties: false`; free-form maps (`properties`, `traits`,
//! `metadata`) keep their `additionalProperties: {}`. Response schemas
//! stay open: a client must tolerate fields added later.

use std::collections::BTreeSet;

use poem::{Endpoint, EndpointExt, IntoEndpoint, Route, endpoint::make_sync, web::Html};
use serde_json::Value;

/// The document with each object schema a request body reaches closed to
/// unknown members. The text is edited in place (one line per schema), so
/// the document keeps poem-openapi's member order.
pub fn close_request_schemas(spec: &str) -> String {
    let Ok(doc) = serde_json::from_str::<Value>(spec) else {
        return spec.to_owned();
    };
    let schemas = &doc["components"]["schemas"];
    let mut reached = BTreeSet::new();
    let mut stack: Vec<&Value> = Vec::new();
    for item in doc["paths"]
        .as_object()
        .into_iter()
        .flat_map(|p| p.values())
    {
        for op in item.as_object().into_iter().flat_map(|o| o.values()) {
            for media in op["requestBody"]["content"]
                .as_object()
                .into_iter()
                .flat_map(|c| c.values())
            {
                stack.push(&media["schema"]);
            }
        }
    }
    while let Some(schema) = stack.pop() {
        if !schema.is_object() {
            continue;
        }
        if let Some(name) = schema["$ref"]
            .as_str()
            .and_then(|r| r.strip_prefix("#/components/schemas/"))
        {
            if reached.insert(name.to_owned()) {
                stack.push(&schemas[name]);
            }
            continue;
        }
        for key in ["oneOf", "anyOf", "allOf"] {
            stack.extend(schema[key].as_array().into_iter().flatten());
        }
        stack.push(&schema["items"]);
        stack.extend(
            schema["properties"]
                .as_object()
                .into_iter()
                .flat_map(|p| p.values()),
        );
    }
    let mut out = spec.to_owned();
    for name in reached {
        let schema = &schemas[name.as_str()];
        if schema["type"] != "object"
            || schema.get("properties").is_none()
            || schema.get("additionalProperties").is_some()
        {
            continue;
        }
        // poem-openapi prints each component schema at this indentation.
        let opening = format!("\n      \"{name}\": {{\n");
        if let Some(at) = out.find(&opening) {
            let at = at + opening.len();
            out.insert_str(at, "        \"additionalProperties\": false,\n");
        }
    }
    out
}

/// A service's document as served (closed request schemas), and the
/// endpoints that serve it: `/openapi.json` and `/docs` (Swagger UI on
/// that document, not on the one poem-openapi generated).
pub fn documents<T: poem_openapi::OpenApi, W: poem_openapi::Webhook>(
    api: &poem_openapi::OpenApiService<T, W>,
) -> (String, impl Endpoint + use<T, W>, impl Endpoint + use<T, W>) {
    let generated = api.spec();
    let served = close_request_schemas(&generated);
    let page = api.swagger_ui_html().replacen(&generated, &served, 1);
    let (json, docs) = endpoints(served.clone(), page);
    (served, json, docs)
}

/// `/openapi.json` serving `document`, and `/docs` with Swagger UI on it.
fn endpoints(document: String, swagger_html: String) -> (impl Endpoint, impl Endpoint) {
    let json = make_sync(move |_| {
        poem::Response::builder()
            .content_type("application/json")
            .body(document.clone())
    });
    let docs = Route::new().at("/", make_sync(move |_| Html(swagger_html.clone())));
    (json, docs.into_endpoint().map_to_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_schemas_are_closed_and_responses_open() {
        let doc: Value = serde_json::from_str(&crate::server::openapi_json()).unwrap();
        let schemas = &doc["components"]["schemas"];
        for name in [
            "TrackRequest",
            "IdentifyRequest",
            "BatchRequest",
            "ExportRequest",
        ] {
            assert_eq!(schemas[name]["additionalProperties"], false, "{name}");
        }
        // Free-form members stay free-form.
        assert_eq!(
            schemas["TrackRequest"]["properties"]["properties"]["additionalProperties"],
            serde_json::json!({})
        );
        // A response may grow.
        assert!(schemas["Ack"].get("additionalProperties").is_none());
    }
}
