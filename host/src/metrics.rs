//! The server's Prometheus metrics: their names, help, labels and buckets,
//! the calls that record them, and their text rendering. The pipeline, the
//! runtime's call boundary, the fetcher, the deployers and the HTTP layer
//! call in with numbers; this module reads no request, row or file. Until
//! `install` (a server with `--metrics off`, `berth plugin`, in-process
//! tests) every call is one atomic load and does nothing.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::model::Outcome;

/// Prometheus's text exposition format, version 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Upper bounds, in seconds, of every duration histogram: from a plugin's
/// `check-options` (milliseconds) to a large model's fetch (the default
/// limit is 30 minutes).
const DURATION_BUCKETS: [f64; 18] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    900.0, 1800.0,
];

static METRICS: OnceLock<Metrics> = OnceLock::new();

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeploymentLabels {
    deployer: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FiringLabels {
    rule: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FetchLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    plugin: String,
    call: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LoopLabels {
    name: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

type Durations<L> = Family<L, Histogram>;

fn durations() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

struct Metrics {
    registry: Registry,
    deployments: Family<DeploymentLabels, Counter>,
    deployment_duration: Durations<DeploymentLabels>,
    running: Gauge,
    queued: Gauge,
    fetch_duration: Durations<FetchLabels>,
    fetched_bytes: Counter,
    stamp_verified_bytes: Counter,
    plugin_calls: Durations<CallLabels>,
    plugins_loaded: Gauge,
    plugins_rejected: Gauge,
    http_requests: Family<RequestLabels, Counter>,
    events_waiting: Gauge,
    webhook_delivered: Counter,
    webhook_failed: Counter,
    webhook_given_up: Counter,
    webhook_delivering: Gauge,
    webhook_failing: Gauge,
    rule_firings: Family<FiringLabels, Counter>,
    models_stored: Gauge,
    models_saved: Gauge,
    copies_evicted: Counter,
    loops_ended: Family<LoopLabels, Counter>,
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::default();
        let deployments: Family<DeploymentLabels, Counter> = Family::default();
        registry.register(
            "berth_deployments",
            "Deployments that ended, by deployer and outcome (completed, failed)",
            deployments.clone(),
        );
        let deployment_duration = Durations::new_with_constructor(durations as fn() -> _);
        registry.register_with_unit(
            "berth_deployment_duration",
            "How long deployments took from fetch to recorded outcome, by deployer and outcome",
            Unit::Seconds,
            deployment_duration.clone(),
        );
        let running = Gauge::default();
        registry.register(
            "berth_deployments_running",
            "Deployments running in this process",
            running.clone(),
        );
        let queued = Gauge::default();
        registry.register(
            "berth_deployments_queued",
            "Deployments waiting for their turn in the queue every server on the database shares",
            queued.clone(),
        );
        let fetch_duration = Durations::new_with_constructor(durations as fn() -> _);
        registry.register_with_unit(
            "berth_fetch_duration",
            "How long fetching and verifying a deployment's model files took, by outcome (verified, failed)",
            Unit::Seconds,
            fetch_duration.clone(),
        );
        let fetched_bytes = Counter::default();
        registry.register_with_unit(
            "berth_fetched",
            "Bytes received from model sources",
            Unit::Bytes,
            fetched_bytes.clone(),
        );
        let stamp_verified_bytes = Counter::default();
        registry.register_with_unit(
            "berth_stamp_verified",
            "Bytes of model files trusted without re-hashing because their verification record still matched",
            Unit::Bytes,
            stamp_verified_bytes.clone(),
        );
        let plugin_calls = Durations::new_with_constructor(durations as fn() -> _);
        registry.register_with_unit(
            "berth_plugin_call_duration",
            "How long calls into plugins took, by plugin and call (describe, check_options, deploy)",
            Unit::Seconds,
            plugin_calls.clone(),
        );
        let plugins_loaded = Gauge::default();
        registry.register(
            "berth_plugins_loaded",
            "Deployers loaded from the plugins folder",
            plugins_loaded.clone(),
        );
        let plugins_rejected = Gauge::default();
        registry.register(
            "berth_plugins_rejected",
            "Files in the plugins folder that were refused (listed under rejected in GET /v1/deployers)",
            plugins_rejected.clone(),
        );
        let http_requests: Family<RequestLabels, Counter> = Family::default();
        registry.register(
            "berth_http_requests",
            "HTTP requests answered, by method, route template and status",
            http_requests.clone(),
        );
        let events_waiting = Gauge::default();
        registry.register(
            "berth_events_waiting",
            "Events published by this server and not yet stored in the event log (the database refusing writes)",
            events_waiting.clone(),
        );
        let webhook_delivered = Counter::default();
        registry.register(
            "berth_webhook_delivered",
            "Events this server delivered to the webhook (answered 2xx)",
            webhook_delivered.clone(),
        );
        let webhook_failed = Counter::default();
        registry.register(
            "berth_webhook_failed_attempts",
            "Webhook POSTs by this server that failed (no answer, or not 2xx); each is tried again",
            webhook_failed.clone(),
        );
        let webhook_given_up = Counter::default();
        registry.register(
            "berth_webhook_given_up",
            "Events this server gave up delivering to the webhook after the give-up time",
            webhook_given_up.clone(),
        );
        let webhook_delivering = Gauge::default();
        registry.register(
            "berth_webhook_delivering",
            "1 while this server holds the webhook's delivery lease (one server of those sharing the database does)",
            webhook_delivering.clone(),
        );
        let webhook_failing = Gauge::default();
        registry.register(
            "berth_webhook_failing",
            "1 while this server is retrying an event the webhook did not take",
            webhook_failing.clone(),
        );
        let rule_firings: Family<FiringLabels, Counter> = Family::default();
        registry.register(
            "berth_rule_firings",
            "Rule firings this server recorded, by rule and outcome (queued, awaiting_approval, failed); each event fires a rule once across the servers",
            rule_firings.clone(),
        );
        let models_stored = Gauge::default();
        registry.register_with_unit(
            "berth_models_stored",
            "Bytes the models dir holds on disk (model directories and blobs, each file once), as last scanned",
            Unit::Bytes,
            models_stored.clone(),
        );
        let models_saved = Gauge::default();
        registry.register_with_unit(
            "berth_models_saved",
            "Bytes the model directories would take beyond what is on disk, were their shared (hard-linked) files separate copies, as last scanned",
            Unit::Bytes,
            models_saved.clone(),
        );
        let copies_evicted = Counter::default();
        registry.register(
            "berth_model_copies_evicted",
            "Models whose local copy was dropped to keep the models dir within its budget (--models-max-gib)",
            copies_evicted.clone(),
        );
        let loops_ended: Family<LoopLabels, Counter> = Family::default();
        registry.register(
            "berth_loops_ended",
            "The server's long-lived loops that ended while it ran (they run until it stops), by name",
            loops_ended.clone(),
        );
        Self {
            registry,
            loops_ended,
            deployments,
            deployment_duration,
            running,
            queued,
            fetch_duration,
            fetched_bytes,
            stamp_verified_bytes,
            plugin_calls,
            plugins_loaded,
            plugins_rejected,
            http_requests,
            events_waiting,
            webhook_delivered,
            webhook_failed,
            webhook_given_up,
            webhook_delivering,
            webhook_failing,
            rule_firings,
            models_stored,
            models_saved,
            copies_evicted,
        }
    }
}

/// Starts recording, for the rest of the process.
pub fn install() {
    METRICS.get_or_init(Metrics::new);
}

/// Every metric in the text exposition format, or `None` if metrics are
/// off.
pub fn render() -> Option<String> {
    let metrics = METRICS.get()?;
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &metrics.registry)
        .expect("writing to a String cannot fail");
    Some(text)
}

pub fn deployment_started() {
    if let Some(m) = METRICS.get() {
        m.running.inc();
    }
}

pub fn deployment_ended(deployer: &str, outcome: &Outcome, took: Duration) {
    let Some(m) = METRICS.get() else { return };
    m.running.dec();
    let labels = DeploymentLabels {
        deployer: deployer.to_string(),
        outcome: match outcome {
            Outcome::Completed { .. } => "completed",
            Outcome::Failed { .. } => "failed",
        },
    };
    m.deployments.get_or_create(&labels).inc();
    m.deployment_duration
        .get_or_create(&labels)
        .observe(took.as_secs_f64());
}

pub fn fetch_ended(verified: bool, took: Duration) {
    let Some(m) = METRICS.get() else { return };
    let outcome = if verified { "verified" } else { "failed" };
    m.fetch_duration
        .get_or_create(&FetchLabels { outcome })
        .observe(took.as_secs_f64());
}

/// Bytes as they arrive from a source (a retried download counts again:
/// they crossed the network again).
pub fn fetched_bytes(n: u64) {
    if let Some(m) = METRICS.get() {
        m.fetched_bytes.inc_by(n);
    }
}

/// A file's bytes that its verification record vouched for, so they were
/// not read.
pub fn stamp_verified_bytes(n: u64) {
    if let Some(m) = METRICS.get() {
        m.stamp_verified_bytes.inc_by(n);
    }
}

/// One call into a plugin; `call` is `describe`, `check_options` or
/// `deploy`.
pub fn plugin_call(plugin: &str, call: &'static str, took: Duration) {
    let Some(m) = METRICS.get() else { return };
    m.plugin_calls
        .get_or_create(&CallLabels {
            plugin: plugin.to_string(),
            call,
        })
        .observe(took.as_secs_f64());
}

/// A long-lived loop ended before the server's stop.
pub fn loop_ended(name: &'static str) {
    let Some(m) = METRICS.get() else { return };
    m.loops_ended.get_or_create(&LoopLabels { name }).inc();
}

/// The plugin set now served: called whenever it is swapped.
pub fn plugins(loaded: usize, rejected: usize) {
    let Some(m) = METRICS.get() else { return };
    m.plugins_loaded.set(loaded.try_into().unwrap_or(i64::MAX));
    m.plugins_rejected
        .set(rejected.try_into().unwrap_or(i64::MAX));
}

/// One answered request; `route` is the matched route's template (never
/// the raw path, whose ids would make a series each).
pub fn http_request(method: &str, route: &str, status: u16) {
    let Some(m) = METRICS.get() else { return };
    m.http_requests
        .get_or_create(&RequestLabels {
            method: method.to_string(),
            route: route.to_string(),
            status,
        })
        .inc();
}

/// Deployments waiting in the shared queue, as last counted.
pub fn deployments_queued(n: u64) {
    if let Some(m) = METRICS.get() {
        m.queued.set(n.try_into().unwrap_or(i64::MAX));
    }
}

/// Events waiting to be stored in the event log.
pub fn events_waiting(n: usize) {
    if let Some(m) = METRICS.get() {
        m.events_waiting.set(n.try_into().unwrap_or(i64::MAX));
    }
}

pub fn webhook_delivered() {
    if let Some(m) = METRICS.get() {
        m.webhook_delivered.inc();
    }
}

pub fn webhook_failed() {
    if let Some(m) = METRICS.get() {
        m.webhook_failed.inc();
    }
}

pub fn webhook_given_up() {
    if let Some(m) = METRICS.get() {
        m.webhook_given_up.inc();
    }
}

/// Whether this server holds the webhook's delivery lease.
pub fn webhook_delivering(holding: bool) {
    if let Some(m) = METRICS.get() {
        m.webhook_delivering.set(i64::from(holding));
    }
}

/// Whether this server is retrying an event the webhook refused.
/// A rule fired here: `outcome` is the status of the deployment it
/// recorded, or `failed` when it could not make one.
pub fn rule_fired(rule: &str, outcome: &'static str) {
    if let Some(m) = METRICS.get() {
        m.rule_firings
            .get_or_create(&FiringLabels {
                rule: rule.to_string(),
                outcome,
            })
            .inc();
    }
}

pub fn webhook_failing(failing: bool) {
    if let Some(m) = METRICS.get() {
        m.webhook_failing.set(i64::from(failing));
    }
}

/// What the models dir holds on disk and what sharing saves, as a scan
/// of it (`fetch::Fetcher::usage`) found.
pub fn models_storage(stored: u64, saved: u64) {
    let Some(m) = METRICS.get() else { return };
    m.models_stored.set(stored.try_into().unwrap_or(i64::MAX));
    m.models_saved.set(saved.try_into().unwrap_or(i64::MAX));
}

/// One model's local copy dropped to keep within the budget.
pub fn model_copy_evicted() {
    if let Some(m) = METRICS.get() {
        m.copies_evicted.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are what dashboards and alerts are written against.
    #[test]
    fn names_types_and_units_are_pinned() {
        install();
        // A labelled family is rendered once it has a series.
        let failed = Outcome::Failed {
            error: "cancelled".into(),
        };
        deployment_started();
        deployment_ended("archive", &failed, Duration::from_millis(5));
        fetch_ended(true, Duration::from_millis(2));
        plugin_call("archive", "deploy", Duration::from_millis(1));
        http_request("GET", "/v1/models", 200);
        rule_fired("check", "queued");
        // Every labelled family gets a series here, so that what other
        // tests of this process recorded first changes no line.
        loop_ended("sweep");
        #[rustfmt::skip]
        let expected = [
            ("berth_deployments_total", "counter"),
            ("berth_deployment_duration_seconds", "histogram"),
            ("berth_deployments_running", "gauge"),
            ("berth_deployments_queued", "gauge"),
            ("berth_fetch_duration_seconds", "histogram"),
            ("berth_fetched_bytes_total", "counter"),
            ("berth_stamp_verified_bytes_total", "counter"),
            ("berth_plugin_call_duration_seconds", "histogram"),
            ("berth_plugins_loaded", "gauge"),
            ("berth_plugins_rejected", "gauge"),
            ("berth_http_requests_total", "counter"),
            ("berth_events_waiting", "gauge"),
            ("berth_webhook_delivered_total", "counter"),
            ("berth_webhook_failed_attempts_total", "counter"),
            ("berth_webhook_given_up_total", "counter"),
            ("berth_webhook_delivering", "gauge"),
            ("berth_webhook_failing", "gauge"),
            ("berth_rule_firings_total", "counter"),
            ("berth_models_stored_bytes", "gauge"),
            ("berth_models_saved_bytes", "gauge"),
            ("berth_model_copies_evicted_total", "counter"),
            ("berth_loops_ended_total", "counter"),
        ];
        let text = render().unwrap();
        let declared: Vec<(&str, &str)> = text
            .lines()
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .filter_map(|rest| rest.split_once(' '))
            .collect();
        assert_eq!(declared, expected, "{text}");
    }
}
