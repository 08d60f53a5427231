//! The chains rules make: a rule's deployment, once completed, fires the
//! rules that follow its deployer. A chain may not come back to a rule it
//! already ran for the same model (a cycle), and is at most `MAX_DEPTH`
//! steps long. Checked over the rules as written, whatever they match, so
//! no model can set one off. Pure.

use super::{MAX_DEPTH, Spec, Trigger};
use crate::validate::Problem;

/// The first cycle or over-long chain among `rules` (the enabled ones),
/// said with its field.
pub fn problem(rules: &[&Spec]) -> Option<Problem> {
    // Each rule's followers: the rules its deployer's completion fires.
    let next: Vec<Vec<usize>> = rules
        .iter()
        .map(|r| {
            (0..rules.len())
                .filter(|&j| {
                    rules[j].trigger()
                        == Some(Trigger::Completed {
                            deployer: r.deploy.deployer.clone(),
                        })
                })
                .collect()
        })
        .collect();
    for start in 0..rules.len() {
        let mut path = vec![start];
        if let Some(problem) = walk(rules, &next, &mut path) {
            return Some(problem);
        }
    }
    None
}

/// Depth first from the end of `path`.
fn walk(rules: &[&Spec], next: &[Vec<usize>], path: &mut Vec<usize>) -> Option<Problem> {
    let names = |path: &[usize]| {
        path.iter()
            .map(|&i| rules[i].name.as_str())
            .collect::<Vec<_>>()
            .join(" → ")
    };
    let last = *path.last()?;
    for &follower in &next[last] {
        if path.contains(&follower) {
            let mut cycle = path.clone();
            cycle.push(follower);
            return Some(Problem {
                field: "deploy.deployer".into(),
                message: format!(
                    "the rules make a cycle ({}): a chain may not come back to a rule it already ran for the same model",
                    names(&cycle)
                ),
            });
        }
        path.push(follower);
        if path.len() > MAX_DEPTH {
            return Some(Problem {
                field: "when".into(),
                message: format!(
                    "the chain {} is {} steps deep; at most {MAX_DEPTH} are allowed",
                    names(path),
                    path.len()
                ),
            });
        }
        if let Some(problem) = walk(rules, next, path) {
            return Some(problem);
        }
        path.pop();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Deploy, When};

    /// A rule fired by `after`'s completion (None: a registration) that
    /// deploys with `deployer`.
    fn rule(name: &str, after: Option<&str>, deployer: &str) -> Spec {
        Spec {
            name: name.into(),
            when: When {
                event: match after {
                    Some(_) => "deployment.completed".into(),
                    None => "model.registered".into(),
                },
                deployer: after.map(str::to_string),
            },
            matches: Default::default(),
            deploy: Deploy {
                deployer: deployer.into(),
                options: Default::default(),
            },
            require_approval: false,
            disabled: false,
        }
    }

    #[test]
    fn chains_may_not_loop_or_go_too_deep() {
        let chain = |n: usize| -> Vec<Spec> {
            (0..n)
                .map(|i| {
                    let after = (i > 0).then(|| format!("d{}", i - 1));
                    rule(&format!("r{i}"), after.as_deref(), &format!("d{i}"))
                })
                .collect()
        };
        let eight = chain(8);
        assert_eq!(problem(&eight.iter().collect::<Vec<_>>()), None);
        let nine = chain(9);
        let deep = problem(&nine.iter().collect::<Vec<_>>()).unwrap();
        assert_eq!(deep.field, "when");
        assert!(
            deep.message.contains("9 steps deep; at most 8"),
            "{}",
            deep.message
        );

        let cycle = [
            rule("check", Some("publish"), "check"),
            rule("publish", Some("check"), "publish"),
        ];
        let found = problem(&cycle.iter().collect::<Vec<_>>()).unwrap();
        assert_eq!(found.field, "deploy.deployer");
        assert!(
            found.message.contains("check → publish → check"),
            "{}",
            found.message
        );

        let itself = [rule("again", Some("archive"), "archive")];
        assert!(problem(&itself.iter().collect::<Vec<_>>()).is_some());
    }
}
