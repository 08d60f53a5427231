//! A tiered runtime: a plugin serves from its baseline code as soon as it is
//! loaded, its optimized code replaces that for new calls when the
//! background compile ends, a call under way keeps the code it started
//! with, and the cache keeps both tiers for the next start.

use std::time::{Duration, Instant};

use berth::runtime::{CodeCache, Compiler, Engines, Limits, Origin, Runtime, Tier};
use serde_json::json;
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

use super::optimized::{deploy, deploy_call, load, log_reporter, small_model};
use crate::support::plugins;

/// Far above a debug build's Cranelift compile of the misbehave plugin
/// under a loaded test run; a hang guard, not a speed goal.
const OPTIMIZE_GUARD: Duration = Duration::from_secs(90);

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
    let tiered = runtime(Compiler::Tiered);
    let model = small_model();
    let plugin = load(&tiered, &plugins::test_plugin("misbehave")).await;
    assert_eq!(plugin.origin, Origin::Compiled);
    assert_eq!(
        plugin.tier(),
        Tier::Baseline,
        "a new plugin serves its baseline code first"
    );

    // A deployment started on the baseline code, outlasting the swap.
    let out = TempDir::new().unwrap();
    let options = json!({"mode": "sleep", "ms": 20_000}).to_string();
    let cancel = CancellationToken::new();
    let long_deploy = tiered.deploy(
        &plugin,
        deploy_call(&model, out.path(), 1, &options),
        log_reporter(1),
        &cancel,
    );
    tokio::pin!(long_deploy);

    let waiting = Instant::now();
    while plugin.tier() != Tier::Optimized {
        tokio::select! {
            ended = &mut long_deploy => panic!(
                "the deployment started on baseline code ended ({ended:?}) before the optimized code arrived, {:?} after loading",
                waiting.elapsed()
            ),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        assert!(
            waiting.elapsed() < OPTIMIZE_GUARD,
            "the optimized code did not arrive within {OPTIMIZE_GUARD:?}"
        );
    }
    // New calls run the optimized code.
    let (result, _out) = deploy(&tiered, &plugin, &model, 2, json!({"mode": "ok"})).await;
    result.expect("a deployment on the optimized code");
    // The one under way is not disturbed by the swap.
    let deployed = long_deploy
        .await
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
