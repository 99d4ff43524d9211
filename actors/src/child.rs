//! A child of a node's root: its name and how to start it. Kept apart from
//! the root so the actors that describe themselves as children (relays,
//! periodic work) need not import the root that starts them.

use std::sync::Arc;

use futures::future::BoxFuture;
use ractor::{Actor, ActorCell, ActorProcessingErr};

use crate::context::Ctx;

type Start = Box<
    dyn Fn(Arc<Ctx>, ActorCell) -> BoxFuture<'static, Result<Option<ActorCell>, ActorProcessingErr>>
        + Send
        + Sync,
>;

/// A child of the root: its name (in logs and `fastack_actor_restarts_total`)
/// and how to start it.
pub struct ChildSpec {
    pub name: String,
    pub(crate) start: Start,
}

impl ChildSpec {
    /// A child made by `make`, which says `None` when the child does not run
    /// on this node (the AMQP relay without a broker). The child is
    /// registered as `<name>@<node id>` so the runtime finds it by name.
    pub fn new<A: Actor>(
        name: impl Into<String>,
        make: impl Fn(Arc<Ctx>) -> Option<(A, A::Arguments)> + Send + Sync + 'static,
    ) -> Self {
        let name = name.into();
        let registered = name.clone();
        ChildSpec {
            name,
            start: Box::new(move |ctx, supervisor| {
                let as_name = registered_name(&registered, &ctx);
                let made = make(ctx);
                Box::pin(async move {
                    let Some((actor, args)) = made else {
                        return Ok(None);
                    };
                    let (r, _) =
                        Actor::spawn_linked(Some(as_name), actor, args, supervisor).await?;
                    Ok(Some(r.get_cell()))
                })
            }),
        }
    }
}

/// The name a child of this node is registered under.
pub fn registered_name(child: &str, ctx: &Ctx) -> String {
    format!("{child}@{}", ctx.node_id)
}
