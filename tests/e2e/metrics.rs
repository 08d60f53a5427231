//! `/metrics` read as a scraper reads it, against what the server was
//! actually made to do: deployments that completed and failed, bytes
//! fetched and bytes vouched for by the verification record, plugin calls,
//! requests by route template; and `--metrics-listen`, `--metrics off`.

use reqwest::StatusCode;
use serde_json::json;

use crate::support::files::FileServer;
use crate::support::prometheus::Scrape;
use crate::support::server::{Backend, Berth};
use crate::support::{adapter_files, eventually, model, on_both_backends};

on_both_backends!(the_counters_follow_the_deployments_that_ran);

/// Reads `url` (a `/metrics`) as Prometheus would, asserting the format.
async fn scrape(client: &reqwest::Client, url: &str) -> Scrape {
    let response = client.get(url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    Scrape::parse(&response.text().await.unwrap())
}

async fn the_counters_follow_the_deployments_that_ran(backend: Backend) {
    let files = FileServer::start().await;
    let berth = Berth::start(backend).await;
    let contents = adapter_files();
    let model_bytes: usize = contents.iter().map(|(_, b)| b.len()).sum();
    let id = berth
        .register(&model(&files, "job-metrics", &contents))
        .await;
    let metrics = format!("{}/metrics", berth.url);

    let before = scrape(berth.client(), &metrics).await;
    assert_eq!(before.value("berth_plugins_loaded", &[]), 2.0);
    assert_eq!(before.value("berth_plugins_rejected", &[]), 0.0);
    assert_eq!(before.value("berth_deployments_running", &[]), 0.0);
    assert_eq!(before.value("berth_deployments_queued", &[]), 0.0);
    assert_eq!(before.value("berth_fetched_bytes_total", &[]), 0.0);
    // The loader asked each plugin to describe itself.
    for plugin in ["archive", "misbehave"] {
        let describe = [("plugin", plugin), ("call", "describe")];
        assert_eq!(
            before.value("berth_plugin_call_duration_seconds_count", &describe),
            1.0
        );
    }

    // The first deployment downloads every byte once.
    let (status, body) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let first = scrape(berth.client(), &metrics).await;
    assert_eq!(
        first.value("berth_fetched_bytes_total", &[]),
        model_bytes as f64
    );
    assert_eq!(first.value("berth_stamp_verified_bytes_total", &[]), 0.0);

    // The model did not change: the next two read the verification record
    // instead of a byte; one of them fails in its deployer.
    let (status, body) = berth
        .deploy(id, "misbehave", json!({ "mode": "error" }))
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    let (status, body) = berth.deploy(id, "archive", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = berth.get("/v1/no-such-thing").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = berth.get(&format!("/v1/models/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = berth.get("/v1/models/999999").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let after = scrape(berth.client(), &metrics).await;
    let completed = [("deployer", "archive"), ("outcome", "completed")];
    let failed = [("deployer", "misbehave"), ("outcome", "failed")];
    assert_eq!(after.value("berth_deployments_total", &completed), 2.0);
    assert_eq!(after.value("berth_deployments_total", &failed), 1.0);
    assert_eq!(after.value("berth_deployments_total", &[]), 3.0);
    assert_eq!(
        after.value("berth_deployment_duration_seconds_count", &completed),
        2.0
    );
    assert_eq!(
        after.value("berth_deployment_duration_seconds_count", &failed),
        1.0
    );
    assert_eq!(
        after.value(
            "berth_fetch_duration_seconds_count",
            &[("outcome", "verified")]
        ),
        3.0
    );
    assert_eq!(after.value("berth_deployments_running", &[]), 0.0);
    assert_eq!(
        after.value("berth_fetched_bytes_total", &[]),
        model_bytes as f64
    );
    assert_eq!(
        after.value("berth_stamp_verified_bytes_total", &[]),
        2.0 * model_bytes as f64
    );
    let calls = |plugin, call| {
        after.value(
            "berth_plugin_call_duration_seconds_count",
            &[("plugin", plugin), ("call", call)],
        )
    };
    assert_eq!(calls("archive", "check_options"), 2.0);
    assert_eq!(calls("archive", "deploy"), 2.0);
    assert_eq!(calls("misbehave", "check_options"), 1.0);
    assert_eq!(calls("misbehave", "deploy"), 1.0);

    let requests = |method, route, status| {
        after.value(
            "berth_http_requests_total",
            &[("method", method), ("route", route), ("status", status)],
        )
    };
    let deployments = "/v1/models/{id}/deployments";
    assert_eq!(requests("POST", "/v1/models", "201"), 1.0);
    assert_eq!(requests("POST", deployments, "200"), 2.0);
    assert_eq!(requests("POST", deployments, "502"), 1.0);
    assert_eq!(requests("GET", "/v1/models/{id}", "200"), 1.0);
    assert_eq!(requests("GET", "/v1/models/{id}", "404"), 1.0);
    assert_eq!(requests("GET", "unmatched", "404"), 1.0);
    // Scrapes are requests too, counted once answered: this one is not yet.
    assert_eq!(requests("GET", "/metrics", "200"), 2.0);
    // Labelled by template only: a raw path would make a series per id.
    for sample in after.matching("berth_http_requests_total", &[]) {
        let route = &sample.labels["route"];
        assert!(
            !route
                .split('/')
                .any(|segment| segment.parse::<u64>().is_ok()),
            "a raw path as a route label: {route}"
        );
    }
}

#[tokio::test]
async fn metrics_listen_serves_metrics_and_nothing_else() {
    let berth = Berth::start_with(Backend::Sqlite, &["--metrics-listen", "127.0.0.1:0"]).await;
    let log = berth.log();
    let address = log
        .lines()
        .find_map(|line| line.split("metrics are served on ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no metrics address in the log:\n{log}"));
    let metrics = scrape(berth.client(), address).await;
    assert_eq!(metrics.value("berth_plugins_loaded", &[]), 2.0);

    let base = address.strip_suffix("/metrics").unwrap();
    for path in ["/healthz", "/v1/models", "/v1/deployers", "/metrics/"] {
        let response = berth
            .client()
            .get(format!("{base}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
        let body = response.text().await.unwrap();
        assert!(
            body.contains("this address serves only GET /metrics"),
            "{path}: {body}"
        );
    }
    // The API's own address keeps its /metrics.
    scrape(berth.client(), &format!("{}/metrics", berth.url)).await;
}

#[tokio::test]
async fn metrics_off_serves_no_metrics_and_refuses_a_metrics_address() {
    let berth = Berth::start_with(Backend::Sqlite, &["--metrics", "off"]).await;
    let (status, body) = berth.get("/metrics").await;
    crate::support::assert_error(
        &(status, body),
        StatusCode::NOT_FOUND,
        "metrics are turned off on this server (--metrics off)",
    );
    // --metrics-listen without metrics is a contradiction, refused at start.
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args([
            "serve",
            "--metrics",
            "off",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(berth.data_dir().join("other"))
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("--metrics-listen 127.0.0.1:0 serves metrics, but --metrics is off"),
        "{stderr}"
    );
}

/// The gauges read the state as it is now: plugins as the watcher swaps
/// them in and out, deployments while they run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gauges_follow_the_plugins_folder_and_running_deployments() {
    let files = FileServer::start().await;
    let berth = Berth::options(Backend::Sqlite)
        .arg("--plugins-poll-ms")
        .arg("100")
        .start()
        .await;
    let metrics = format!("{}/metrics", berth.url);
    let plugins = |want_loaded: f64, want_rejected: f64| {
        let (berth, metrics) = (&berth, &metrics);
        eventually(
            move || {
                format!(
                    "{want_loaded} loaded, {want_rejected} rejected; log:\n{}",
                    berth.log()
                )
            },
            async move || {
                let now = scrape(berth.client(), metrics).await;
                (now.value("berth_plugins_loaded", &[]) == want_loaded
                    && now.value("berth_plugins_rejected", &[]) == want_rejected)
                    .then_some(())
            },
        )
    };
    let dir = berth.plugins_dir().to_path_buf();
    let archive = std::fs::read(crate::support::plugins::example("archive")).unwrap();
    std::fs::write(dir.join(".packer.tmp"), &archive).unwrap();
    std::fs::rename(dir.join(".packer.tmp"), dir.join("packer.wasm")).unwrap();
    plugins(3.0, 0.0).await;
    std::fs::write(dir.join("broken.wasm"), b"not a component").unwrap();
    plugins(3.0, 1.0).await;
    std::fs::remove_file(dir.join("packer.wasm")).unwrap();
    std::fs::remove_file(dir.join("broken.wasm")).unwrap();
    plugins(2.0, 0.0).await;

    let id = berth
        .register(&model(&files, "job-gauges", &adapter_files()))
        .await;
    let running = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 60000 }))
        .await;
    eventually(
        || "the deployment to be claimed and counted running".to_string(),
        async || {
            let now = scrape(berth.client(), &metrics).await;
            (now.value("berth_deployments_running", &[]) == 1.0).then_some(())
        },
    )
    .await;
    let (status, cancelled) = berth.cancel(&running).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["status"], "failed");
    let now = scrape(berth.client(), &metrics).await;
    assert_eq!(now.value("berth_deployments_running", &[]), 0.0);
    let failed = [("deployer", "misbehave"), ("outcome", "failed")];
    assert_eq!(now.value("berth_deployments_total", &failed), 1.0);
}

/// The queue's depth, counted on each lease renewal (every 200 ms here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queued_gauge_follows_the_queue() {
    let files = FileServer::start().await;
    let berth = Berth::start_with(
        Backend::Sqlite,
        &["--max-running", "1", "--lease-ms", "600"],
    )
    .await;
    let id = berth
        .register(&model(&files, "job-queued", &adapter_files()))
        .await;
    let metrics = format!("{}/metrics", berth.url);
    let queued_is = async |n: f64| {
        eventually(
            || format!("berth_deployments_queued to be {n}"),
            async || {
                let now = scrape(berth.client(), &metrics).await;
                (now.value("berth_deployments_queued", &[]) == n).then_some(())
            },
        )
        .await
    };
    let busy = berth
        .deploy_detached(id, "misbehave", json!({ "mode": "sleep", "ms": 60000 }))
        .await;
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let queued = berth
            .deploy_detached(id, "misbehave", json!({ "mode": "ok" }))
            .await;
        assert_eq!(queued["status"], "queued", "{queued}");
        waiting.push(queued["id"].clone());
    }
    queued_is(2.0).await;
    let cancel = async |id: &serde_json::Value| {
        let (status, row) = berth
            .post(&format!("/v1/deployments/{id}/cancel"), &json!({}))
            .await;
        assert_eq!(status, StatusCode::OK, "{row}");
    };
    cancel(&waiting[0]).await;
    queued_is(1.0).await;
    // The slot frees, the last one runs.
    cancel(&busy["id"]).await;
    queued_is(0.0).await;
}

/// A deployment queued behind a busy one (`--max-running 1`) reads its
/// model's verification record when it is claimed, not also when it is
/// queued: its model's bytes count as verified once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_deployment_counts_its_verified_bytes_once() {
    let files = FileServer::start().await;
    let berth = Berth::start_with(Backend::Sqlite, &["--max-running", "1"]).await;
    let contents = adapter_files();
    let model_bytes: usize = contents.iter().map(|(_, b)| b.len()).sum();
    let fetched = berth
        .register(&model(&files, "job-verified", &contents))
        .await;
    let (status, body) = berth.deploy(fetched, "misbehave", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Busy with another model of other bytes, fetched for the first time:
    // nothing of it is verified from a record (a file the blob store holds
    // would be, by its blob's stamp).
    let own: Vec<_> = contents
        .iter()
        .map(|(path, bytes)| (*path, [bytes.as_slice(), b"busy"].concat()))
        .collect();
    let other = berth.register(&model(&files, "job-busy", &own)).await;
    let busy = berth
        .deploy_detached(other, "misbehave", json!({ "mode": "sleep", "ms": 60000 }))
        .await;
    assert_eq!(busy["status"], "running", "{busy}");
    let queued = berth.deploy_detached(fetched, "misbehave", json!({})).await;
    assert_eq!(queued["status"], "queued", "{queued}");
    let (status, cancelled) = berth.cancel(&busy).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    let path = format!("/v1/deployments/{}", queued["id"]);
    let row = eventually(
        || "the queued deployment to end".to_string(),
        async || {
            let (_, row) = berth.get(&path).await;
            crate::support::has_ended(&row).then_some(row)
        },
    )
    .await;
    assert_eq!(row["status"], "completed", "{row}");
    let metrics = scrape(berth.client(), &format!("{}/metrics", berth.url)).await;
    assert_eq!(
        metrics.value("berth_stamp_verified_bytes_total", &[]),
        model_bytes as f64
    );
}
