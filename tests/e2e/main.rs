//! End-to-end tests of fastack over real HTTP, against embedded SQLite and
//! against the real PostgreSQL + Redis. One test binary (see helpers.rs for
//! how each test gets its own database, Redis prefix and port).

mod helpers;

mod amqp;
mod compression;
mod conformance;
mod console;
mod durability;
mod erasures;
mod faults;
mod first_hour;
mod hostile;
mod identity;
mod ingest;
mod isolation;
mod mirror;
mod multinode;
mod netfault;
mod operator;
mod ops;
mod partitions;
mod ratelimit;
mod supervision;
mod taxonomy;
mod upgrade;
mod webhooks;
