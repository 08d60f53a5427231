//! The sandbox seen from outside: real deployer components on the real
//! wasmtime runtime, through `berth::runtime`'s public API only. Every denial
//! is followed by a good deployment on the same `Runtime`, because a fault
//! that poisons the host would be worse than the fault itself. Never mocks
//! the engine and never reads the runtime's private state. Every case runs
//! on both tiers of compiled code (`optimized::` Cranelift, `baseline::`
//! Winch); `tiers` covers the swap from one to the other, `pool` the
//! instance pool's limit, `targets` the HTTP gate with publishing targets.

mod optimized {
    const COMPILER: berth::runtime::Compiler = berth::runtime::Compiler::Optimized;
    include!("runtime/cases.rs");
}

mod baseline {
    const COMPILER: berth::runtime::Compiler = berth::runtime::Compiler::Baseline;
    include!("runtime/cases.rs");
}

mod pool;
mod targets;
mod tiers;
