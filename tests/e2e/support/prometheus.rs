//! A strict parser of Prometheus's text exposition format (0.0.4), so the
//! tests read `/metrics` the way a scraper does and fail on anything a
//! scraper would refuse. Our own: `prometheus-parse` (0.2.5, the maintained
//! crate) matches label sets with `\{[^}]+\}`, so a route template label such
//! as `/v1/models/{id}` breaks it, and it skips lines it cannot read.
//!
//! Checked: names and label names are legal; label values use only the
//! format's escapes; every sample belongs to a family declared by `# TYPE`
//! before it, with that type's suffixes; a family's samples are contiguous;
//! no series appears twice; every histogram has a `+Inf` bucket equal to its
//! `_count`, and cumulative buckets that never decrease.

use std::collections::{BTreeMap, BTreeSet};

pub type Labels = BTreeMap<String, String>;

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Labels,
    pub value: f64,
}

#[derive(Debug, Default)]
pub struct Scrape {
    /// Family name → its type (`counter`, `gauge`, `histogram`, …).
    pub types: BTreeMap<String, String>,
    pub samples: Vec<Sample>,
}

impl Scrape {
    /// Parses a whole exposition, panicking with the line at fault.
    #[track_caller]
    pub fn parse(text: &str) -> Self {
        match parse(text) {
            Ok(scrape) => scrape,
            Err((line, why)) => panic!("/metrics line {line}: {why}\n{text}"),
        }
    }

    /// The sum of the samples named `name` whose labels include all of
    /// `labels`; 0 if there are none (a counter not yet incremented).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// The samples named `name` whose labels include all of `labels`.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }
}

type Failure = (usize, String);

fn parse(text: &str) -> Result<Scrape, Failure> {
    let mut scrape = Scrape::default();
    let mut helped = BTreeSet::new();
    let mut finished_families = BTreeSet::new();
    let mut current_family: Option<String> = None;
    let mut series = BTreeSet::new();
    for (index, line) in text.lines().enumerate() {
        let at = index + 1;
        let fail = |why: String| (at, why);
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("HELP"), Some(name), Some(_help)) => {
                    check_name(name).map_err(fail)?;
                    if !helped.insert(name.to_string()) {
                        return Err(fail(format!("a second HELP for {name}")));
                    }
                }
                (Some("TYPE"), Some(name), Some(kind)) => {
                    check_name(name).map_err(fail)?;
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                        return Err(fail(format!("unknown type {kind:?}")));
                    }
                    if scrape.types.contains_key(name) {
                        return Err(fail(format!("a second TYPE for {name}")));
                    }
                    if scrape.samples.iter().any(|s| belongs(&s.name, name, kind)) {
                        return Err(fail(format!("TYPE for {name} after its samples")));
                    }
                    scrape.types.insert(name.to_string(), kind.to_string());
                }
                (Some("HELP" | "TYPE"), ..) => {
                    return Err(fail("an incomplete HELP or TYPE".into()));
                }
                // Any other comment is allowed by the format.
                _ => {}
            }
            continue;
        }
        let sample = parse_sample(line).map_err(fail)?;
        let family = scrape
            .types
            .iter()
            .find(|(family, kind)| belongs(&sample.name, family, kind))
            .map(|(family, _)| family.clone())
            .ok_or_else(|| fail(format!("{} has no TYPE line before it", sample.name)))?;
        if current_family.as_ref() != Some(&family) {
            if finished_families.contains(&family) {
                return Err(fail(format!("the samples of {family} are not together")));
            }
            finished_families.extend(current_family.replace(family.clone()));
        }
        if !series.insert((sample.name.clone(), sample.labels.clone())) {
            return Err(fail(format!(
                "{} {:?} appears twice",
                sample.name, sample.labels
            )));
        }
        scrape.samples.push(sample);
    }
    check_histograms(&scrape).map_err(|why| (0, why))?;
    Ok(scrape)
}

/// Whether a sample named `sample` is one of a family of this type.
fn belongs(sample: &str, family: &str, kind: &str) -> bool {
    match kind {
        "histogram" => ["_bucket", "_sum", "_count"]
            .iter()
            .any(|suffix| sample.strip_prefix(family) == Some(suffix)),
        "summary" => ["", "_sum", "_count"]
            .iter()
            .any(|suffix| sample.strip_prefix(family) == Some(suffix)),
        _ => sample == family,
    }
}

fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let legal_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':');
    if legal_start && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
        Ok(())
    } else {
        Err(format!("{name:?} is not a metric name"))
    }
}

fn check_label_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let legal_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if legal_start && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(format!("{name:?} is not a label name"))
    }
}

/// `name{label="value",…} value [timestamp]`
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("a sample without a value")?;
    let name = &line[..name_end];
    check_name(name)?;
    let mut rest = &line[name_end..];
    let mut labels = Labels::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = parse_labels(after, &mut labels)?;
    }
    let rest = rest
        .strip_prefix(' ')
        .ok_or("expected one space before the value")?;
    let mut fields = rest.split(' ');
    let value = parse_value(fields.next().unwrap_or_default())?;
    if let Some(timestamp) = fields.next() {
        timestamp
            .parse::<i64>()
            .map_err(|_| format!("{timestamp:?} is not a timestamp"))?;
    }
    if fields.next().is_some() {
        return Err("more than a value and a timestamp after the labels".into());
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Reads `label="value",…}` into `labels`; returns what follows the `}`.
fn parse_labels<'a>(mut rest: &'a str, labels: &mut Labels) -> Result<&'a str, String> {
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Ok(after);
        }
        let (name, after) = rest.split_once("=\"").ok_or("a label without =\"")?;
        check_label_name(name)?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next().ok_or("an unterminated label value")? {
                (i, '"') => break i,
                (_, '\\') => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => return Err(format!("the escape \\{other:?} in a label value")),
                },
                (_, '\n') => return Err("a raw newline in a label value".into()),
                (_, c) => value.push(c),
            }
        };
        if labels.insert(name.to_string(), value).is_some() {
            return Err(format!("the label {name} twice"));
        }
        rest = &after[end + 1..];
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return Err("expected , or } after a label value".into());
        }
    }
}

fn parse_value(text: &str) -> Result<f64, String> {
    match text {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => text
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| format!("{text:?} is not a sample value")),
    }
}

fn check_histograms(scrape: &Scrape) -> Result<(), String> {
    for (family, kind) in &scrape.types {
        if kind != "histogram" {
            continue;
        }
        // The label sets of the family's series, without `le`.
        let mut buckets: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
        let bucket_name = format!("{family}_bucket");
        for sample in scrape.samples.iter().filter(|s| s.name == bucket_name) {
            let mut labels = sample.labels.clone();
            let le = labels
                .remove("le")
                .ok_or_else(|| format!("{bucket_name} {labels:?} has no le label"))?;
            let le = parse_value(&le)?;
            buckets.entry(labels).or_default().push((le, sample.value));
        }
        for (labels, mut bounds) in buckets {
            bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
            if bounds.windows(2).any(|w| w[1].1 < w[0].1) {
                return Err(format!("{family} {labels:?}: buckets decrease"));
            }
            let count = scrape
                .samples
                .iter()
                .find(|s| s.name == format!("{family}_count") && s.labels == labels)
                .ok_or_else(|| format!("{family} {labels:?} has no _count"))?;
            match bounds.last() {
                Some((le, n)) if *le == f64::INFINITY && *n == count.value => {}
                _ => {
                    return Err(format!(
                        "{family} {labels:?}: no +Inf bucket equal to _count"
                    ));
                }
            }
            if !scrape
                .samples
                .iter()
                .any(|s| s.name == format!("{family}_sum") && s.labels == labels)
            {
                return Err(format!("{family} {labels:?} has no _sum"));
            }
        }
    }
    Ok(())
}

#[test]
fn the_parser_refuses_what_a_scraper_would() {
    let good = "# HELP a_total A.\n# TYPE a_total counter\na_total{route=\"/v1/models/{id}\",q=\"say \\\"hi\\\"\"} 3\n";
    let scrape = Scrape::parse(good);
    assert_eq!(
        scrape.value(
            "a_total",
            &[("route", "/v1/models/{id}"), ("q", "say \"hi\"")]
        ),
        3.0
    );
    #[rustfmt::skip]
    let bad = [
        ("a_total 1\n", "no TYPE line"),
        ("# TYPE a_total counter\na_total{x=\"1\"} one\n", "not a sample value"),
        ("# TYPE a_total counter\na_total{x=\"1} 1\n", "unterminated"),
        ("# TYPE a_total counter\na_total{1x=\"1\"} 1\n", "not a label name"),
        ("# TYPE a_total counter\na_total 1\na_total 2\n", "appears twice"),
        ("# TYPE a gauge\n# TYPE b gauge\na{x=\"1\"} 1\nb 1\na{x=\"2\"} 1\n", "not together"),
        ("# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n", "decrease"),
        ("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n", "+Inf"),
    ];
    for (text, why) in bad {
        let error = parse(text).expect_err(text).1;
        assert!(error.contains(why), "{text:?}: {error}");
    }
}
