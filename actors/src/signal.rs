//! Signals: "there is work for you" between actors that do not know each
//! other's types. The one who raises holds a [`Signal`]; the actor that
//! listens turns it into one of its own messages with [`Signal::forward`].
//! Raises coalesce (ten raises before the listener runs are one message),
//! every listener sees them, and a signal raised while its listener is
//! restarting is not lost: a listener always runs once when it starts.

use std::time::Duration;

use ractor::{ActorRef, Message};
use tokio::{sync::watch, task::JoinHandle};

#[derive(Clone, Debug)]
pub struct Signal(watch::Sender<u64>);

impl Default for Signal {
    fn default() -> Self {
        Signal(watch::Sender::new(0))
    }
}

impl Signal {
    /// Wakes every listener.
    pub fn raise(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Sends `msg()` to `actor` after each raise, until the actor is gone.
    /// Abort the handle when the actor stops.
    pub fn forward<M: Message>(&self, actor: ActorRef<M>, msg: fn() -> M) -> JoinHandle<()> {
        let mut rx = self.0.subscribe();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                if actor.cast(msg()).is_err() {
                    return;
                }
            }
        })
    }
}

/// What wakes a polling actor: a timer, and a signal when it has one.
/// Kept in the actor's state, so it goes with the state whether the actor
/// stops or fails: no timer outlives its actor.
#[derive(Debug)]
pub struct Wakes(Vec<JoinHandle<()>>);

impl Wakes {
    /// Sends `msg()` to `actor` every `every`, and after each raise of `signal`.
    pub fn start<M: Message>(
        actor: &ActorRef<M>,
        every: Duration,
        signal: Option<&Signal>,
        msg: fn() -> M,
    ) -> Wakes {
        let mut tasks = vec![actor.send_interval(every, msg)];
        if let Some(signal) = signal {
            tasks.push(signal.forward(actor.clone(), msg));
        }
        Wakes(tasks)
    }

    /// Also sends `msg()` after each raise of `signal` (a message of its
    /// own, for an actor that treats the two wakes differently).
    pub fn and_signal<M: Message>(
        mut self,
        actor: &ActorRef<M>,
        signal: &Signal,
        msg: fn() -> M,
    ) -> Wakes {
        self.0.push(signal.forward(actor.clone(), msg));
        self
    }
}

impl Drop for Wakes {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// The signals of a node.
#[derive(Clone, Debug, Default)]
pub struct Signals {
    /// New outbox rows: every sink's relay looks.
    pub outbox: Signal,
    /// New webhook deliveries: the dispatcher looks.
    pub deliveries: Signal,
    /// A job was queued: the runner looks.
    pub jobs: Signal,
    /// Run partition maintenance now (tests that move the clock).
    pub partitions: Signal,
}
