//! `other-world`: a valid component that implements an unrelated world, so
//! berth's loader can be tested on something that is not a deployer.

wit_bindgen::generate!({
    world: "greeter",
    path: "wit",
});

struct Greeter;

impl Guest for Greeter {
    fn greet() -> String {
        "hello from a world berth does not know".to_string()
    }
}

export!(Greeter);
