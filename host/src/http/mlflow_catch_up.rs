//! Catching up on the registries the sources file follows: MLflow sends a
//! webhook once (three quick retries, then never again), so what it sent
//! while berth was down or unreachable would be lost. At start and every
//! `catch_up_s` of its `[[mlflow]]` entry, each server's followed names are
//! read (`NAME`: its versions; `NAME@ALIAS`: the version the alias points
//! at) and what is not registered yet is registered, as the webhook
//! would have. A version registered already costs one lookup of its job id.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ApiContext;
use super::mlflow::register_version;
use crate::mlflow::Server;

/// Who a catch-up's registrations are recorded as made by.
const BY: &str = "MLflow catch-up";

/// Reads every followed server at start and then on its own schedule,
/// until `stop`.
pub async fn run(ctx: ApiContext, stop: CancellationToken) {
    let servers = ctx.mlflow.clone();
    let mut due: Vec<Instant> = servers.iter().map(|_| Instant::now()).collect();
    loop {
        for (server, at) in servers.iter().zip(due.iter_mut()) {
            if *at <= Instant::now() {
                catch_up(&ctx, server).await;
                *at = Instant::now() + server.catch_up;
            }
        }
        let next = due
            .iter()
            .min()
            .copied()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// One reading of `server`: every followed name's versions not yet
/// registered are. A failure is logged with its sentence and the next
/// name is read; the next reading tries again.
async fn catch_up(ctx: &ApiContext, server: &Server) {
    let sources = ctx.fetcher.sources();
    for followed in &server.follow {
        let versions = match &followed.alias {
            None => sources.mlflow_versions(&server.url, &followed.name).await,
            Some(alias) => sources
                .mlflow_alias(&server.url, &followed.name, alias)
                .await
                .map(|v| vec![v]),
        };
        let mut versions = match versions {
            Ok(versions) => versions,
            Err(e) => {
                tracing::warn!("MLflow catch-up of {followed} at {}: {e}", server.url);
                continue;
            }
        };
        // Oldest first, so that models are registered in versions' order.
        versions.sort_by_key(|v| v.parse::<u64>().unwrap_or(u64::MAX));
        for version in versions {
            let alias = followed.alias.as_deref();
            if let Err(e) = register_version(ctx, server, &followed.name, &version, alias, BY).await
            {
                tracing::warn!(
                    "MLflow catch-up of {followed} at {}: version {version}: {}",
                    server.url,
                    e.sentence()
                );
            }
        }
    }
}
