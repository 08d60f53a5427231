//! Which of the chosen files are pickles, from their first bytes
//! (`formats::sniff`): the server tells formats only when it fetches, and
//! reads no byte at registration, so this note is the only word before a
//! deployment. A file that cannot be read says nothing here.

use std::io::Read;
use std::path::Path;

use crate::cli::folder::Listed;
use crate::formats::{self, HEAD_BYTES};

/// A note for each of `files` that opens as a pickle.
pub(super) fn notes(dir: &Path, files: &[Listed]) -> Vec<String> {
    files
        .iter()
        .filter_map(|file| {
            let mut head = Vec::new();
            std::fs::File::open(dir.join(&file.path))
                .and_then(|f| f.take(HEAD_BYTES as u64).read_to_end(&mut head))
                .ok()?;
            let format = formats::sniff(&head);
            format.is_pickle().then(|| {
                format!(
                    "{} is a pickle ({}): loading it runs code. A server with --pickle refuse \
                     hands it only to deployers whose manifest says accepts_pickle = true; \
                     leave it out with --exclude '{}'",
                    file.path,
                    format.as_str(),
                    file.path
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pickle_is_noted_by_its_bytes() {
        let real = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/training/lora-run");
        let dir = tempfile::tempdir().unwrap();
        let files = [
            (
                "training_args.bin",
                std::fs::read(real.join("training_args.bin")).unwrap(),
            ),
            (
                "weights.safetensors",
                std::fs::read(real.join("adapter_model.safetensors")).unwrap(),
            ),
            ("old.ckpt", b"\x80\x04\x95\x05\x00\x00\x00".to_vec()),
            ("config.json", b"{}".to_vec()),
        ];
        let mut listed = Vec::new();
        for (path, bytes) in &files {
            std::fs::write(dir.path().join(path), bytes).unwrap();
            listed.push(Listed {
                path: path.to_string(),
                size: bytes.len() as u64,
            });
        }
        listed.push(Listed {
            path: "gone.pt".into(),
            size: 1,
        });
        let notes = notes(dir.path(), &listed);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(
            notes[0]
                .starts_with("training_args.bin is a pickle (zip-pickle): loading it runs code"),
            "{}",
            notes[0]
        );
        assert!(
            notes[0].ends_with("--exclude 'training_args.bin'"),
            "{}",
            notes[0]
        );
        assert!(
            notes[1].starts_with("old.ckpt is a pickle (pickle)"),
            "{}",
            notes[1]
        );
    }
}
