//! `berth config --reference`: the book's page of `berth serve`'s settings
//! (`docs/src/operating/reference.md`), written from clap's own definitions
//! — each flag's environment variable, config key, default, values and
//! help — so no default is typed twice. A test fails when the checked-in
//! page differs from what this writes. Reads no file and no environment:
//! the page is the same on every machine.

use clap::Arg;

use super::config::serve_command;

/// The command that writes the page where it lives.
const REGENERATE: &str =
    "cargo run -p berth -- config --reference > docs/src/operating/reference.md";

/// The page, as Markdown.
pub fn page() -> String {
    let mut serve = serve_command();
    // Built, clap fills in what it derives: an on/off flag's default.
    serve.build();
    let mut text = format!(
        "# Settings reference\n\n\
         <!-- Written by `berth config --reference` from berth's own flag definitions; do \
         not edit by hand. After changing a flag, run:\n     {REGENERATE}\n     \
         (a unit test fails until the page matches). -->\n\n\
         Every setting of `berth serve` is a flag, a `BERTH_*` environment variable and a \
         key of the config file, the flag's name in snake case (see \
         [Configuration](configuration.md)); flags win over variables, which win over the \
         file, which wins over the defaults below. `berth config` prints the settings a \
         server would run with and where each comes from. A setting with no default is \
         off, or derived as its text says.\n\n\
         | flag | environment | config key | default |\n|---|---|---|---|\n"
    );
    let settings: Vec<&Arg> = serve
        .get_arguments()
        .filter(|arg| arg.get_long().is_some() && !arg.is_hide_set() && arg.get_id() != "help")
        .collect();
    for arg in &settings {
        text += &format!(
            "| [`--{long}`](#{anchor}) | {env} | {key} | {default} |\n",
            long = arg.get_long().unwrap_or_default(),
            anchor = anchor(arg),
            env = env(arg).map_or("".into(), |env| format!("`{env}`")),
            key = key(arg).map_or("(none)".into(), |key| format!("`{key}`")),
            default = default(arg).map_or("none".into(), |value| format!("`{value}`")),
        );
    }
    for arg in &settings {
        text += &section(arg);
    }
    text
}

/// One setting's section: its names, its default and values, its help.
fn section(arg: &Arg) -> String {
    let long = arg.get_long().unwrap_or_default();
    let value = if arg.get_action().takes_values() {
        let names = arg
            .get_value_names()
            .map(|names| names.join(" "))
            .unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
        format!(" {names}")
    } else {
        String::new()
    };
    let mut facts = Vec::new();
    if let Some(env) = env(arg) {
        facts.push(format!("environment `{env}`"));
    }
    if let Some(key) = key(arg) {
        facts.push(format!("config key `{key}`"));
    }
    facts.push(match default(arg) {
        Some(value) => format!("default `{value}`"),
        None => "no default".into(),
    });
    if arg.get_num_args().is_some_and(|n| n.max_values() > 1)
        || matches!(arg.get_action(), clap::ArgAction::Append)
    {
        facts.push("repeatable".into());
    }
    let mut text = format!(
        "\n<a id=\"{anchor}\"></a>\n### `--{long}{value}`\n\n{facts}.\n\n{help}\n",
        anchor = anchor(arg),
        facts = capitalised(&facts.join(" · ")),
        help = help(arg),
    );
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| match v.get_help() {
            Some(help) => format!("- `{}`: {help}", v.get_name()),
            None => format!("- `{}`", v.get_name()),
        })
        .collect();
    // Values without help (on/off, yes/no) say nothing the help does not.
    let explained = arg
        .get_possible_values()
        .iter()
        .any(|v| v.get_help().is_some());
    if explained {
        text += &format!("\nValues:\n\n{}\n", values.join("\n"));
    }
    text
}

/// The section's anchor: the config key with `-`, which no other heading
/// of the book makes.
fn anchor(arg: &Arg) -> String {
    format!("setting-{}", arg.get_long().unwrap_or_default())
}

fn env(arg: &Arg) -> Option<String> {
    arg.get_env().map(|env| env.to_string_lossy().into_owned())
}

/// The config file's key; `--config` itself has none.
fn key(arg: &Arg) -> Option<String> {
    let id = arg.get_id().as_str();
    (id != "config").then(|| id.to_string())
}

fn default(arg: &Arg) -> Option<String> {
    let values: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

/// The doc comment as clap holds it (the long help when there is one),
/// with `<` escaped for Markdown and the full stop clap drops put back.
fn help(arg: &Arg) -> String {
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default()
        .replace('<', "&lt;");
    match help.ends_with('.') {
        true => help,
        false => format!("{help}."),
    }
}

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checked_in_page_is_what_the_command_writes() {
        const PAGE: &str = "docs/src/operating/reference.md";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(PAGE);
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            checked_in == page(),
            "{PAGE} is not what `berth config --reference` writes: a flag changed. \
             Regenerate it with\n  {REGENERATE}"
        );
    }

    #[test]
    fn every_setting_is_a_flag_and_a_variable() {
        let unnamed: Vec<String> = serve_command()
            .get_arguments()
            .filter(|a| a.get_long().is_some() && a.get_env().is_none())
            .map(|a| a.get_id().to_string())
            .collect();
        assert_eq!(unnamed, Vec::<String>::new());
    }
}
