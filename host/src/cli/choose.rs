//! Which of a folder's files a registration takes. `--exclude` patterns
//! (and a `.berthignore` in the folder: one per line, `#` comments, `!` to
//! take one back) leave files out; `--include` patterns take back what an
//! exclude or the default left out. A pattern is gitignore-style: without
//! a `/` it matches a name at any depth (a file, or a folder and what it
//! holds); with one, a path from the folder's top; `*` stays within a
//! name, `**` crosses folders; a trailing `/` is a folder.
//!
//! A Trainer run's folder (it has `checkpoint-N/` folders, or
//! `trainer_state.json` or `training_args.bin` at its top) by default
//! keeps its final model and leaves out what only resuming the training
//! needs: the checkpoints, the optimizer, scheduler and RNG states and the
//! pickled training arguments, as Trainer's own push to the Hub does.
//! Pure: decides from the listed paths; reads and prints nothing.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use super::folder::Listed;

/// What a Trainer run holds that serving does not need.
const TRAINING_STATE: &[&str] = &[
    "/checkpoint-*/",
    "optimizer.pt",
    "optimizer.bin",
    "scheduler.pt",
    "scaler.pt",
    "rng_state*.pth",
    "training_args.bin",
];

/// The patterns of one registration.
#[derive(Debug, Default)]
pub struct Rules {
    pub include: Vec<String>,
    pub exclude: Vec<String>,
}

impl Rules {
    /// The rules of `.berthignore`'s `text` added to these: a line is an
    /// exclude, `!PATTERN` an include.
    pub fn with_ignore_file(mut self, text: &str) -> Self {
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match line.strip_prefix('!') {
                Some(taken_back) => self.include.push(taken_back.to_string()),
                None => self.exclude.push(line.to_string()),
            }
        }
        self
    }
}

/// Why a file was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// An `--exclude` or `.berthignore` pattern matched it.
    Excluded,
    /// It is a Trainer run's checkpoint or training state.
    TrainingState,
}

/// The files taken and those left out, each in the listing's order.
#[derive(Debug, Default)]
pub struct Choice {
    pub kept: Vec<Listed>,
    pub left_out: Vec<(Listed, Why)>,
}

/// Splits `files` by `rules` (and, for a Trainer run, the default).
pub fn choose(files: Vec<Listed>, rules: &Rules) -> Result<Choice, String> {
    let include = set_of(&rules.include)?;
    let exclude = set_of(&rules.exclude)?;
    let training_run = files.iter().any(|f| {
        let top = f.path.split('/').next().unwrap_or_default();
        (f.path.contains('/') && checkpoint_number(top).is_some())
            || f.path == "trainer_state.json"
            || f.path == "training_args.bin"
    });
    let state = if training_run {
        set_of(TRAINING_STATE)?
    } else {
        GlobSet::empty()
    };
    let mut choice = Choice::default();
    for file in files {
        let why = if include.is_match(&file.path) {
            None
        } else if exclude.is_match(&file.path) {
            Some(Why::Excluded)
        } else if state.is_match(&file.path) {
            Some(Why::TrainingState)
        } else {
            None
        };
        match why {
            Some(why) => choice.left_out.push((file, why)),
            None => choice.kept.push(file),
        }
    }
    Ok(choice)
}

/// What Trainer writes last into a checkpoint: one without it is still
/// being written, or was cut short.
pub const WRITTEN_LAST: &str = "trainer_state.json";

/// The `checkpoint-N/` folders among `files` (at their top, or the top
/// itself, `""`, when `checkpoint` says the folder is one) that lack the
/// file Trainer writes last.
pub fn half_written(files: &[Listed], checkpoint: bool) -> Vec<String> {
    let mut folders: Vec<String> = Vec::new();
    if checkpoint {
        folders.push(String::new());
    }
    for file in files {
        if let Some((top, _)) = file.path.split_once('/')
            && checkpoint_number(top).is_some()
            && !folders.iter().any(|f| f == &format!("{top}/"))
        {
            folders.push(format!("{top}/"));
        }
    }
    folders.retain(|folder| {
        let last = format!("{folder}{WRITTEN_LAST}");
        !files.iter().any(|f| f.path == last)
    });
    folders
}

/// `N` of a folder named `checkpoint-N`.
pub fn checkpoint_number(name: &str) -> Option<u64> {
    name.strip_prefix("checkpoint-")?.parse().ok()
}

/// One matcher for gitignore-style `patterns`.
fn set_of(patterns: &[impl AsRef<str>]) -> Result<GlobSet, String> {
    let mut set = GlobSetBuilder::new();
    for pattern in patterns {
        let pattern = pattern.as_ref();
        for glob in globs_of(pattern) {
            let glob = GlobBuilder::new(&glob)
                .literal_separator(true)
                .build()
                .map_err(|e| format!("pattern {pattern:?}: {}", e.kind()))?;
            set.add(glob);
        }
    }
    set.build().map_err(|e| e.to_string())
}

/// A gitignore-style pattern as globs over `/`-separated relative paths:
/// the path itself and, as a folder, everything under it.
fn globs_of(pattern: &str) -> Vec<String> {
    let folder_only = pattern.ends_with('/');
    let trimmed = pattern.trim_end_matches('/');
    let anchored = trimmed.contains('/');
    let trimmed = trimmed.trim_start_matches('/');
    let base = if anchored {
        trimmed.to_string()
    } else {
        format!("**/{trimmed}")
    };
    let under = format!("{base}/**");
    if folder_only || base.ends_with("/**") {
        vec![under]
    } else {
        vec![base, under]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A LoRA run as Trainer and peft leave it: two checkpoints and the
    /// final adapter at the top.
    fn run() -> Vec<Listed> {
        let mut paths = Vec::new();
        for step in ["10", "20"] {
            for name in [
                "adapter_config.json",
                "adapter_model.safetensors",
                "optimizer.pt",
                "rng_state.pth",
                "scheduler.pt",
                "trainer_state.json",
                "training_args.bin",
            ] {
                paths.push(format!("checkpoint-{step}/{name}"));
            }
        }
        for name in [
            "README.md",
            "adapter_config.json",
            "adapter_model.safetensors",
            "tokenizer.json",
            "trainer_state.json",
            "training_args.bin",
        ] {
            paths.push(name.to_string());
        }
        paths.sort();
        paths
            .into_iter()
            .map(|path| Listed { path, size: 1 })
            .collect()
    }

    fn kept(choice: &Choice) -> Vec<&str> {
        choice.kept.iter().map(|f| f.path.as_str()).collect()
    }

    #[test]
    fn a_training_run_keeps_its_final_model_and_leaves_its_state_out() {
        let choice = choose(run(), &Rules::default()).unwrap();
        assert_eq!(
            kept(&choice),
            [
                "README.md",
                "adapter_config.json",
                "adapter_model.safetensors",
                "tokenizer.json",
                "trainer_state.json"
            ]
        );
        assert_eq!(choice.left_out.len(), 15);
        assert!(
            choice
                .left_out
                .iter()
                .all(|(_, why)| *why == Why::TrainingState)
        );
    }

    #[test]
    fn include_takes_back_and_exclude_leaves_out() {
        let rules = Rules {
            include: vec!["checkpoint-20/".into()],
            exclude: vec!["*.md".into(), "/tokenizer.json".into()],
        };
        let choice = choose(run(), &rules).unwrap();
        let kept = kept(&choice);
        assert!(kept.contains(&"checkpoint-20/optimizer.pt"), "{kept:?}");
        assert!(!kept.iter().any(|p| p.starts_with("checkpoint-10/")));
        assert!(!kept.contains(&"README.md") && !kept.contains(&"tokenizer.json"));
        assert!(choice.left_out.contains(&(
            Listed {
                path: "README.md".into(),
                size: 1
            },
            Why::Excluded
        )));
    }

    #[test]
    fn a_name_pattern_matches_at_any_depth_and_a_path_pattern_from_the_top() {
        let files = ["a.bin", "sub/a.bin", "sub/deeper/a.bin", "b.bin"]
            .map(|path| Listed {
                path: path.into(),
                size: 1,
            })
            .to_vec();
        let only = |pattern: &str| {
            let rules = Rules {
                exclude: vec![pattern.into()],
                ..Rules::default()
            };
            let choice = choose(files.clone(), &rules).unwrap();
            choice
                .left_out
                .iter()
                .map(|(f, _)| f.path.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(only("a.bin"), ["a.bin", "sub/a.bin", "sub/deeper/a.bin"]);
        assert_eq!(only("/a.bin"), ["a.bin"]);
        assert_eq!(only("sub/*.bin"), ["sub/a.bin"]);
        assert_eq!(only("sub/**/*.bin"), ["sub/a.bin", "sub/deeper/a.bin"]);
        assert_eq!(only("sub/"), ["sub/a.bin", "sub/deeper/a.bin"]);
        assert_eq!(only("deeper"), ["sub/deeper/a.bin"]);
    }

    #[test]
    fn an_ignore_file_excludes_and_takes_back_and_a_bad_pattern_is_named() {
        let rules =
            Rules::default().with_ignore_file("# state\n*.pt\n\n!checkpoint-10/optimizer.pt\n");
        assert_eq!(rules.exclude, ["*.pt"]);
        assert_eq!(rules.include, ["checkpoint-10/optimizer.pt"]);
        let e = choose(
            run(),
            &Rules {
                exclude: vec!["a[".into()],
                ..Rules::default()
            },
        )
        .unwrap_err();
        assert!(e.starts_with("pattern \"a[\": "), "{e}");
    }

    #[test]
    fn a_checkpoint_without_its_trainer_state_is_half_written() {
        let mut files = run();
        assert!(half_written(&files, false).is_empty());
        files.retain(|f| f.path != "checkpoint-20/trainer_state.json");
        assert_eq!(half_written(&files, false), ["checkpoint-20/"]);
        let inside = |paths: &[&str]| -> Vec<Listed> {
            paths
                .iter()
                .map(|p| Listed {
                    path: p.to_string(),
                    size: 1,
                })
                .collect()
        };
        assert_eq!(
            half_written(&inside(&["adapter_model.safetensors"]), true),
            [""]
        );
        assert!(half_written(&inside(&["trainer_state.json"]), true).is_empty());
    }

    #[test]
    fn a_folder_that_is_no_training_run_keeps_its_pickles() {
        let files = ["model.safetensors", "optimizer.pt"]
            .map(|path| Listed {
                path: path.into(),
                size: 1,
            })
            .to_vec();
        let choice = choose(files, &Rules::default()).unwrap();
        assert_eq!(choice.kept.len(), 2);
    }
}
