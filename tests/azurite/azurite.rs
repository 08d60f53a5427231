//! Starts `tests/azurite/serve.js`, Azurite's blob service on a free
//! loopback port, and reads what it printed. Included with `#[path]` by the
//! Azure tests of `host/src/fetch/source` and `host/src/publish`, and the
//! end-to-end tests (`tests/e2e/support`).

#![allow(dead_code)] // each includer uses its part

use std::path::Path;
use std::process::Command;

use object_store::azure::{MicrosoftAzure, MicrosoftAzureBuilder};

// Each server's file stands alone (a test crate includes only those it
// starts), so one that starts several loads this more than once.
#[allow(clippy::duplicate_mod)]
#[path = "../served.rs"]
mod served;

const MISSING: &str = "run scripts/setup test, which installs Azurite into tests/azurite";

/// The running emulator and its development account.
pub struct Azurite {
    /// `http://127.0.0.1:PORT/devstoreaccount1`: the account's endpoint
    /// (path-style, as the emulator serves it).
    pub endpoint: String,
    pub account: String,
    /// The account key, well known (it is in Azurite's documentation): what
    /// a test asserts never reaches an answer or the log.
    pub key: String,
    _served: served::Served,
}

impl Azurite {
    /// Starts an emulator with `containers`; panics, saying what to run,
    /// if Azurite is not installed.
    pub fn start(containers: &[&str]) -> Self {
        let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/azurite");
        assert!(
            here.join("node_modules/azurite/package.json").exists(),
            "Azurite is not installed: {MISSING}"
        );
        let mut command = Command::new("node");
        command.arg(here.join("serve.js")).args(containers);
        let served = served::Served::start(command, "Azurite", MISSING);
        Self {
            endpoint: served.field("endpoint"),
            account: served.field("account"),
            key: served.field("key"),
            _served: served,
        }
    }

    /// A client of `container` with the account key, for putting and
    /// looking at what tests need, apart from berth's own.
    pub fn client(&self, container: &str) -> MicrosoftAzure {
        MicrosoftAzureBuilder::new()
            .with_endpoint(self.endpoint.clone())
            .with_allow_http(true)
            .with_account(&self.account)
            .with_access_key(&self.key)
            .with_container_name(container)
            .build()
            .expect("a client of the emulator")
    }
}
