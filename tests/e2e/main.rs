//! End-to-end tests: the real binary and the real runtime, real plugins
//! built from `examples/` and `tests/plugins/` (run `scripts/build-plugins`
//! first; `make test` does), a real file server on loopback, SQLite and a
//! real PostgreSQL server (`BERTH_TEST_DATABASE_URL`, set by `make test`).

mod support;

mod api;
mod artifacts;
mod auth;
mod backup;
mod catalog;
mod client;
mod cloud_publish;
mod cloud_sources;
mod cluster;
mod config;
mod crash;
mod database_wait;
mod demo;
mod deploy;
mod event_commit;
mod event_log;
mod faults;
mod fetch;
mod formats;
mod gate;
mod hostile;
mod languages;
mod live;
mod logs;
mod loops;
mod metrics;
mod mlflow;
mod model_signatures;
mod network;
mod oci;
mod oci_deployers;
mod oci_publish;
mod openapi;
mod outputs;
mod page;
mod plugin_cli;
mod plugins;
mod proxies;
mod publish;
mod publish_examples;
mod push;
mod queue;
mod ready;
mod register;
mod rules;
mod runtime;
mod s3_publish;
mod scaffold;
mod signatures;
mod soak;
mod sources;
mod space;
mod storage;
mod store;
mod targets;
mod training_runs;
mod webhook;
