//! What the OpenAPI document says of each path, read from it once: the
//! methods it takes (the `Allow` header of a 405) and the query parameters
//! each operation names (anything else in the query is a typed 400, as an
//! unknown body field is).

use std::sync::Arc;

use poem::http::Method;

use fastack_core::validate::FieldError;

use crate::problem::{ApiError, ProblemCode};

/// One documented path.
#[derive(Debug)]
struct Documented {
    segments: Vec<String>,
    /// `Allow` header value: its methods, and HEAD with GET.
    allow: String,
    /// Each method's query parameter names.
    queries: Vec<(Method, Vec<String>)>,
}

/// The documented paths, their methods and query parameters.
#[derive(Clone, Debug, Default)]
pub struct AllowIndex(Arc<Vec<Documented>>);

impl AllowIndex {
    pub fn from_spec(spec: &str) -> Self {
        let mut out = Vec::new();
        if let Ok(serde_json::Value::Object(doc)) = serde_json::from_str(spec)
            && let Some(serde_json::Value::Object(paths)) = doc.get("paths")
        {
            for (path, item) in paths {
                let Some(item) = item.as_object() else {
                    continue;
                };
                let mut methods: Vec<String> =
                    item.keys().map(|m| m.to_ascii_uppercase()).collect();
                if methods.iter().any(|m| m == "GET") {
                    methods.push("HEAD".to_owned());
                }
                methods.sort();
                let queries = item
                    .iter()
                    .filter_map(|(method, op)| {
                        let method =
                            Method::from_bytes(method.to_ascii_uppercase().as_bytes()).ok()?;
                        let names = op
                            .get("parameters")
                            .and_then(|p| p.as_array())
                            .into_iter()
                            .flatten()
                            .filter(|p| p["in"] == "query")
                            .filter_map(|p| p["name"].as_str().map(str::to_owned))
                            .collect();
                        Some((method, names))
                    })
                    .collect();
                out.push(Documented {
                    segments: path.split('/').map(str::to_owned).collect(),
                    allow: methods.join(", "),
                    queries,
                });
            }
        }
        AllowIndex(Arc::new(out))
    }

    /// The documented path `path` matches (`{param}` segments match
    /// anything).
    fn find(&self, path: &str) -> Option<&Documented> {
        let segments: Vec<&str> = path.split('/').collect();
        self.0.iter().find(|d| {
            d.segments.len() == segments.len()
                && d.segments
                    .iter()
                    .zip(&segments)
                    .all(|(t, s)| t == s || (t.starts_with('{') && t.ends_with('}')))
        })
    }

    /// The methods of the documented path `path` matches.
    pub fn methods(&self, path: &str) -> Option<&str> {
        self.find(path).map(|d| d.allow.as_str())
    }

    /// A `400 invalid_query` naming each query parameter the operation
    /// does not document, with the documented one it is closest to; `None`
    /// when every name is known, or the path or method is not documented
    /// (the router answers those).
    pub fn unknown_query(&self, method: &Method, path: &str, query: &str) -> Option<ApiError> {
        let method = if method == Method::HEAD {
            &Method::GET
        } else {
            method
        };
        let known = &self
            .find(path)?
            .queries
            .iter()
            .find(|(m, _)| m == method)?
            .1;
        let mut errors: Vec<FieldError> = Vec::new();
        for name in url::form_urlencoded::parse(query.as_bytes()).map(|(name, _)| name.into_owned())
        {
            if known.contains(&name) || errors.iter().any(|e| e.field == name) {
                continue;
            }
            let hint =
                fastack_core::validate::did_you_mean(&name, known.iter().map(String::as_str));
            let accepted = if known.is_empty() {
                "this operation takes no query parameters".to_owned()
            } else {
                format!(
                    "this operation takes {}",
                    known
                        .iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            errors.push(FieldError {
                message: format!("unknown query parameter `{name}`{hint}; {accepted}"),
                field: name,
                index: None,
                code: "unknown_parameter",
            });
        }
        if errors.is_empty() {
            return None;
        }
        let detail = if errors.len() == 1 {
            errors[0].message.clone()
        } else {
            format!("{} unknown query parameters", errors.len())
        };
        let mut err = ApiError::bad_request(ProblemCode::InvalidQuery, detail);
        err.errors = errors;
        Some(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> AllowIndex {
        AllowIndex::from_spec(&crate::server::openapi_json())
    }

    #[test]
    fn documented_names_pass_and_others_are_named() {
        let ix = index();
        let get = Method::GET;
        assert!(
            ix.unknown_query(&get, "/v1/core/events", "from=a&to=b&limit=1")
                .is_none()
        );
        let e = ix
            .unknown_query(&get, "/v1/core/events", "from=a&to=b&limt=1")
            .unwrap();
        assert_eq!(e.code, ProblemCode::InvalidQuery);
        assert_eq!(e.errors.len(), 1);
        assert_eq!(e.errors[0].field, "limt");
        assert_eq!(e.errors[0].code, "unknown_parameter");
        assert!(e.detail.contains("did you mean `limit`?"), "{}", e.detail);
        // Undocumented paths are the router's business.
        assert!(ix.unknown_query(&get, "/nowhere", "x=1").is_none());
        // An operation without parameters takes none.
        let e = ix
            .unknown_query(&Method::POST, "/v1/core/track", "debug=1")
            .unwrap();
        assert!(
            e.detail.contains("takes no query parameters"),
            "{}",
            e.detail
        );
        // Repeated names are one error; encoded names are decoded.
        let e = ix
            .unknown_query(&get, "/v1/core/jobs", "x=1&x=2&st%61tus=done")
            .unwrap();
        assert_eq!(e.errors.len(), 1);
    }
}
