//! The sources file's one reading (`berth serve --sources-file`): its
//! shape, `[[source]]` entries (credentials for fetching, read by
//! `fetch::Access`) beside `[[target]]` entries (publishing destinations,
//! read by `crate::targets`) and `[[mlflow]]` entries (tracking servers
//! followed, read by `crate::mlflow::Servers`), and what a TOML mistake says. Each reader
//! names its own entry type; an entry the reader does not want is skipped
//! unread, every other key is refused.

use std::path::Path;

use anyhow::Context;
use serde::Deserialize;
use serde::de::{DeserializeOwned, IgnoredAny};
use toml::Spanned;

/// The file's entries: `S` for `[[source]]`, `T` for `[[target]]`, `M`
/// for `[[mlflow]]` (`serde::de::IgnoredAny` for the other readers').
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    bound = "S: DeserializeOwned, T: DeserializeOwned, M: DeserializeOwned"
)]
pub(crate) struct Entries<S, T, M = IgnoredAny> {
    #[serde(default)]
    pub(crate) source: Vec<Spanned<S>>,
    #[serde(default)]
    pub(crate) target: Vec<Spanned<T>>,
    #[serde(default)]
    pub(crate) mlflow: Vec<Spanned<M>>,
}

/// The file's text.
pub(crate) fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the sources file {}", path.display()))
}

/// `text`'s entries, or the TOML mistake: its line (when it has one) and
/// what it is.
pub(crate) fn parse<S: DeserializeOwned, T: DeserializeOwned, M: DeserializeOwned>(
    text: &str,
) -> Result<Entries<S, T, M>, (Option<usize>, String)> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map(|span| line_of(text, span.start));
        (line, e.message().to_string())
    })
}

/// The line of `text` that byte `offset` is on, from 1.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Named {
        name: String,
    }

    const FILE: &str = "[[source]]\nname = \"a\"\n\n[[target]]\nname = \"b\"\n";

    #[test]
    fn each_reader_takes_its_entries_and_skips_the_others() {
        let sources: Entries<Named, IgnoredAny> = parse(FILE).unwrap();
        assert_eq!(sources.source.len(), 1);
        assert_eq!(sources.source[0].get_ref().name, "a");
        assert_eq!(line_of(FILE, sources.source[0].span().start), 1);
        let targets: Entries<IgnoredAny, Named> = parse(FILE).unwrap();
        assert_eq!(targets.target[0].get_ref().name, "b");
        assert_eq!(line_of(FILE, targets.target[0].span().start), 4);
    }

    #[test]
    fn a_misspelt_section_is_refused_by_both_readers_on_its_line() {
        let text = "[[source]]\nname = \"a\"\n\n[[targets]]\nname = \"b\"\n";
        for (line, said) in [
            parse::<Named, IgnoredAny, IgnoredAny>(text).err().unwrap(),
            parse::<IgnoredAny, Named, IgnoredAny>(text).err().unwrap(),
        ] {
            assert_eq!(line, Some(4));
            assert!(said.contains("unknown field `targets`"), "{said}");
        }
    }
}
