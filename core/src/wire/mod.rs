//! What leaves the node, byte for byte: signed webhook deliveries
//! (Standard Webhooks) and CloudEvents on AMQP.

pub mod amqp;
pub mod webhooks;
