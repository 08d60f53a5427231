//! `future-version`: a trivial deployer built against `berth:deployer@0.3.0`,
//! so berth's version check can be tested on a plugin from the future.

use berth::deployer::host::{self, Level};
use exports::berth::deployer::plugin::{DeployRequest, DeployResult, DeployerInfo, Guest};

wit_bindgen::generate!({
    world: "deployer",
    // A copy of ../../../wit with only the package version bumped.
    path: "wit",
    generate_all,
});

struct FutureVersion;

impl Guest for FutureVersion {
    fn describe() -> DeployerInfo {
        DeployerInfo {
            description: "Speaks berth:deployer@0.3.0 (berth's version tests)".to_string(),
            options_schema: None,
        }
    }

    fn check_options(_options_json: String) -> Result<(), String> {
        Ok(())
    }

    fn deploy(request: DeployRequest) -> Result<DeployResult, String> {
        // Uses the host import so the component really depends on host@0.3.0.
        host::log(Level::Info, "deploying from the future");
        Ok(DeployResult {
            ref_: format!("future-{}", request.deploy_id),
            details_json: String::new(),
        })
    }
}

export!(FutureVersion);
