//! Whether a registration's source answers for its files: each file
//! opened where the model's record would find it, for its last byte only,
//! and the size the source tells compared with the size recorded. What
//! `POST /v1/models` asks before it stores a model whose files were given,
//! so that a typo'd source is a 400 at registration rather than a failed
//! deployment, or one months later once the local copy is gone.

use std::time::Duration;

use super::{Sources, Span, locate};
use crate::model::TrainedModel;

/// Files asked at once.
const AT_ONCE: usize = 8;

/// The longest one file's answer is waited for.
const PATIENCE: Duration = Duration::from_secs(30);

impl Sources {
    /// `Ok` when every file of `model` is at its source with its recorded
    /// size; else the sentence naming the first file (in the model's
    /// order) that is not, and why.
    pub(crate) async fn answer_for(&self, model: &TrainedModel) -> Result<(), String> {
        for (n, group) in model.files.chunks(AT_ONCE).enumerate() {
            let answers =
                futures::future::join_all(group.iter().map(|file| self.answers(model, file))).await;
            for (i, (file, answer)) in group.iter().zip(answers).enumerate() {
                answer.map_err(|why| format!("files[{}] {}: {why}", n * AT_ONCE + i, file.path))?;
            }
        }
        Ok(())
    }

    async fn answers(
        &self,
        model: &TrainedModel,
        file: &crate::model::ModelFile,
    ) -> Result<(), String> {
        let location = locate(&model.source, &model.job_id, file)?;
        // The last byte: a source that honours ranges sends one byte and
        // tells the whole size; one that does not sends it all, which is
        // dropped at once, unread.
        let span = match file.size_bytes {
            0 => Span::from(0),
            size => Span {
                start: size - 1,
                end: Some(size),
            },
        };
        let body = tokio::time::timeout(PATIENCE, self.open(&location, span))
            .await
            .map_err(|_| {
                format!(
                    "the source did not answer for it within {}s at {location}",
                    PATIENCE.as_secs()
                )
            })?
            .map_err(|why| format!("the source does not answer for it: {why}"))?;
        match body.total {
            Some(total) if total != file.size_bytes => Err(format!(
                "the source has {total} bytes at {location}, and the registration says {}",
                file.size_bytes
            )),
            _ => Ok(()),
        }
    }
}
