//! The pickle policy (`--pickle`): what a deployment of a model holding
//! pickle files (`pickle`, `zip-pickle`: loading one runs code its author
//! chose) does. `allow` says nothing; `warn` says so in the server's and
//! the deployment's log; `refuse` refuses it for a deployer whose manifest
//! does not say `accepts_pickle = true`, at admission when the formats are
//! known from an earlier fetch, else once the fetch has told them, before
//! the deployer runs. berth itself never unpickles. Registration cannot
//! refuse: formats are known only once a fetch has read the bytes.

use crate::model::{Format, ModelFile, TrainedModel};
use crate::runtime::{Plugin, Reporter};

/// `--pickle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PicklePolicy {
    /// Deploy pickle files to any deployer, saying nothing.
    Allow,
    /// Deploy them, saying which files are pickles in the server's and the
    /// deployment's log.
    #[default]
    Warn,
    /// Refuse to deploy them to a deployer whose manifest does not say
    /// `accepts_pickle = true`.
    Refuse,
}

/// The paths of `files` that are pickles: by `formats` (a fetch's, in the
/// files' order) where given, else by what the records know.
pub(super) fn pickle_paths(files: &[ModelFile], formats: Option<&[Format]>) -> Vec<String> {
    files
        .iter()
        .enumerate()
        .filter(|(at, file)| {
            let format = formats.and_then(|f| f.get(*at).copied()).or(file.format);
            format.is_some_and(Format::is_pickle)
        })
        .map(|(_, file)| file.path.clone())
        .collect()
}

/// Names at most five paths, then how many more.
fn named(paths: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = paths[..paths.len().min(SHOWN)].join(", ");
    if paths.len() > SHOWN {
        text.push_str(&format!(" and {} more", paths.len() - SHOWN));
    }
    text
}

/// Why `plugin` may not be handed `model`'s pickle files `paths` under
/// `policy`; `None` when it may.
pub(super) fn refusal(
    policy: PicklePolicy,
    model: &TrainedModel,
    plugin: &Plugin,
    paths: &[String],
) -> Option<String> {
    if policy != PicklePolicy::Refuse || paths.is_empty() || plugin.manifest.accepts_pickle {
        return None;
    }
    Some(format!(
        "model {} ({}) holds pickle files, which run code when loaded: {}; this server refuses \
         them to deployers whose manifest does not say accepts_pickle = true (--pickle refuse), \
         and deployer {}'s does not. Register the model without them (berth models register \
         leaves a Trainer run's state out), or add accepts_pickle = true to {}.toml if it \
         loads them safely",
        model.id,
        model.job_id,
        named(paths),
        plugin.name,
        plugin.name
    ))
}

/// Under `warn`, says which files handed to `plugin` are pickles, in the
/// server's log and the deployment's.
pub(super) fn warn(
    policy: PicklePolicy,
    model: &TrainedModel,
    plugin: &Plugin,
    paths: &[String],
    log: &dyn Reporter,
) {
    if policy != PicklePolicy::Warn || paths.is_empty() {
        return;
    }
    let line = format!(
        "model {} holds pickle files, which run code when loaded: {}; deployer {} is handed them \
         (--pickle warn)",
        model.id,
        named(paths),
        plugin.name
    );
    tracing::warn!(model_id = model.id, deployer = %plugin.name, "{line}");
    log.host_line(&line);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, format: Option<Format>) -> ModelFile {
        ModelFile {
            path: path.into(),
            size_bytes: 1,
            sha256: None,
            format,
        }
    }

    #[test]
    fn pickles_are_known_by_format_not_name() {
        let files = [
            file("adapter_model.safetensors", Some(Format::Safetensors)),
            file("training_args.bin", Some(Format::ZipPickle)),
            file("weights.pkl", Some(Format::Other)),
            file("old.pt", Some(Format::Pickle)),
            file("unknown.pt", None),
        ];
        assert_eq!(pickle_paths(&files, None), ["training_args.bin", "old.pt"]);
        let fetched = [
            Format::Safetensors,
            Format::ZipPickle,
            Format::Other,
            Format::Pickle,
            Format::ZipPickle,
        ];
        assert_eq!(
            pickle_paths(&files, Some(&fetched)),
            ["training_args.bin", "old.pt", "unknown.pt"]
        );
    }

    #[test]
    fn many_pickles_are_named_five_at_most() {
        let paths: Vec<String> = (1..=7).map(|n| format!("p{n}.pt")).collect();
        assert_eq!(
            named(&paths),
            "p1.pt, p2.pt, p3.pt, p4.pt, p5.pt and 2 more"
        );
        assert_eq!(named(&paths[..1]), "p1.pt");
    }
}
