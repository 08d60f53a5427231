//! A webhook receiver on loopback: what berth delivered, as a receiver
//! would keep it.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use reqwest::StatusCode;
use serde_json::Value;

/// What reached the receiver: headers, body, and the status it answered.
pub type Received = Arc<Mutex<Vec<(HeaderMap, Bytes, u16)>>>;

/// A webhook receiver on loopback answering `answer` (settable).
#[derive(Clone)]
pub struct Receiver {
    pub url: String,
    pub received: Received,
    answer: Arc<AtomicU16>,
}

impl Receiver {
    pub async fn start(answer: StatusCode) -> Self {
        let receiver = Self {
            url: String::new(),
            received: Received::default(),
            answer: Arc::new(AtomicU16::new(answer.as_u16())),
        };
        let app = Router::new()
            .route(
                "/hook",
                post(
                    |State(r): State<Receiver>, headers: HeaderMap, body: Bytes| async move {
                        let answer = r.answer.load(Ordering::SeqCst);
                        r.received.lock().unwrap().push((headers, body, answer));
                        StatusCode::from_u16(answer).unwrap()
                    },
                ),
            )
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { url, ..receiver }
    }

    pub fn answer(&self, status: StatusCode) {
        self.answer.store(status.as_u16(), Ordering::SeqCst);
    }

    /// The events it took (answered 2xx), duplicates dropped by id as a
    /// receiver would, in the order they first arrived: (id, kind, body).
    pub fn taken(&self) -> Vec<(i64, String, Value)> {
        let mut seen = std::collections::HashSet::new();
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, answer)| (200..300).contains(answer))
            .filter_map(|(headers, body, _)| {
                let id: i64 = headers["x-berth-event-id"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                let kind = headers["x-berth-event"].to_str().unwrap().to_string();
                seen.insert(id)
                    .then(|| (id, kind, serde_json::from_slice(body).unwrap()))
            })
            .collect()
    }
}
