//! Failpoints for tests, in debug builds only (a release build ignores
//! them): made to happen at an exact place, not raced.
//!
//! - `BERTH_TEST_LOOP_PANIC=NAME:MS` or `NAME:@PATH`: a supervised loop
//!   panics (`crate::loops`).
//! - `BERTH_TEST_ABORT_AFTER=SITE`: the process aborts right after the
//!   write SITE committed, as a kill -9 there would leave it: `claim`,
//!   `cancel`, `recover`, `expire`, `sweep`.

/// For tests of a loop's death, in debug builds only:
/// `BERTH_TEST_LOOP_PANIC=NAME:MS` makes the loop NAME (`fence`, `rules
/// follower`, …) panic MS milliseconds after it starts;
/// `BERTH_TEST_LOOP_PANIC=NAME:@PATH`, once the file PATH exists.
pub async fn loop_panic(name: &'static str) {
    if !cfg!(debug_assertions) {
        return;
    }
    let Ok(asked) = std::env::var("BERTH_TEST_LOOP_PANIC") else {
        return;
    };
    let Some((which, when)) = asked.rsplit_once(':') else {
        return;
    };
    if which != name {
        return;
    }
    match when.strip_prefix('@') {
        Some(path) => {
            while !std::path::Path::new(path).exists() {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        None => {
            let ms = when.parse().unwrap_or(0);
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
    }
    panic!("BERTH_TEST_LOOP_PANIC asked the {name} to panic");
}

/// Aborts the process if `BERTH_TEST_ABORT_AFTER` names `site`.
pub fn abort_after(site: &str) {
    if cfg!(debug_assertions)
        && std::env::var("BERTH_TEST_ABORT_AFTER").is_ok_and(|asked| asked == site)
    {
        eprintln!("BERTH_TEST_ABORT_AFTER: aborting after {site} committed");
        std::process::abort();
    }
}
