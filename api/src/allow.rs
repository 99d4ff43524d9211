//! Which methods each documented path takes (read from the OpenAPI
//! document once), for the `Allow` header of a 405.

use std::sync::Arc;

/// The documented paths and their methods.
#[derive(Clone, Debug, Default)]
pub struct AllowIndex(Arc<Vec<(Vec<String>, String)>>);

impl AllowIndex {
    pub fn from_spec(spec: &str) -> Self {
        let mut out = Vec::new();
        if let Ok(serde_json::Value::Object(doc)) = serde_json::from_str(spec)
            && let Some(serde_json::Value::Object(paths)) = doc.get("paths")
        {
            for (path, item) in paths {
                let mut methods: Vec<String> = item
                    .as_object()
                    .map(|o| o.keys().map(|m| m.to_ascii_uppercase()).collect())
                    .unwrap_or_default();
                if methods.iter().any(|m| m == "GET") {
                    methods.push("HEAD".to_owned());
                }
                methods.sort();
                let segments = path.split('/').map(str::to_owned).collect();
                out.push((segments, methods.join(", ")));
            }
        }
        AllowIndex(Arc::new(out))
    }

    /// The methods of the documented path `path` matches (`{param}`
    /// segments match anything).
    pub fn methods(&self, path: &str) -> Option<&str> {
        let segments: Vec<&str> = path.split('/').collect();
        self.0.iter().find_map(|(template, methods)| {
            (template.len() == segments.len()
                && template
                    .iter()
                    .zip(&segments)
                    .all(|(t, s)| t == s || (t.starts_with('{') && t.ends_with('}'))))
            .then_some(methods.as_str())
        })
    }
}
