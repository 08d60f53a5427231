//! Firing: every server follows the event log from the shared cursor and,
//! for each model registration and completed deployment, fires the rules
//! that match. A firing is recorded in the transaction of its deployment,
//! unique by (rule, event) (`Pipeline::fire`), so every server may try
//! every event: one records it, the others find it recorded. The cursor
//! moves only past events this server looked at, so a server that dies
//! mid-firing leaves its events to the others and to its own restart:
//! nothing is lost, nothing doubled. Since looking again is harmless, the
//! cursor is stored at most once a `CURSOR_EVERY`, not after each event: a
//! commit of its own per event doubled the disk flushes of a deployment.
//! With no rule enabled, events do not wake the follower: it moves the
//! cursor to the log's end once a `POLL` (two reads, whatever the rate of
//! deployments), since two reads for each event cost a synchronous
//! deployment more CPU than the deployment itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::{Happened, MAX_DEPTH, Rules, Spec, Trigger, matching, template};
use crate::db::events::{Kinds, StoredEvent};
use crate::db::{Db, Topic};
use crate::model::{Cause, Deployment};
use crate::pipeline::{Fired, Firing, Pipeline};

/// How often the log is looked at without a wake-up, and how soon an
/// event that could not be decided is tried again.
const POLL: Duration = Duration::from_secs(1);
/// Events looked at per read of the log.
const BATCH: u32 = 200;
/// How often the shared cursor is stored while events are looked at.
const CURSOR_EVERY: Duration = Duration::from_secs(1);

/// Reads what a stored event says happened (the wire's business: handed
/// in by `serve`).
pub type Decode = fn(&StoredEvent) -> Option<Happened>;

/// Fires rules from the event log until `stop`.
pub async fn run(
    rules: Arc<Rules>,
    pipeline: Arc<Pipeline>,
    db: Db,
    decode: Decode,
    stop: CancellationToken,
) {
    let mut wakeups = db.wakeups(Topic::Events);
    let mut cursor = Cursor::default();
    let mut idle = false;
    loop {
        let looked = match idle {
            true => skip(&rules, &db, &mut cursor).await,
            false => step(&rules, &pipeline, &db, decode, &mut cursor).await,
        };
        let wait = match looked {
            Ok(Looked::More) => {
                idle = false;
                continue;
            }
            Ok(Looked::AllOf(next)) => {
                idle = next == Next::Idle;
                POLL
            }
            Err(e) => {
                tracing::warn!(
                    "rules: {e}; trying again in {}",
                    crate::human::duration(POLL)
                );
                POLL
            }
        };
        // Idle, an event is no reason to look: nothing would fire. A rule
        // stored here ends it at once, one stored by another server
        // within a `POLL`.
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = rules.changed() => idle = false,
            _ = wakeups.recv(), if !idle => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// What a look at the log found.
enum Looked {
    /// A whole batch: there may be more.
    More,
    /// Everything up to the log's end, and how to wait for what comes.
    AllOf(Next),
}

#[derive(PartialEq, Eq)]
enum Next {
    /// Look again when an event is appended.
    Events,
    /// No rule is enabled: move the cursor every `POLL` without reading
    /// the events, and look at them again once a rule is.
    Idle,
}

/// Where this server has looked up to, and what of it is stored.
#[derive(Default)]
struct Cursor {
    /// The last event looked at (the shared cursor, read at first).
    position: Option<i64>,
    /// The position last stored, and when.
    stored: Option<(i64, Instant)>,
}

impl Cursor {
    /// The position, read from the shared cursor the first time.
    async fn position(&mut self, db: &Db) -> Result<i64, String> {
        if let Some(p) = self.position {
            return Ok(p);
        }
        let stored = db.rule_cursor().await.map_err(|e| e.to_string())?;
        self.position = Some(stored);
        self.stored = Some((stored, Instant::now()));
        Ok(stored)
    }

    /// Stores the position if it moved and `CURSOR_EVERY` has passed.
    async fn store(&mut self, db: &Db) -> Result<(), String> {
        let Some(position) = self.position else {
            return Ok(());
        };
        if let Some((stored, at)) = self.stored
            && (stored >= position || at.elapsed() < CURSOR_EVERY)
        {
            return Ok(());
        }
        db.advance_rule_cursor(position)
            .await
            .map_err(|e| e.to_string())?;
        self.stored = Some((position, Instant::now()));
        Ok(())
    }
}

/// Looks at one batch of events after the cursor.
async fn step(
    rules: &Rules,
    pipeline: &Pipeline,
    db: &Db,
    decode: Decode,
    cursor: &mut Cursor,
) -> Result<Looked, String> {
    if !pipeline.deployers_loaded() {
        return Ok(Looked::AllOf(Next::Events));
    }
    let after = cursor.position(db).await?;
    let events = db
        .events_after(after, Kinds::All, BATCH)
        .await
        .map_err(|e| e.to_string())?;
    let mut next = Next::Events;
    if !events.is_empty() {
        // Read after the events, so a rule stored before one of them was
        // committed is among these.
        let specs = rules.enabled().await.map_err(|e| e.to_string())?;
        if specs.is_empty() {
            next = Next::Idle;
        }
        for event in &events {
            if !specs.is_empty()
                && let Some(happened) = decode(event)
            {
                handle(&specs, pipeline, db, event.id, happened).await?;
            }
            cursor.position = Some(event.id);
        }
    }
    cursor.store(db).await?;
    Ok(match events.len() == BATCH as usize {
        true => Looked::More,
        false => Looked::AllOf(next),
    })
}

/// While no rule is enabled: moves the cursor to the log's end without
/// reading the events, or hands back to `step` once a rule is. The end is
/// read before the rules, so every event up to it was committed before
/// the rules were read: none of them could have fired.
async fn skip(rules: &Rules, db: &Db, cursor: &mut Cursor) -> Result<Looked, String> {
    let after = cursor.position(db).await?;
    let end = db.event_bounds().await.map_err(|e| e.to_string())?.last;
    if !rules.enabled().await.map_err(|e| e.to_string())?.is_empty() {
        return Ok(Looked::More);
    }
    cursor.position = Some(after.max(end));
    cursor.store(db).await?;
    Ok(Looked::AllOf(Next::Idle))
}

/// Fires each rule of `specs` that `happened` (event `event_id`) matches.
async fn handle(
    specs: &[Spec],
    pipeline: &Pipeline,
    db: &Db,
    event_id: i64,
    happened: Happened,
) -> Result<(), String> {
    let (model_id, previous) = match happened {
        Happened::Registered { model_id } => (model_id, None),
        Happened::Completed { deploy_id } => {
            match db.deployment(deploy_id).await.map_err(|e| e.to_string())? {
                Some(previous) => (previous.model_id, Some(previous)),
                None => return Ok(()),
            }
        }
    };
    let trigger = match &previous {
        None => Trigger::Registered,
        Some(d) => Trigger::Completed {
            deployer: d.deployer.clone(),
        },
    };
    let candidates: Vec<&Spec> = specs
        .iter()
        .filter(|s| s.trigger().as_ref() == Some(&trigger))
        .collect();
    if candidates.is_empty() {
        return Ok(());
    }
    // A deleted model fires nothing.
    let Some(model) = db.model(model_id).await.map_err(|e| e.to_string())? else {
        return Ok(());
    };
    let chain = match &previous {
        Some(d) => chain(db, d).await?,
        None => Vec::new(),
    };
    for spec in candidates {
        if !matching::matches(&spec.matches, &model, previous.as_ref()) {
            continue;
        }
        let cause = Cause {
            rule: spec.name.clone(),
            event_id,
            previous: previous.as_ref().map(|d| d.id),
        };
        // The rules as they are now were checked for cycles; a chain set
        // off before a change is held to the same bounds here.
        let refused = if chain.contains(&spec.name) {
            Some(format!(
                "rule {} already ran in this chain ({} → {}): a chain may not come back to a rule it already ran for the same model",
                spec.name,
                chain.join(" → "),
                spec.name
            ))
        } else if chain.len() >= MAX_DEPTH {
            Some(format!(
                "the chain {} is {MAX_DEPTH} steps deep already: rule {} would make it deeper than allowed",
                chain.join(" → "),
                spec.name
            ))
        } else {
            None
        };
        let fired = match refused {
            Some(error) => pipeline.fire_failed(&cause, model.id, &error).await?,
            None => match template::expand(&spec.deploy.options, &model, previous.as_ref()) {
                Err(e) => {
                    let error = format!("rule {}: {e}", spec.name);
                    pipeline.fire_failed(&cause, model.id, &error).await?
                }
                Ok(options) => {
                    let options_json = serde_json::Value::Object(options).to_string();
                    pipeline
                        .fire(Firing {
                            cause,
                            model: &model,
                            deployer: &spec.deploy.deployer,
                            options_json: &options_json,
                            held: spec.require_approval,
                        })
                        .await?
                }
            },
        };
        if let Fired::Recorded(id, status) = fired {
            tracing::debug!(
                rule = spec.name,
                event_id,
                deploy_id = id,
                status = status.as_str(),
                "rule fired"
            );
        }
    }
    Ok(())
}

/// The rules that led to deployment `last`, oldest first.
async fn chain(db: &Db, last: &Deployment) -> Result<Vec<String>, String> {
    let mut rules = Vec::new();
    let mut at = last.clone();
    while let Some(cause) = at.cause.clone() {
        rules.push(cause.rule);
        let Some(previous) = cause.previous else {
            break;
        };
        if rules.len() > MAX_DEPTH {
            break;
        }
        match db.deployment(previous).await.map_err(|e| e.to_string())? {
            Some(d) => at = d,
            None => break,
        }
    }
    rules.reverse();
    Ok(rules)
}
