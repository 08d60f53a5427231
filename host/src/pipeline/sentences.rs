//! The errors the pipeline records for a deployment that did not end by
//! itself: interrupted by a stop, lost with its server, never runnable, or
//! cancelled, and why. Words only: never decides when a deployment ends.

use std::time::Duration;

use crate::model::Phase;

/// How the server stopped under a running deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// Asked to (SIGINT/SIGTERM): the pipeline recorded the row itself.
    Graceful,
    /// Killed or crashed: the row is found `running` at the next start.
    Unseen,
}

/// The error recorded for a deployment the server stopped under, saying
/// what it was doing (`phase`: `None` for a row from before phases were
/// recorded) and, for an unseen stop, what probably happened.
pub(super) fn interrupted(phase: Option<Phase>, stop: Stop) -> String {
    let doing = doing(phase);
    let cause = match stop {
        Stop::Graceful => "",
        Stop::Unseen => " (killed or crashed?)",
    };
    format!("interrupted{doing}: the server stopped before it finished{cause}")
}

/// What a deployment was doing, as its error says: `None` for a row from
/// before phases were recorded.
fn doing(phase: Option<Phase>) -> &'static str {
    match phase {
        Some(Phase::Fetching) => " while fetching the model",
        Some(Phase::Deploying) => " while deploying",
        None => "",
    }
}

/// The error recorded for a deployment whose owner stopped renewing its
/// lease: `owner` names the server.
pub(super) fn lost(owner: &str, phase: Option<Phase>) -> String {
    let doing = doing(phase);
    format!(
        "lost{doing}: berth server {owner} stopped renewing its lease on this deployment (killed, frozen or cut off from the database?)"
    )
}

/// The error recorded for a deployment whose owner's lease ran out while
/// this server, too, could not reach the database (for `outage`).
pub(super) fn lost_in_outage(owner: &str, phase: Option<Phase>, outage: Duration) -> String {
    let doing = doing(phase);
    format!(
        "lost{doing}: the database was unreachable (this server could not reach it for {}) and \
         berth server {owner}'s lease on this deployment ran out meanwhile; a server stops its \
         deployments before their leases run out, so it is not running anywhere: deploy it again",
        crate::human::duration(outage)
    )
}

/// The error of a deployment this server stopped because it could not
/// renew its lease for `cut_off` (of a `lease`).
pub(crate) fn fenced(cut_off: Duration, lease: Duration) -> String {
    format!(
        "stopped: this server could not reach the database for {} and stopped the deployment \
         before its lease ({}) ran out, so that it never runs while another server ends it; \
         deploy it again",
        crate::human::duration(cut_off),
        crate::human::duration(lease)
    )
}

/// The error of a deployment this server stopped because its fence (what
/// stops a deployment before its lease runs out) ended: `how`.
pub(crate) fn unguarded(how: &str) -> String {
    format!(
        "stopped: this server's fence ended ({how}), and a deployment it runs could outlive its \
         lease unnoticed; the server runs nothing more until it is restarted; deploy it again"
    )
}

/// The error recorded for a queued deployment no live server can run.
pub(super) fn unrunnable(deployer: &str, sha256: &str, waited: Duration) -> String {
    format!(
        "no berth server could run it: none has deployer {deployer} at sha256 {sha256} loaded, \
         and none took it within {} (--queue-timeout-s); load that version of the deployer \
         on a server, or deploy again with the version the servers have",
        crate::human::duration(waited)
    )
}

/// Why a deployment was cancelled; the first reason given is recorded.
pub(super) const CANCELLED: &str = "cancelled";
pub(super) const CLIENT_LEFT: &str = "cancelled: the client disconnected";
pub(super) const ACCEPTOR_STOPPED: &str = "cancelled: the server that accepted it stopped";
pub(super) const CLAIM_LOST: &str = "cancelled: this server lost its claim on the deployment (its lease ran out and another server ended it, or its record was deleted)";

/// The error of a deployment cancelled for `reason` while it was queued.
pub(super) fn before_start(reason: &str) -> String {
    format!("{reason} (before it started)")
}

/// The error recorded for a deployment an admin rejected.
pub(super) fn rejected(by: Option<&str>, comment: Option<&str>) -> String {
    let by = by.map(|name| format!(" by {name}")).unwrap_or_default();
    match comment {
        Some(comment) => format!("rejected{by}: {comment}"),
        None => format!("rejected{by}: it was not approved, so it never ran"),
    }
}

/// The error recorded for a deployment nobody approved within `wait`.
pub(super) fn expired(wait: Duration) -> String {
    format!(
        "expired: nobody approved it within {} (--approval-expiry-s), so it never ran; ask for it again if it is still wanted",
        crate::human::duration(wait)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interruption_says_what_was_running_and_how_the_server_stopped() {
        let stopped = "the server stopped before it finished";
        for (phase, stop, expected) in [
            (
                Some(Phase::Fetching),
                Stop::Graceful,
                format!("interrupted while fetching the model: {stopped}"),
            ),
            (
                Some(Phase::Deploying),
                Stop::Graceful,
                format!("interrupted while deploying: {stopped}"),
            ),
            (
                Some(Phase::Fetching),
                Stop::Unseen,
                format!("interrupted while fetching the model: {stopped} (killed or crashed?)"),
            ),
            (
                Some(Phase::Deploying),
                Stop::Unseen,
                format!("interrupted while deploying: {stopped} (killed or crashed?)"),
            ),
            (
                None,
                Stop::Unseen,
                format!("interrupted: {stopped} (killed or crashed?)"),
            ),
        ] {
            assert_eq!(interrupted(phase, stop), expected, "{phase:?} {stop:?}");
        }
    }
}
