//! `fastack admin user …`: the people who sign in to a tenant's account
//! console. Creating a user (or asking for a new link) prints a one-time
//! sign-in link, valid 24 hours, that sets their password.

use clap::Subcommand;
use fastack_actors::Service;
use fastack_core::{
    Config,
    console::{self, Role, Token, User},
};
use serde::Serialize;

use super::print::{Align, Table, print};

#[derive(Subcommand)]
pub enum UserCommand {
    /// Create a console user and print their one-time sign-in link.
    Create {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        email: String,
        /// `owner` (everything) or `viewer` (reads only).
        #[arg(long, default_value = "owner")]
        role: String,
    },
    /// A new one-time link for a user (a forgotten password); their
    /// sessions end.
    Link {
        #[arg(long)]
        email: String,
    },
    /// Console users, of one tenant or all.
    List {
        /// Tenant id or name.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Delete a user (signing them out everywhere).
    Remove {
        #[arg(long)]
        email: String,
    },
}

#[derive(Serialize)]
struct WithLink {
    #[serde(flatten)]
    user: User,
    /// Shown once; only its hash is stored.
    sign_in_link: String,
    link_expires_at: chrono::DateTime<chrono::Utc>,
}

fn with_link(config: &Config, user: User, token: &Token) -> WithLink {
    WithLink {
        user,
        sign_in_link: format!(
            "{}/setup?token={}",
            config.console_base_url(),
            token.as_str()
        ),
        link_expires_at: chrono::Utc::now() + console::LINK_TTL,
    }
}

fn show_link(config: &Config) -> impl FnOnce(&WithLink) -> String + '_ {
    move |w| {
        let mut out = format!(
            "console user {} ({}) of tenant {}\n\n    {}\n\nThis link sets their password; it works once, until {}.",
            w.user.email,
            w.user.role,
            w.user.tenant_id,
            w.sign_in_link,
            w.link_expires_at.format("%Y-%m-%d %H:%M UTC"),
        );
        // This command does not see the server's settings, only its own:
        // say what the link assumes rather than guess what the server does.
        if config.console_listen.is_none() && config.console_url.is_none() {
            out.push_str(&format!(
                "\nThe link assumes the console at {} (the server's FASTACK_CONSOLE_LISTEN=127.0.0.1:8082). \
                 If browsers reach it elsewhere, run this command with the server's FASTACK_CONSOLE_URL.",
                config.console_base_url()
            ));
        }
        out
    }
}

pub async fn command(service: &Service, json: bool, cmd: UserCommand) -> anyhow::Result<()> {
    let config = service.config();
    match cmd {
        UserCommand::Create {
            tenant,
            email,
            role,
        } => {
            let t = service.resolve_tenant(&tenant).await?;
            let (user, token) = service
                .create_console_user(t.id, &email, Role::parse(&role)?)
                .await?;
            print(json, &with_link(config, user, &token), show_link(config))
        }
        UserCommand::Link { email } => {
            let (user, token) = service.reset_console_user(&email).await?;
            print(json, &with_link(config, user, &token), show_link(config))
        }
        UserCommand::List { tenant } => {
            let t = match tenant {
                Some(t) => Some(service.resolve_tenant(&t).await?.id),
                None => None,
            };
            let users = service.console_users(t).await?;
            print(json, &users, |us| {
                let mut table = Table::new(&[
                    ("TENANT", 36, Align::Left),
                    ("ROLE", 6, Align::Left),
                    ("STATE", 8, Align::Left),
                    ("EMAIL", 0, Align::Left),
                ]);
                for u in us {
                    let state = if u.active { "active" } else { "invited" };
                    table.row(&[&u.tenant_id, &u.role, &state, &u.email]);
                }
                table.to_string()
            })
        }
        UserCommand::Remove { email } => {
            let user = service.remove_console_user(&email).await?;
            print(json, &user, |u| format!("console user {} removed", u.email))
        }
    }
}
