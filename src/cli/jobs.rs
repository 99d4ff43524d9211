//! Jobs run where the command is typed (`retention run`, `backfill`,
//! `erasure request --here`): the job runner's own loop
//! (`job_runner::run_here`), watched with a progress bar on a terminal and
//! a line per job otherwise.

use std::{io::IsTerminal, sync::Mutex};

use fastack_actors::{
    Service,
    job_runner::{self, Watch},
};
use fastack_entities::{Job, JobId, JobKind, NodeId, TenantId};

use super::print::out;

/// Claims the jobs of `kind` and runs them here, one after the other, as a
/// node's job runner does (claim renewed, attempts counted, the end
/// recorded with its event), shown in `unit` (what the progress counts).
/// Returns the jobs as they ended.
pub async fn run_jobs_here(
    service: &Service,
    json: bool,
    kind: JobKind,
    unit: &str,
) -> anyhow::Result<Vec<Job>> {
    let env = service.job_env(NodeId::new());
    let shown = Shown {
        kind,
        unit,
        json,
        terminal: std::io::stderr().is_terminal() && !json,
        bar: Mutex::new(None),
        failed_write: Mutex::new(None),
    };
    let ended = job_runner::run_here(&env, kind, &shown).await?;
    // A line that could not be written (the reader went away) fails the
    // command once the claimed jobs have ended.
    if let Some(e) = shown.failed_write.into_inner().unwrap_or_default() {
        return Err(e.into());
    }
    Ok(ended)
}

/// A job queued by this command, once it has ended: a node's runner may
/// have taken it first, so its end is waited for. `what` names it if it
/// vanished.
pub async fn ended(
    service: &Service,
    tenant: TenantId,
    id: JobId,
    what: &str,
) -> anyhow::Result<Job> {
    loop {
        match service.job(tenant, id).await? {
            Some(job) if job.status.is_terminal() => return Ok(job),
            Some(_) => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
            None => anyhow::bail!("{what} {id} vanished"),
        }
    }
}

/// How jobs run here are shown.
struct Shown<'u> {
    kind: JobKind,
    unit: &'u str,
    json: bool,
    terminal: bool,
    bar: Mutex<Option<indicatif::ProgressBar>>,
    failed_write: Mutex<Option<std::io::Error>>,
}

impl Watch for Shown<'_> {
    fn started(&self, job: &Job) {
        let what = match self.kind {
            JobKind::Retention => job.params["partition"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            kind => format!("{kind} {}", job.id),
        };
        if !self.terminal
            && !self.json
            && let Err(e) = out!("running {what}")
        {
            let mut failed = self.failed_write.lock().unwrap_or_else(|p| p.into_inner());
            failed.get_or_insert(e);
        }
        if self.terminal {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template(&format!(
                    "{{msg:32}} [{{bar:40}}] {{pos}}/{{len}} {} ({{eta}})",
                    self.unit
                ))
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar.set_message(what);
            *self.bar.lock().unwrap_or_else(|p| p.into_inner()) = Some(bar);
        }
    }

    fn progress(&self, done: u64, total: u64) {
        if let Some(bar) = &*self.bar.lock().unwrap_or_else(|p| p.into_inner()) {
            bar.set_length(total);
            bar.set_position(done);
        }
    }

    fn ended(&self, _job: &Job) {
        if let Some(bar) = self.bar.lock().unwrap_or_else(|p| p.into_inner()).take() {
            bar.finish_and_clear();
        }
    }
}
