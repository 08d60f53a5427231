//! `${NAME}` in configuration values (plugin manifests, the sources file),
//! resolved against the environment given when the file is loaded, so a
//! missing secret is a load error, never a surprise in the middle of a
//! deployment. Does no I/O of its own.

/// Replaces each `${NAME}` with the host's value; `$$` is a literal `$`.
pub(crate) fn expand(
    template: &str,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if let Some(after) = rest.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(after) = rest.strip_prefix("${") {
            let end = after
                .find('}')
                .ok_or_else(|| format!("{template:?} has an unclosed ${{"))?;
            let name = &after[..end];
            let value = lookup(name).ok_or_else(|| {
                format!(
                    "the host environment variable {name} is not set (set it before starting berth)"
                )
            })?;
            out.push_str(&value);
            rest = &after[end + 1..];
        } else {
            return Err(format!(
                "{template:?}: write ${{NAME}} for a variable, $$ for a literal $"
            ));
        }
    }
    out.push_str(rest);
    Ok(out)
}
