//! What the HTTP handlers share.

use std::sync::Arc;

use fastack_actors::Runtime;
use fastack_core::{
    Config, auth::KeyCache, clock::SharedClock, metrics::Metrics, ratelimit::ClientLimiter,
};

/// Storage is reached only through `runtime` (its `service` methods).
pub struct AppState {
    pub config: Config,
    /// Budget of requests without a valid key, per client address.
    pub unauthenticated: ClientLimiter,
    /// Methods per documented path (the `Allow` header of a 405).
    pub allow: crate::allow::AllowIndex,
    pub runtime: Runtime,
    pub keys: KeyCache,
    pub metrics: Arc<Metrics>,
    pub clock: SharedClock,
}

pub type SharedState = Arc<AppState>;

#[cfg(test)]
mod tests {
    /// The HTTP crate reaches storage through the runtime only: no file
    /// of it names the store or any of its types (what a handler passes to
    /// the runtime is a value of `fastack_core::domain` or of the runtime),
    /// opens one or takes a test's handle.
    #[test]
    fn handlers_hold_no_store() {
        let forbidden = [
            "store::",
            "Storage",
            "store_for_tests",
            "connection_for_tests",
        ];
        let mut stack = vec![std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src"
        ))];
        let mut found = Vec::new();
        let mut files = 0;
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("read api/src") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("state.rs")
                {
                    files += 1;
                    let text = std::fs::read_to_string(&path).expect("read source");
                    for word in forbidden.iter().filter(|w| text.contains(*w)) {
                        found.push(format!("{}: {word}", path.display()));
                    }
                }
            }
        }
        assert!(files > 10, "the walk found the sources ({files})");
        assert!(
            found.is_empty(),
            "storage named in the HTTP crate: {found:#?}"
        );
    }
}
