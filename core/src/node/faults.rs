//! Faults a test arms in a running node, to prove what happens when one
//! request or one event cannot be stored: the group commit and the
//! processing transaction fail for exactly the rows named here, with an
//! error classified like a database refusal. Only code can arm them (the
//! tests pass a [`Faults`] to `fastack_api::start`); no setting or
//! environment variable reaches them, and unarmed they cost one atomic
//! load.

use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use parking_lot::RwLock;

use crate::error::{Error, Result};

pub type SharedFaults = Arc<Faults>;

#[derive(Debug, Default)]
pub struct Faults {
    armed: AtomicBool,
    /// Idempotency keys whose group commit fails.
    commit: RwLock<HashSet<String>>,
    /// Idempotency keys whose processing transaction fails.
    process: RwLock<HashSet<String>>,
}

impl Faults {
    pub fn new() -> SharedFaults {
        Arc::default()
    }

    /// Every group commit holding an event with this idempotency key fails.
    pub fn fail_commit_of(&self, key: &str) {
        self.commit.write().insert(key.to_owned());
        self.armed.store(true, Ordering::Release);
    }

    /// Every processing transaction holding this event fails.
    pub fn fail_processing_of(&self, key: &str) {
        self.process.write().insert(key.to_owned());
        self.armed.store(true, Ordering::Release);
    }

    /// Disarms everything.
    pub fn clear(&self) {
        self.commit.write().clear();
        self.process.write().clear();
        self.armed.store(false, Ordering::Release);
    }

    fn check<'a>(
        &self,
        set: &RwLock<HashSet<String>>,
        keys: impl IntoIterator<Item = &'a str>,
        what: &str,
    ) -> Result<()> {
        if !self.armed.load(Ordering::Acquire) {
            return Ok(());
        }
        let set = set.read();
        match keys.into_iter().find(|k| set.contains(*k)) {
            Some(_) => Err(Error::Injected(format!("{what} refused by a test fault"))),
            None => Ok(()),
        }
    }

    pub fn check_commit<'a>(&self, keys: impl IntoIterator<Item = &'a str>) -> Result<()> {
        self.check(&self.commit, keys, "group commit")
    }

    pub fn check_processing<'a>(&self, keys: impl IntoIterator<Item = &'a str>) -> Result<()> {
        self.check(&self.process, keys, "processing")
    }
}
