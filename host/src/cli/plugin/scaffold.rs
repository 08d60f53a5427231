//! `berth plugin new`: writes a deployer project that builds on its own,
//! outside this repository: its manifest with pinned tools, a copy of the
//! WIT, a Makefile that produces `NAME.wasm`, and a deployer that already
//! checks its options, publishes their schema, reports progress, puts the
//! model and a file of its own into a publishing target when its options
//! name one, and returns a result. The templates are the files under `scaffold/`, compiled in, so
//! the command needs no checkout. Never overwrites a file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;

use crate::runtime::check_name;

#[derive(Debug, clap::Args)]
pub struct NewArgs {
    /// The deployer's name: the build writes NAME.wasm, and a server offers
    /// it as deployer NAME.
    name: String,
    /// The project's language.
    #[arg(long, value_enum)]
    lang: Lang,
    /// Where the project goes (default: ./NAME); it must not exist or be
    /// empty.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Lang {
    /// wit-bindgen, built with cargo for wasm32-wasip2.
    Rust,
    /// componentize-py.
    Python,
    /// componentize-js.
    Js,
}

/// One file of the project: its path there and its text, in which
/// `{{name}}` and the other placeholders of `Names` are filled in.
struct Template {
    path: &'static str,
    text: &'static str,
}

macro_rules! templates {
    ($($path:literal => $source:literal),* $(,)?) => {
        &[$(Template { path: $path, text: include_str!($source) }),*]
    };
}

/// berth's contract, the same files the server is built from.
const WIT: &[Template] = templates![
    "wit/deployer.wit" => "../../../../wit/deployer.wit",
    "wit/deps/clocks.wit" => "../../../../wit/deps/clocks.wit",
    "wit/deps/filesystem.wit" => "../../../../wit/deps/filesystem.wit",
    "wit/deps/io.wit" => "../../../../wit/deps/io.wit",
];

const EVERY_LANGUAGE: &[Template] = templates![
    "example-model/config.json" => "scaffold/common/example-model/config.json",
    "example-model/README.txt" => "scaffold/common/example-model/README.txt",
];

const RUST: &[Template] = templates![
    "Cargo.toml" => "scaffold/rust/Cargo.toml.in",
    "Makefile" => "scaffold/rust/Makefile",
    "README.md" => "scaffold/rust/README.md",
    ".gitignore" => "scaffold/rust/gitignore",
    "src/lib.rs" => "scaffold/rust/src/lib.rs",
    "src/options.rs" => "scaffold/rust/src/options.rs",
];

const PYTHON: &[Template] = templates![
    "app.py" => "scaffold/python/app.py",
    "options.py" => "scaffold/python/options.py",
    "requirements.txt" => "scaffold/python/requirements.txt",
    "Makefile" => "scaffold/python/Makefile",
    "README.md" => "scaffold/python/README.md",
    ".gitignore" => "scaffold/python/gitignore",
];

const JS: &[Template] = templates![
    "app.js" => "scaffold/js/app.js",
    "files.js" => "scaffold/js/files.js",
    "options.js" => "scaffold/js/options.js",
    "package.json" => "scaffold/js/package.json",
    // The example's lock, so a scaffold installs exactly the componentize-js
    // that berth's own JavaScript example is built and tested with.
    "package-lock.json" => "../../../../examples/safetensors-check/package-lock.json",
    "Makefile" => "scaffold/js/Makefile",
    "README.md" => "scaffold/js/README.md",
    ".gitignore" => "scaffold/js/gitignore",
];

impl Lang {
    fn templates(self) -> &'static [Template] {
        match self {
            Lang::Rust => RUST,
            Lang::Python => PYTHON,
            Lang::Js => JS,
        }
    }

    /// What to run in the project to build it and try it.
    fn next_steps(self, name: &str) -> String {
        let build = match self {
            Lang::Rust => "rustup target add wasm32-wasip2   # once per machine\n  make",
            Lang::Python => "make    # the first time, makes .venv/ with componentize-py 0.25.1",
            Lang::Js => "make    # the first time, runs npm ci for componentize-js",
        };
        format!(
            "  {build}\n  berth plugin run {name}.wasm --dir example-model --options '{{\"note\": \"hi\"}}'"
        )
    }
}

/// The names a project derives from the deployer's.
struct Names<'a> {
    name: &'a str,
    /// Cargo's package name: no `.`, and not starting with a digit.
    krate: String,
    /// The file cargo writes: the package name with `_` for `-`.
    artifact: String,
    /// npm's package name: lowercase.
    npm: String,
}

impl<'a> Names<'a> {
    fn of(name: &'a str) -> Self {
        let mut krate = name.replace('.', "_");
        if krate.starts_with(|c: char| c.is_ascii_digit()) {
            krate.insert_str(0, "deployer-");
        }
        Names {
            name,
            artifact: krate.replace('-', "_"),
            krate,
            npm: name.to_ascii_lowercase(),
        }
    }

    fn fill(&self, text: &str) -> String {
        text.replace("{{name}}", self.name)
            .replace("{{crate}}", &self.krate)
            .replace("{{artifact}}", &self.artifact)
            .replace("{{npm_name}}", &self.npm)
            // The lock file is the example's: its package name becomes ours.
            .replace("berth-safetensors-check", &self.npm)
    }
}

pub fn run(args: &NewArgs) -> anyhow::Result<ExitCode> {
    let name = args.name.as_str();
    check_name(name).map_err(|reason| {
        anyhow::anyhow!(
            "the deployer {reason} (it is also the file name: NAME.wasm is the deployer NAME)"
        )
    })?;
    let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from(name));
    refuse_used(&dir)?;

    let names = Names::of(name);
    let templates = WIT
        .iter()
        .chain(EVERY_LANGUAGE)
        .chain(args.lang.templates());
    for template in templates {
        write_new(&dir.join(template.path), &names.fill(template.text))?;
    }
    println!(
        "wrote the {} deployer {name} in {}; to build and try it:\n  cd {}\n{}",
        match args.lang {
            Lang::Rust => "Rust",
            Lang::Python => "Python",
            Lang::Js => "JavaScript",
        },
        dir.display(),
        dir.display(),
        args.lang.next_steps(name)
    );
    Ok(ExitCode::SUCCESS)
}

/// A project goes only where nothing is: a new directory or an empty one.
fn refuse_used(dir: &Path) -> anyhow::Result<()> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => anyhow::ensure!(
            entries.next().is_none(),
            "{}: already exists and is not empty; name another --dir, or empty it",
            dir.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) if dir.exists() && !dir.is_dir() => {
            anyhow::bail!("{}: exists and is not a directory ({e})", dir.display())
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    }
    Ok(())
}

fn write_new(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    #[test]
    fn every_wit_file_of_the_repository_is_in_a_project() {
        let mut on_disk = Vec::new();
        for dir in ["wit", "wit/deps"] {
            for entry in std::fs::read_dir(repo().join(dir)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "wit") {
                    let relative = path.strip_prefix(repo()).unwrap();
                    on_disk.push(relative.to_string_lossy().into_owned());
                }
            }
        }
        on_disk.sort();
        let mut embedded: Vec<_> = WIT.iter().map(|t| t.path.to_string()).collect();
        embedded.sort();
        assert_eq!(embedded, on_disk);
    }

    #[test]
    fn the_js_lock_pins_what_package_json_asks_for() {
        let names = Names::of("Size.Report");
        let package: serde_json::Value =
            serde_json::from_str(&names.fill(include_str!("scaffold/js/package.json"))).unwrap();
        let lock: serde_json::Value = serde_json::from_str(&names.fill(include_str!(
            "../../../../examples/safetensors-check/package-lock.json"
        )))
        .unwrap();
        assert_eq!(package["name"], "size.report");
        assert_eq!(lock["name"], "size.report");
        assert_eq!(lock["packages"][""]["name"], "size.report");
        assert_eq!(
            lock["packages"][""]["devDependencies"],
            package["devDependencies"]
        );
    }

    #[test]
    fn names_for_each_toolchain() {
        // (deployer name, cargo package, cargo's output file, npm package)
        let cases = [
            ("size-report", "size-report", "size_report", "size-report"),
            ("v1.2", "v1_2", "v1_2", "v1.2"),
            ("7zip", "deployer-7zip", "deployer_7zip", "7zip"),
            ("Card", "Card", "Card", "card"),
        ];
        for (name, krate, artifact, npm) in cases {
            let names = Names::of(name);
            assert_eq!(
                (
                    names.krate.as_str(),
                    names.artifact.as_str(),
                    names.npm.as_str()
                ),
                (krate, artifact, npm),
                "{name}"
            );
        }
    }
}
