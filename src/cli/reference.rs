//! `fastack openapi` and `fastack config`: the documents and the settings
//! table, printed from the code that serves and loads them (no storage).

use anyhow::Context;
use fastack_core::Config;

use super::print::out;

/// The tenant API's OpenAPI document, or the admin listener's.
pub fn openapi(admin: bool) -> anyhow::Result<()> {
    if admin {
        out!("{}", fastack_api::admin::admin_openapi_json())?;
    } else {
        out!("{}", fastack_api::openapi_json())?;
    }
    Ok(())
}

/// Every setting as a Markdown table: with `defaults`, the README's
/// (default and meaning); else also the value in force and its source.
pub fn config(defaults: bool) -> anyhow::Result<()> {
    let sinks = fastack_actors::sinks::settings();
    if defaults {
        out!("| variable | default | meaning |\n|---|---|---|")?;
        for doc in Config::docs(&sinks) {
            out!("| `{}` | {} | {} |", doc.name, doc.default, doc.meaning)?;
        }
        return Ok(());
    }
    let rows = Config::in_force(std::env::vars(), &sinks).context("reading configuration")?;
    out!("| variable | in force | default | meaning |\n|---|---|---|---|")?;
    for row in rows {
        let in_force = if row.set.is_empty() {
            "default".to_owned()
        } else {
            row.set
                .iter()
                .map(|v| format!("`{}={}` ({})", v.name, v.shown, v.source))
                .collect::<Vec<_>>()
                .join("<br>")
        };
        out!(
            "| `{}` | {in_force} | {} | {} |",
            row.doc.name,
            row.doc.default,
            row.doc.meaning
        )?;
    }
    Ok(())
}
