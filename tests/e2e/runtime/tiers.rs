//! A tiered runtime: a plugin serves from its baseline code as soon as it is
//! loaded, its optimized code replaces that for new calls when the
//! background compile ends, a call under way keeps the code it started
//! with, and the cache keeps both tiers for the next start. Which code a
//! call ran is not visible from outside: a call takes the plugin's current
//! code (`Plugin::tier`) when it starts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth::runtime::{
    CallError, CodeCache, Compiler, Deployed, Engines, Limits, Origin, Plugin, Runtime, Tier,
};
use serde_json::json;
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

use super::optimized::{ModelOnDisk, deploy, deploy_call, load, log_reporter, small_model};
use crate::support::plugins;

/// Far above a debug build's Cranelift compile of the misbehave plugin
/// under a loaded test run; a hang guard, not a speed goal.
const OPTIMIZE_GUARD: Duration = Duration::from_secs(90);

/// A deployment that sleeps `ms` in the guest, on its own task.
fn sleeping(
    runtime: &Arc<Runtime>,
    plugin: &Arc<Plugin>,
    model: &Arc<ModelOnDisk>,
    deploy_id: i64,
    ms: u64,
) -> tokio::task::JoinHandle<Result<Deployed, CallError>> {
    let (runtime, plugin, model) = (runtime.clone(), plugin.clone(), model.clone());
    tokio::spawn(async move {
        let out = TempDir::new().unwrap();
        let options = json!({"mode": "sleep", "ms": ms}).to_string();
        let call = deploy_call(&model, out.path(), deploy_id, &options);
        runtime
            .deploy(
                &plugin,
                call,
                log_reporter(deploy_id),
                &CancellationToken::new(),
            )
            .await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_serves_baseline_code_at_once_and_optimized_code_when_ready() {
    let cache = TempDir::new().unwrap();
    // Instances mapped on demand here, pooled in the other runtime tests.
    let runtime = |compiler| {
        let engines = Engines {
            compiler,
            pool: None,
        };
        Runtime::new(
            Limits::default(),
            Some(CodeCache::new(cache.path())),
            engines,
        )
        .unwrap()
    };
    let tiered = Arc::new(runtime(Compiler::Tiered));
    let model = Arc::new(small_model());
    let plugin = Arc::new(load(&tiered, &plugins::test_plugin("misbehave")).await);
    assert_eq!(plugin.origin, Origin::Compiled);
    assert_eq!(
        plugin.tier(),
        Tier::Baseline,
        "a new plugin serves its baseline code first"
    );

    // A deployment under way on the baseline code when the optimized code
    // arrives, however long the optimizer takes: one that ends before is
    // followed by another.
    let waiting = Instant::now();
    let mut deploy_id = 1;
    let mut under_way = sleeping(&tiered, &plugin, &model, deploy_id, 3_000);
    while plugin.tier() != Tier::Optimized {
        tokio::select! {
            ended = &mut under_way => {
                ended.unwrap().expect("a deployment on the baseline code");
                deploy_id += 1;
                under_way = sleeping(&tiered, &plugin, &model, deploy_id, 3_000);
            }
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        assert!(
            waiting.elapsed() < OPTIMIZE_GUARD,
            "the optimized code did not arrive within {OPTIMIZE_GUARD:?}"
        );
    }
    // New calls take the optimized code.
    let (result, _out) = deploy(&tiered, &plugin, &model, 100, json!({"mode": "ok"})).await;
    result.expect("a deployment on the optimized code");
    // The one under way is not disturbed by the swap.
    let deployed = under_way
        .await
        .unwrap()
        .expect("the deployment started before the swap completes");
    assert!(!deployed.reference.is_empty());

    // Both tiers were cached: a tiered start takes the optimized code, a
    // baseline-only start its own, neither compiling.
    for (compiler, tier) in [
        (Compiler::Tiered, Tier::Optimized),
        (Compiler::Baseline, Tier::Baseline),
    ] {
        let again = load(&runtime(compiler), &plugins::test_plugin("misbehave")).await;
        assert_eq!(
            (again.origin, again.tier()),
            (Origin::Cached, tier),
            "{compiler}"
        );
    }
}
