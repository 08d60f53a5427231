//! A push hands its bytes on without copying them: allocations of a
//! plugin's size made on the pushing thread are counted by a watching
//! allocator (this crate's unit tests run under it) while a plugin padded
//! to 32 MiB is pushed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

use super::*;
use crate::runtime::{Compiler, Engines, Limits, PluginSet, Runtime};

/// The system allocator, counting each thread's allocations of at least
/// its `AT_LEAST` bytes (0: none counted).
struct Watched;

thread_local! {
    static AT_LEAST: Cell<usize> = const { Cell::new(0) };
    static LARGE: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is passed to `System` unchanged; the only addition is
// a thread-local counter that allocates nothing.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Watched {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn note(size: usize) {
    // A thread being torn down has no counters left: nothing to note.
    let at_least = AT_LEAST.try_with(Cell::get).unwrap_or(0);
    if at_least > 0 && size >= at_least {
        let _ = LARGE.try_with(|large| large.set(large.get() + 1));
    }
}

#[global_allocator]
static ALLOCATOR: Watched = Watched;

/// `wasm` with a custom section of `padding` bytes appended (a component
/// may carry custom sections anywhere; nothing reads this one).
fn padded(mut wasm: Vec<u8>, padding: usize) -> Vec<u8> {
    let name = b"berth-test-padding";
    let mut section = leb128(name.len());
    section.extend_from_slice(name);
    section.resize(section.len() + padding, 0);
    wasm.push(0);
    wasm.extend(leb128(section.len()));
    wasm.extend(section);
    wasm
}

fn leb128(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

#[test]
fn a_push_does_not_copy_the_plugin() {
    const SIZE: usize = 32 << 20;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-plugins/misbehave.wasm");
    let wasm = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (scripts/build-plugins builds it; make test runs it)",
            path.display()
        )
    });
    let wasm = padded(wasm, SIZE);
    // One thread runs the push and every task it spawns, so each copy the
    // push makes on the runtime is seen; hashing and compiling are on
    // blocking threads, which read the shared bytes.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let large = rt.block_on(async move {
        let (_dir, db) = crate::db::testing::open().await;
        let engines = Engines {
            compiler: Compiler::Baseline,
            pool: None,
        };
        let runtime = Arc::new(Runtime::new(Limits::default(), None, engines).unwrap());
        let deployers = Arc::new(Deployers::new(
            runtime,
            "plugins".into(),
            PluginSet::default(),
        ));
        let events = Events::stored(
            db.clone(),
            "test".into(),
            |_| String::new(),
            &crate::loops::Loops::new(Default::default()),
        );
        let catalog = Catalog::new(db, deployers, events, 10).with_max_plugin_bytes(2 * SIZE);
        let upload = Upload {
            name: "big".into(),
            wasm,
            manifest: None,
            signature: None,
            source: None,
            by: None,
        };
        AT_LEAST.with(|at_least| at_least.set(SIZE));
        let pushed = catalog.push(upload).await;
        AT_LEAST.with(|at_least| at_least.set(0));
        let (plugin, version, _) = pushed.expect("the padded plugin loads");
        assert_eq!(plugin.name, "big");
        assert!(version.size as usize > SIZE, "{}", version.size);
        LARGE.with(Cell::get)
    });
    // sqlx's `Any` driver copies a blob it binds into arguments it owns
    // (`store_version`, seen in a backtrace): that copy is the database
    // driver's; berth's own code must add none (it cloned the whole plugin
    // once before the bytes were shared).
    assert!(
        large <= 1,
        "a push of a {SIZE}-byte plugin made {large} allocations of its size on its thread: \
         berth copies it"
    );
}
