//! Benchmark 4a: what a plugin call costs. Through `berth::runtime` (the
//! server's own engine: on-demand allocation), and through an engine built
//! here with the same settings plus or minus wasmtime's pooling allocator,
//! because the runtime has no knob for it yet. The plugin is
//! `target/test-plugins/misbehave.wasm`; with `{"mode":"ok"}` its deploy
//! writes one small file and returns.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use berth::runtime::{Compiler, DeployCall, Engines, LogReporter, Manifest, Runtime};
use tokio_util::sync::CancellationToken;
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::Ctx;
use crate::report::{Table, median, micros, percentile};

/// The deployer world's bindings, kept out of the way of the `berth` crate
/// name (bindgen makes a `berth` module).
mod guest {
    wasmtime::component::bindgen!({
        world: "deployer",
        path: "../wit/0.1.0",
        exports: { default: async },
        with: { "wasi": wasmtime_wasi::p2::bindings },
    });
}

use guest::berth::deployer::types as wit;

const OPTIONS: &str = r#"{"mode":"ok"}"#;

pub fn plugin_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-plugins/misbehave.wasm")
}

struct Sandbox {
    wasi: WasiCtx,
    table: ResourceTable,
}

impl WasiView for Sandbox {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl guest::berth::deployer::host::Host for Sandbox {
    fn log(&mut self, _: guest::berth::deployer::host::Level, _: String) {}
    fn progress(&mut self, _: u64, _: u64, _: String) {}
}

/// The runtime's engine settings, with or without the pooling allocator.
struct Bench {
    engine: Engine,
    pre: guest::DeployerPre<Sandbox>,
}

impl Bench {
    fn new(wasm: &[u8], pooling: bool) -> anyhow::Result<Self> {
        let mut config = Config::new();
        config.epoch_interruption(true);
        if pooling {
            let mut pool = PoolingAllocationConfig::default();
            pool.total_component_instances(64)
                .total_core_instances(256)
                .total_memories(256)
                .total_tables(256)
                .total_stacks(64)
                .max_memory_size(512 << 20);
            config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        }
        let engine = Engine::new(&config)?;
        let component = Component::from_binary(&engine, wasm)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        guest::berth::deployer::host::add_to_linker::<
            Sandbox,
            wasmtime::component::HasSelf<Sandbox>,
        >(&mut linker, |s| s)?;
        let pre = guest::DeployerPre::new(linker.instantiate_pre(&component)?)?;
        Ok(Self { engine, pre })
    }

    fn store(&self, dirs: Option<(&Path, &Path)>) -> anyhow::Result<Store<Sandbox>> {
        let mut wasi = WasiCtxBuilder::new();
        if let Some((model, out)) = dirs {
            wasi.preopened_dir(model, "/model", FsPerms::ReadOnly)?;
            wasi.preopened_dir(out, "/out", FsPerms::ReadWrite)?;
        }
        let mut store = Store::new(
            &self.engine,
            Sandbox {
                wasi: wasi.build(),
                table: ResourceTable::new(),
            },
        );
        store.set_epoch_deadline(u64::MAX / 2);
        Ok(store)
    }

    async fn describe(&self) -> anyhow::Result<()> {
        let mut store = self.store(None)?;
        let instance = self.pre.instantiate_async(&mut store).await?;
        instance
            .berth_deployer_plugin()
            .call_describe(&mut store)
            .await?;
        Ok(())
    }

    async fn deploy(&self, model: &Path, out: &Path) -> anyhow::Result<()> {
        let mut store = self.store(Some((model, out)))?;
        let instance = self.pre.instantiate_async(&mut store).await?;
        let request = wit::DeployRequest {
            deploy_id: 1,
            model: wit::TrainedModel {
                id: 1,
                name: "m".into(),
                job_id: "j".into(),
                base_model: String::new(),
                model_size: String::new(),
                dataset: String::new(),
                num_examples: 0,
                num_train_steps: 0,
                final_loss: None,
                params_json: "{}".into(),
                files: vec![],
            },
            dir: "/model".into(),
            out_dir: "/out".into(),
            options_json: OPTIONS.into(),
        };
        let result = instance
            .berth_deployer_plugin()
            .call_deploy(&mut store, &request)
            .await?;
        result.map_err(anyhow::Error::msg)?;
        Ok(())
    }
}

/// Times `calls` sequential calls; returns (median, p99) in seconds.
async fn time<F, Fut>(calls: usize, mut call: F) -> anyhow::Result<(f64, f64)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    // A few untimed calls first: lazy initialisation is not per-call cost.
    for _ in 0..20 {
        call().await?;
    }
    let mut samples = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        call().await?;
        samples.push(started.elapsed().as_secs_f64());
    }
    Ok((median(&samples), percentile(&samples, 99.0)))
}

fn figure((p50, p99): (f64, f64)) -> String {
    format!("median {} · p99 {}", micros(p50), micros(p99))
}

/// A plugin of 4a, with options its check-options accepts.
struct Subject {
    label: &'static str,
    path: std::path::PathBuf,
    options: &'static str,
}

/// One deployer per language: the no-op Rust test plugin and the Python
/// and JavaScript examples.
fn subjects() -> [Subject; 3] {
    let example =
        |name: &str| Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../plugins/{name}.wasm"));
    [
        Subject {
            label: "misbehave (Rust)",
            path: plugin_path(),
            options: OPTIONS,
        },
        Subject {
            label: "model-card (Python)",
            path: example("model-card"),
            options: "{}",
        },
        Subject {
            label: "safetensors-check (JavaScript)",
            path: example("safetensors-check"),
            options: "{}",
        },
    ]
}

pub async fn calls(ctx: &Ctx) -> anyhow::Result<()> {
    let model_dir = ctx.out_dir.join("plugin/model");
    let out_dir = ctx.out_dir.join("plugin/out");
    std::fs::create_dir_all(&model_dir)?;
    std::fs::create_dir_all(&out_dir)?;
    let cache = berth::runtime::CodeCache::new(ctx.out_dir.join("plugin/cache"));
    let calls = ctx.calls;
    let model = crate::fetch::model(ctx, "none", &[]);
    let reporter = Arc::new(LogReporter::new("misbehave", Some(1)));
    let cancel = CancellationToken::new();

    let mut table = Table::new(&format!(
        "4a. plugin calls through berth::runtime (optimized code, a fresh instance per call), {calls} sequential calls each"
    ));
    let ratio = |base: (f64, f64), ours: (f64, f64)| {
        format!("{:.2}× the median of on-demand", ours.0 / base.0)
    };
    let mut misbehave_wasm = Vec::new();
    for subject in subjects() {
        let wasm = std::fs::read(&subject.path).with_context(|| {
            format!(
                "cannot read {} (run scripts/build-plugins)",
                subject.path.display()
            )
        })?;
        let mut before = None;
        for pool in [None, Some(Engines::DEFAULT_POOL)] {
            let engines = Engines {
                compiler: Compiler::Optimized,
                pool,
            };
            let runtime = Runtime::new(Default::default(), Some(cache.clone()), engines)?;
            let plugin = runtime
                .load("subject", wasm.clone(), Manifest::default(), None)
                .await
                .map_err(anyhow::Error::msg)?;
            let describe = time(calls, || async {
                runtime
                    .describe(&plugin)
                    .await
                    .map(drop)
                    .map_err(|e| anyhow::anyhow!("{e}"))
            })
            .await?;
            let check = time(calls, || async {
                runtime
                    .check_options(&plugin, subject.options)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))
            })
            .await?;
            let deploy = if subject.path == plugin_path() {
                Some(
                    time(calls, || async {
                        let call = DeployCall {
                            deploy_id: 1,
                            model: &model,
                            model_dir: &model_dir,
                            out_dir: &out_dir,
                            record: None,
                            options_json: OPTIONS,
                        };
                        runtime
                            .deploy(&plugin, call, reporter.clone(), &cancel)
                            .await
                            .map(drop)
                            .map_err(|e| anyhow::anyhow!("{e}"))
                    })
                    .await?,
                )
            } else {
                None
            };
            let figures = [
                ("instantiate + describe", Some(describe)),
                ("instantiate + check-options", Some(check)),
                ("instantiate + no-op deploy", deploy),
            ];
            match before {
                None => {
                    for (call, figure_of) in figures {
                        if let Some(f) = figure_of {
                            let what = format!("{}: {call}, on demand", subject.label);
                            table.row(&what, figure(f), "before: memory mapped per call".into());
                        }
                    }
                    before = Some(figures);
                }
                Some(base) => {
                    for ((call, figure_of), (_, base_of)) in figures.into_iter().zip(base) {
                        if let (Some(f), Some(b)) = (figure_of, base_of) {
                            let what = format!("{}: {call}, pooled", subject.label);
                            table.row(&what, figure(f), ratio(b, f));
                        }
                    }
                }
            }
        }
        if subject.path == plugin_path() {
            misbehave_wasm = wasm;
        }
    }

    // The floor: wasmtime alone, with the runtime's engine settings.
    let on_demand = Bench::new(&misbehave_wasm, false)?;
    let pooling = Bench::new(&misbehave_wasm, true)?;
    let describe_on_demand = time(calls, || on_demand.describe()).await?;
    let describe_pooling = time(calls, || pooling.describe()).await?;
    let deploy_on_demand = time(calls, || on_demand.deploy(&model_dir, &out_dir)).await?;
    let deploy_pooling = time(calls, || pooling.deploy(&model_dir, &out_dir)).await?;
    table.row(
        "engine alone, on-demand: instantiate + describe",
        figure(describe_on_demand),
        "the floor (misbehave)".into(),
    );
    table.row(
        "engine alone, pooling: instantiate + describe",
        figure(describe_pooling),
        ratio(describe_on_demand, describe_pooling),
    );
    table.row(
        "engine alone, on-demand: instantiate + no-op deploy",
        figure(deploy_on_demand),
        "the floor (misbehave)".into(),
    );
    table.row(
        "engine alone, pooling: instantiate + no-op deploy",
        figure(deploy_pooling),
        ratio(deploy_on_demand, deploy_pooling),
    );
    table.print();
    Ok(())
}
