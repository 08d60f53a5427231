//! berth: hands trained models to deployers written as WebAssembly components.
//!
//! See ARCHITECTURE.md at the repository root for the map.

// Allowed item by item, each with its `SAFETY:` argument, where no safe API
// exists (ARCHITECTURE.md lists them).
#![deny(unsafe_code)]

pub mod artifacts;
pub mod auth;
pub mod backoff;
pub mod catalog;
mod causes;
pub mod cli;
pub mod cloud;
pub mod db;
pub mod deployers;
pub mod events;
pub mod failpoint;
pub mod fetch;
pub mod formats;
mod host_env;
pub mod http;
pub mod human;
pub mod key;
pub mod live;
pub mod loops;
pub mod metrics;
pub mod mlflow;
pub mod model;
pub mod model_trust;
pub mod oci;
pub mod pipeline;
pub mod publish;
pub mod redirects;
pub mod rules;
pub mod runtime;
pub mod s3;
pub mod scrub;
pub mod signing;
mod sources_file;
pub mod space;
pub mod targets;
pub mod trust;

#[cfg(test)]
#[path = "../../tests/tls/tls.rs"]
mod test_tls;

#[cfg(test)]
mod import_cycles;
#[cfg(test)]
mod strategies;
pub mod validate;
pub mod watch;
