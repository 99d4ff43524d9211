//! `fastack keys …`: the derived keys consumers verify with, and the
//! rotation of the master key the store's root key is wrapped under.

use anyhow::Context;
use clap::Subcommand;
use fastack_core::{
    Config,
    crypto::{KeySource, MasterKey},
};

use super::print::out;

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Print an external HMAC key (hex): the tenant's (verifies export
    /// result HMACs) or, without --tenant, the deployment's (verifies AMQP
    /// message signatures).
    ExternalHmac {
        /// Tenant id or name.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Rotate the master key: the store's root key is wrapped again under a
    /// new master key, after which the store opens with the new key only.
    /// Every key derived from it stays the same (external HMAC keys,
    /// webhook secrets, exports). Embedded without FASTACK_ENC_KEY: a new
    /// key replaces the master-key file. Otherwise: --new-key-file, then
    /// start every node with FASTACK_ENC_KEY set to the new key (running
    /// nodes go on).
    Rotate {
        /// A file holding the new master key (base64, at least 32 bytes:
        /// `head -c 32 /dev/urandom | base64`).
        #[arg(long)]
        new_key_file: Option<std::path::PathBuf>,
    },
}

pub async fn command(config: &Config, cmd: KeysCommand) -> anyhow::Result<()> {
    // The keys of an existing node only: never a new master key (and the
    // current key is checked against the store first).
    let service = super::open(config).await?;
    match cmd {
        KeysCommand::ExternalHmac { tenant } => {
            let key = match tenant {
                None => service.keys().deployment_hmac(),
                Some(t) => {
                    let tenant = service.resolve_tenant(&t).await?;
                    service.keys().tenant_hmac(tenant.id)
                }
            };
            out!("{}", hex_encode(&key))?;
        }
        KeysCommand::Rotate { new_key_file } => {
            let current = MasterKey::load(config)?;
            match new_key_file {
                Some(file) => {
                    let text = std::fs::read_to_string(&file)
                        .with_context(|| format!("reading {}", file.display()))?;
                    let new = MasterKey::from_base64(&text, KeySource::File(file.clone()))?;
                    service.rotate_master_key(&current, &new).await?;
                    out!(
                        "master key rotated: the store opens with the key in {} only; start every \
                         node with FASTACK_ENC_KEY set to it (nodes running now go on)",
                        file.display()
                    )?;
                }
                None => {
                    let new = service.rotate_master_key_file(&current).await?;
                    out!(
                        "master key rotated: {} holds the new key (back it up; the old one no \
                         longer opens this store)",
                        new.names()
                    )?;
                }
            }
        }
    }
    Ok(())
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
