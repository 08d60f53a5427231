//! `berth plugin run -v`: the guest's `log` and `progress` calls and its
//! stdout/stderr lines on stderr as they happen, progress drawn the way
//! `berth deploy` draws it. Unlike the server log, no budget: the person
//! watching asked for them. Each line is escaped to one line all the same,
//! so a plugin cannot write terminal escapes.

use std::sync::Mutex;

use crate::cli::client::progress::ProgressView;
use crate::http::json::{DeployerProgress, Phase, Progress};
use crate::runtime::{GuestLevel, Reporter, one_line};

pub struct GuestLines {
    subject: String,
    view: Mutex<ProgressView>,
}

impl GuestLines {
    pub fn new(plugin: &str) -> Self {
        let subject = format!("plugin {plugin}");
        Self {
            view: Mutex::new(ProgressView::new(subject.clone())),
            subject,
        }
    }

    /// Erases the progress bar, so that what is printed next starts on a
    /// clean line.
    pub fn finish(&self) {
        self.view.lock().expect("progress view lock").clear();
    }
}

impl Reporter for GuestLines {
    fn log(&self, level: GuestLevel, message: &str) {
        let line = format!(
            "{}: {}: {}",
            self.subject,
            level.as_str(),
            one_line(message)
        );
        self.view.lock().expect("progress view lock").say(&line);
    }

    fn host_line(&self, message: &str) {
        let line = format!("{}: berth: {message}", self.subject);
        self.view.lock().expect("progress view lock").say(&line);
    }

    fn progress(&self, done: u64, total: u64, note: &str) {
        let progress = Progress {
            deployer: DeployerProgress {
                done,
                note: one_line(note).into_owned(),
                total,
            },
            ..Progress::default()
        };
        self.view
            .lock()
            .expect("progress view lock")
            .update(Phase::Deploying, &progress);
    }
}
