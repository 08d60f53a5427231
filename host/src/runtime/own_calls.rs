//! A deployer's own HTTP requests as the host carries them, once the gate
//! has let them pass: every answer's headers and body masked of the call's
//! targets' credentials (`crate::scrub`), across the body's chunks; and a
//! request under a target (one its `call` allows) metered: its bytes each
//! way count against the target's `max_gib` (`Spending`), a body that
//! would pass it is broken off, and what it was and moved is reported
//! (`Reporter::called`) when its answer is read or dropped. Decides no
//! passage (`http_gate` does) and opens no connection (`connect` does).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error, WasiBody};

use super::report::Reporter;
use super::spending::Spending;
use crate::model::OwnCall;
use crate::scrub::{self, Scrubber};

/// A metered request's account, reported once its request and answer
/// bodies are both gone.
pub(crate) struct Meter {
    call: Mutex<OwnCall>,
    spending: Arc<Spending>,
    reporter: Arc<dyn Reporter>,
}

#[derive(Clone, Copy)]
enum Way {
    Sent,
    Received,
}

impl Meter {
    pub(crate) fn new(
        call: OwnCall,
        spending: Arc<Spending>,
        reporter: Arc<dyn Reporter>,
    ) -> Arc<Self> {
        Arc::new(Self {
            call: Mutex::new(call),
            spending,
            reporter,
        })
    }

    fn call(&self) -> std::sync::MutexGuard<'_, OwnCall> {
        self.call.lock().expect("never poisoned")
    }

    pub(crate) fn answered(&self, status: u16) {
        self.call().status = Some(status);
    }

    pub(crate) fn stopped(&self, why: &str) {
        self.call().stopped.get_or_insert_with(|| why.to_string());
    }

    /// `bytes` more went `way`, if the target's budget has room.
    fn count(&self, way: Way, bytes: u64) -> Result<(), String> {
        let (target, what) = {
            let call = self.call();
            let what = match way {
                Way::Sent => format!("the body of its {} {}", call.method, call.url),
                Way::Received => format!("the answer to its {} {}", call.method, call.url),
            };
            (call.target.clone(), what)
        };
        if let Err(e) = self.spending.stream(&target, bytes, &what) {
            self.stopped(&e);
            self.reporter.host_line(&e);
            return Err(e);
        }
        let mut call = self.call();
        match way {
            Way::Sent => call.sent += bytes,
            Way::Received => call.received += bytes,
        }
        Ok(())
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        let call = self.call.get_mut().expect("never poisoned");
        self.reporter.called(call);
    }
}

/// A request body, metered.
pub(crate) fn request(body: WasiBody, meter: Arc<Meter>) -> WasiBody {
    Watched {
        inner: body,
        meter: Some((meter, Way::Sent)),
        mask: None,
        trailers: None,
        ended: false,
    }
    .boxed_unsync()
}

/// An answer as the guest gets it: headers and body masked, metered when
/// under a target.
pub(crate) fn response(
    mut response: http::Response<WasiBody>,
    scrubber: &Scrubber,
    meter: Option<Arc<Meter>>,
) -> http::Response<WasiBody> {
    mask_headers(response.headers_mut(), scrubber);
    response.map(|body| {
        Watched {
            inner: body,
            meter: meter.map(|m| (m, Way::Received)),
            mask: (!scrubber.is_empty()).then(|| scrubber.stream()),
            trailers: None,
            ended: false,
        }
        .boxed_unsync()
    })
}

/// Each value that holds a credential, masked in place.
fn mask_headers(headers: &mut HeaderMap, scrubber: &Scrubber) {
    if scrubber.is_empty() {
        return;
    }
    for value in headers.values_mut() {
        if let std::borrow::Cow::Owned(masked) = scrubber.mask(value.as_bytes()) {
            *value = http::HeaderValue::from_bytes(&masked)
                .unwrap_or_else(|_| http::HeaderValue::from_static(scrub::REDACTED));
        }
    }
}

struct Watched {
    inner: WasiBody,
    meter: Option<(Arc<Meter>, Way)>,
    mask: Option<scrub::Stream>,
    /// Trailers that came while masked bytes were still held back.
    trailers: Option<HeaderMap>,
    ended: bool,
}

impl Watched {
    /// The bytes held back for masking, as a frame, if any.
    fn flush(&mut self) -> Option<Frame<Bytes>> {
        let rest = self.mask.as_mut()?.finish();
        (!rest.is_empty()).then(|| Frame::data(Bytes::from(rest)))
    }
}

impl Body for Watched {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        if let Some(trailers) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        if this.ended {
            return Poll::Ready(None);
        }
        match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    if let Some((meter, way)) = &this.meter
                        && let Err(e) = meter.count(*way, data.len() as u64)
                    {
                        this.ended = true;
                        return Poll::Ready(Some(Err(Error::InternalError(Some(e)))));
                    }
                    let data = match &mut this.mask {
                        Some(mask) => Bytes::from(mask.push(&data)),
                        None => data,
                    };
                    Poll::Ready(Some(Ok(Frame::data(data))))
                }
                Err(frame) => {
                    let Ok(mut trailers) = frame.into_trailers() else {
                        return Poll::Ready(None);
                    };
                    if let Some(mask) = &this.mask {
                        let scrubber = mask.scrubber().clone();
                        mask_headers(&mut trailers, &scrubber);
                    }
                    match this.flush() {
                        Some(held) => {
                            this.trailers = Some(trailers);
                            Poll::Ready(Some(Ok(held)))
                        }
                        None => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
                    }
                }
            },
            Some(Err(e)) => {
                if let Some((meter, _)) = &this.meter {
                    meter.stopped(&e.to_string());
                }
                Poll::Ready(Some(Err(e)))
            }
            None => {
                this.ended = true;
                Poll::Ready(this.flush().map(Ok))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.trailers.is_none()
            && (self.ended || (self.mask.is_none() && self.inner.is_end_stream()))
    }

    fn size_hint(&self) -> SizeHint {
        // Masking keeps every length.
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scrub::Secret;
    use crate::targets::Targets;
    use http_body_util::{Full, StreamBody};

    struct Calls(Mutex<Vec<OwnCall>>, Mutex<Vec<String>>);

    impl Reporter for Calls {
        fn log(&self, _: super::super::report::GuestLevel, _: &str) {}
        fn progress(&self, _: u64, _: u64, _: &str) {}
        fn called(&self, call: &OwnCall) {
            self.0.lock().unwrap().push(call.clone());
        }
        fn host_line(&self, message: &str) {
            self.1.lock().unwrap().push(message.to_string());
        }
    }

    fn chunks(parts: &[&'static str]) -> WasiBody {
        let frames: Vec<Result<Frame<Bytes>, Error>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
            .collect();
        StreamBody::new(futures::stream::iter(frames)).boxed_unsync()
    }

    fn call() -> OwnCall {
        OwnCall {
            target: "m".into(),
            method: "POST".into(),
            url: "http://h/m/hook".into(),
            status: None,
            sent: 0,
            received: 0,
            stopped: None,
        }
    }

    fn spending() -> Arc<Spending> {
        let sources = "[[target]]\nname = \"m\"\nurl = \"http://h/m/\"\nmax_gib = 1\n";
        let targets = Targets::parse(sources, "s.toml", |_| None).unwrap();
        Arc::new(Spending::new(Arc::new(targets), Default::default()))
    }

    #[tokio::test]
    async fn an_answer_is_masked_across_chunks_and_its_call_recorded_once_read() {
        let scrubber = Scrubber::new([Secret::Header(b"Bearer hunter2-token")]);
        let reporter = Arc::new(Calls(Mutex::default(), Mutex::default()));
        let meter = Meter::new(call(), spending(), reporter.clone());
        let answer = http::Response::builder()
            .status(200)
            .header("x-echo", "Bearer hunter2-token")
            .body(chunks(&["you sent: Bearer hun", "ter2-", "token, ok"]))
            .unwrap();
        meter.answered(200);
        let answer = response(answer, &scrubber, Some(meter));
        assert_eq!(answer.headers()["x-echo"], "********************");
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"you sent: ********************, ok");
        let calls = reporter.0.lock().unwrap().clone();
        assert_eq!(calls.len(), 1);
        assert_eq!((calls[0].status, calls[0].received), (Some(200), 34));
        assert_eq!(
            calls[0].to_string(),
            "request POST http://h/m/hook (target \"m\"): answered 200, 0 bytes sent, 34 bytes received"
        );
    }

    #[tokio::test]
    async fn a_request_body_past_the_targets_budget_is_broken_off() {
        let reporter = Arc::new(Calls(Mutex::default(), Mutex::default()));
        let spending = spending();
        spending.add("m", (1 << 30) - 4);
        let meter = Meter::new(call(), spending.clone(), reporter.clone());
        let body = request(chunks(&["abc", "def"]), meter);
        let error = body.collect().await.err().unwrap();
        assert!(
            error
                .to_string()
                .contains("target \"m\" takes at most 1 GiB"),
            "{error}"
        );
        let calls = reporter.0.lock().unwrap().clone();
        assert_eq!(calls[0].sent, 3);
        assert!(calls[0].stopped.as_deref().unwrap().contains("max_gib"));
        assert_eq!(reporter.1.lock().unwrap().len(), 1);
        // Nothing past the budget was counted.
        assert_eq!(spending.sent("m"), (1 << 30) - 1);
        // An unmetered, unmasked body passes as it is.
        let plain = response(
            http::Response::new(
                Full::new(Bytes::from_static(b"x"))
                    .map_err(|n| match n {})
                    .boxed_unsync(),
            ),
            &Scrubber::default(),
            None,
        );
        let bytes = plain.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"x");
    }
}
