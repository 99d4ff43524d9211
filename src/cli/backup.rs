//! `fastack admin backup` and `restore`: the files of an embedded node,
//! copied while it serves and brought back where no database is (they open
//! no storage: `fastack_core::backup` works on the data directory).

use fastack_core::Config;

use super::print::print;

/// A consistent copy of the node's files to `to`.
pub async fn backup(config: &Config, json: bool, to: &str) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let m = fastack_core::backup::backup(config, to).await?;
    print(json, &m, |m| {
        let mut out = format!(
            "backed up to {to}: {} files, {} bytes, in {:.1} s",
            m.files.len(),
            m.total_bytes(),
            started.elapsed().as_secs_f64()
        );
        if m.master_key == "FASTACK_ENC_KEY" {
            out.push_str(
                "\nthe master key is FASTACK_ENC_KEY, not in the backup: keep it with the backup",
            );
        }
        if let Some(elsewhere) = &m.objects_elsewhere {
            out.push_str(&format!(
                "\nobject storage at {elsewhere} is not in the backup: back it up by its own means"
            ));
        }
        out
    })
}

/// The backup at `from`, checked whole, put in place as this node.
pub async fn restore(config: &Config, json: bool, from: &str) -> anyhow::Result<()> {
    let m = fastack_core::backup::restore(config, from).await?;
    print(json, &m, |m| {
        format!(
            "restored the backup of {} ({} files, {} bytes) into {}; start the node with `fastack serve`",
            m.created_at.to_rfc3339(),
            m.files.len(),
            m.total_bytes(),
            config.data_dir.display()
        )
    })
}
