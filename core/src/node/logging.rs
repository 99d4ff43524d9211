//! The node's log, made to stay readable while something is failing:
//!
//! - **repeats are counted, not written**: the first warning or error of a
//!   call site is written; further ones of that call site within
//!   [`REPEAT_WINDOW`] are counted instead, and when the window ends one
//!   line says `… repeated N times in the last 10 s` (a group commit that
//!   fails every 3 ms while the disk is full writes two lines per 10 s,
//!   not three thousand);
//! - **no line is longer than [`MAX_LINE`] bytes**: a longer one is cut and
//!   marked, so a field that should never have carried a body cannot turn
//!   the log into a dump (the line length is the backstop; the rule is
//!   that no log line carries an event, a payload or a message body);
//! - **dependencies' own logs that carry payloads are raised above
//!   `info`**: lapin logs a message the broker returned with its bytes.

use std::{
    collections::HashMap,
    fmt::Write as _,
    io::{self, Write},
    sync::Arc,
    time::{Duration, Instant},
};

use parking_lot::Mutex;
use tracing::{Event, Level, Subscriber, callsite::Identifier, field::Field};
use tracing_subscriber::{
    EnvFilter, Layer, fmt::MakeWriter, layer::Context, prelude::*, registry::Registry,
};

/// How long the repeats of one call site are counted before the count is
/// written.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(10);

/// Longest log line written, in bytes.
pub const MAX_LINE: usize = 512;

/// Where the repeat counts are logged (never counted themselves).
const REPEATS_TARGET: &str = "fastack::log";

/// Directives added to every filter: dependencies' events that would log
/// a message's bytes.
const QUIET: &[&str] = &["lapin::returned_messages=error"];

/// Directives added unless the filter asks for `debug` or `trace`: lines
/// an operator cannot act on (PostgreSQL's notices such as `relation …
/// already exists, skipping`; sea-orm's line per migration, summed up in
/// one `schema migrated` line).
const DEBUG_ONLY: &[&str] = &["sqlx::postgres::notice=warn", "sea_orm_migration=warn"];

/// The directives added to `filter` (see [`QUIET`], [`DEBUG_ONLY`]).
fn added_directives(filter: &str) -> impl Iterator<Item = &'static str> {
    let verbose = filter.contains("debug") || filter.contains("trace");
    QUIET
        .iter()
        .chain(DEBUG_ONLY.iter().filter(move |_| !verbose))
        .copied()
}

/// Installs the node's logger on stderr with `filter` (EnvFilter syntax;
/// an invalid filter falls back to `info`). Call once, in `main`.
pub fn init(filter: &str, ansi: bool) {
    let given = filter;
    let mut filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    for directive in added_directives(given) {
        if let Ok(d) = directive.parse() {
            filter = filter.add_directive(d);
        }
    }
    let repeats = Repeats::default();
    repeats.report_every(Duration::from_secs(1));
    Registry::default()
        .with(filter)
        .with(repeats)
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(ansi)
                .with_writer(Capped(io::stderr)),
        )
        .init();
}

/// One call site's current window.
struct Window {
    started: Instant,
    /// Events counted instead of written.
    suppressed: u64,
    level: Level,
    target: &'static str,
    /// The first event's message, to name what repeated.
    message: String,
}

/// The layer that counts repeats (see the module docs).
#[derive(Clone, Default)]
pub struct Repeats {
    windows: Arc<Mutex<HashMap<Identifier, Window>>>,
}

impl Repeats {
    /// Writes the counts of windows that ended, from a thread of its own
    /// (an event cannot be logged from inside the subscriber).
    fn report_every(&self, every: Duration) {
        let this = self.clone();
        let _ = std::thread::Builder::new()
            .name("fastack-log".to_owned())
            .spawn(move || {
                loop {
                    std::thread::sleep(every);
                    for (level, target, message, count) in this.ended(Instant::now()) {
                        report(level, target, &message, count);
                    }
                }
            });
    }

    /// Windows over at `now`: forgotten (the next event of the call site is
    /// written again), and those that counted repeats returned.
    fn ended(&self, now: Instant) -> Vec<(Level, &'static str, String, u64)> {
        let mut out = Vec::new();
        self.windows.lock().retain(|_, w| {
            if now.duration_since(w.started) < REPEAT_WINDOW {
                return true;
            }
            if w.suppressed > 0 {
                out.push((
                    w.level,
                    w.target,
                    std::mem::take(&mut w.message),
                    w.suppressed,
                ));
            }
            false
        });
        out
    }

    /// Whether an event of `site` is written now (else it is counted).
    fn admit(&self, site: Identifier, event: &Event<'_>, now: Instant) -> bool {
        let mut windows = self.windows.lock();
        match windows.get_mut(&site) {
            Some(w) => {
                w.suppressed += 1;
                false
            }
            None => {
                let meta = event.metadata();
                windows.insert(
                    site,
                    Window {
                        started: now,
                        suppressed: 0,
                        level: *meta.level(),
                        target: meta.target(),
                        message: message_of(event),
                    },
                );
                true
            }
        }
    }
}

impl<S: Subscriber> Layer<S> for Repeats {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        // Warnings and errors repeat under a fault; what is logged at info
        // (a start, a migration applied, a lease taken) is each worth its
        // line.
        if *meta.level() > Level::WARN || meta.target() == REPEATS_TARGET {
            return true;
        }
        self.admit(meta.callsite(), event, Instant::now())
    }
}

fn report(level: Level, target: &str, message: &str, count: u64) {
    let secs = REPEAT_WINDOW.as_secs();
    let times = if count == 1 {
        "once more".to_owned()
    } else {
        format!("{count} times")
    };
    macro_rules! at {
        ($lvl:expr) => {
            tracing::event!(
                target: "fastack::log",
                $lvl,
                repeated = count,
                source = target,
                "{message} … repeated {times} in the last {secs} s"
            )
        };
    }
    match level {
        Level::ERROR => at!(Level::ERROR),
        Level::WARN => at!(Level::WARN),
        Level::INFO => at!(Level::INFO),
        Level::DEBUG => at!(Level::DEBUG),
        _ => at!(Level::TRACE),
    }
}

/// An event's `message` field, at most 160 characters.
fn message_of(event: &Event<'_>) -> String {
    struct Message(String);
    impl tracing::field::Visit for Message {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                let _ = write!(self.0, "{value:?}");
            }
        }
    }
    let mut m = Message(String::new());
    event.record(&mut m);
    cut(&m.0, 160).to_owned()
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A writer that cuts each line (the formatter writes one event per
/// write) to [`MAX_LINE`] bytes.
#[derive(Clone, Copy)]
pub struct Capped<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Capped<M> {
    type Writer = CappedWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        CappedWriter(self.0.make_writer())
    }
}

pub struct CappedWriter<W>(W);

impl<W: Write> Write for CappedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() <= MAX_LINE {
            return self.0.write(buf);
        }
        let text = String::from_utf8_lossy(buf);
        let mut line = cut(&text, MAX_LINE - 20).to_owned();
        line.push_str(" …[line cut]\n");
        self.0.write_all(line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    fn lines(buffer: &Buffer) -> Vec<String> {
        String::from_utf8(buffer.0.lock().clone())
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn repeats_are_counted_then_reported_once_per_window() {
        let buffer = Buffer::default();
        let repeats = Repeats::default();
        let subscriber = Registry::default().with(repeats.clone()).with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(Capped(buffer.clone())),
        );
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..1_000 {
                tracing::warn!(attempt = i, "group commit failed");
            }
            tracing::warn!("another warning");
            let written = lines(&buffer);
            assert_eq!(written.len(), 2, "{written:?}");
            assert!(written[0].contains("group commit failed"));
            assert!(written[1].contains("another warning"));

            // The window ends: one line counts the 999 not written, and
            // the next event is written again.
            let later = Instant::now() + REPEAT_WINDOW;
            for (level, target, message, count) in repeats.ended(later) {
                report(level, target, &message, count);
            }
            tracing::warn!(attempt = 1_000, "group commit failed");
            let written = lines(&buffer);
            assert_eq!(written.len(), 4, "{written:?}");
            assert!(
                written[2].contains("group commit failed … repeated 999 times in the last 10 s"),
                "{}",
                written[2]
            );
            assert!(written[2].contains("WARN"));
            assert!(written[3].contains("attempt=1000"));
        });
    }

    #[test]
    fn info_lines_are_all_written() {
        let buffer = Buffer::default();
        let subscriber = Registry::default().with(Repeats::default()).with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(Capped(buffer.clone())),
        );
        tracing::subscriber::with_default(subscriber, || {
            for name in ["m1", "m2", "m3"] {
                tracing::info!(name, "migration applied");
            }
        });
        assert_eq!(lines(&buffer).len(), 3);
    }

    #[test]
    fn long_lines_are_cut() {
        let buffer = Buffer::default();
        let subscriber = Registry::default().with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(Capped(buffer.clone())),
        );
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(body = %"é".repeat(2_000), "a message with a body");
            tracing::info!("short");
        });
        let written = lines(&buffer);
        assert_eq!(written.len(), 2);
        assert!(written[0].len() <= MAX_LINE, "{}", written[0].len());
        assert!(written[0].ends_with("…[line cut]"));
        assert!(written[1].ends_with("short"));
    }
}
