//! The fetcher against a loopback file server that can honour or ignore
//! ranges, cut a download off, send slowly, require a header or redirect:
//! resuming, what the verification record vouches for and what it does
//! not, and which requests carry the sources file's credentials.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;

use super::*;
use crate::test_tls::{self, TestCa};
use crate::trust::Trust;

#[derive(Default)]
struct Served {
    files: HashMap<String, Vec<u8>>,
    /// Send this many bytes of the answer, then drop the connection.
    cut_after: Option<usize>,
    /// Pause between 64 KiB chunks.
    slow: Option<Duration>,
    ignore_ranges: bool,
    /// Each request: file and the `Range` header it carried.
    requests: Vec<(String, Option<String>)>,
    /// Answers being sent now, and the most there were at once.
    in_flight: usize,
    most_in_flight: usize,
    /// Each request: file and the `Authorization` header it carried.
    authorizations: Vec<(String, Option<String>)>,
    /// Answer 401 to requests without this `Authorization` header.
    require: Option<String>,
    /// Answer requests for these files with a 302 to the given URL.
    redirects: HashMap<String, String>,
}

/// Counts an answer as in flight until its body is dropped.
struct InFlight(Arc<Mutex<Served>>);

impl InFlight {
    fn new(served: &Arc<Mutex<Served>>) -> Self {
        let mut s = served.lock().unwrap();
        s.in_flight += 1;
        s.most_in_flight = s.most_in_flight.max(s.in_flight);
        Self(served.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.lock().unwrap().in_flight -= 1;
    }
}

#[derive(Clone)]
struct Source {
    base: String,
    served: Arc<Mutex<Served>>,
}

impl Source {
    async fn start() -> Self {
        let served = Arc::new(Mutex::new(Served::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = Self::app(&served);
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { base, served }
    }

    /// The same source over HTTPS on 127.0.0.1, with a certificate for that
    /// address signed by `ca`.
    async fn start_tls(ca: &TestCa) -> Self {
        let served = Arc::new(Mutex::new(Served::default()));
        let addr = test_tls::serve(Self::app(&served), ca.server(&["127.0.0.1"])).await;
        let base = format!("https://{addr}");
        Self { base, served }
    }

    fn app(served: &Arc<Mutex<Served>>) -> Router {
        Router::new()
            .route("/{*key}", get(serve))
            .with_state(served.clone())
    }

    fn with<T>(&self, f: impl FnOnce(&mut Served) -> T) -> T {
        f(&mut self.served.lock().unwrap())
    }

    /// Requests so far for `path`, with their ranges.
    fn requests(&self, path: &str) -> Vec<Option<String>> {
        self.with(|s| {
            s.requests
                .iter()
                .filter(|(p, _)| p == path)
                .map(|(_, r)| r.clone())
                .collect()
        })
    }

    /// The `Authorization` header of each request so far for `path`.
    fn authorizations(&self, path: &str) -> Vec<Option<String>> {
        self.with(|s| {
            s.authorizations
                .iter()
                .filter(|(p, _)| p == path)
                .map(|(_, a)| a.clone())
                .collect()
        })
    }
}

async fn serve(
    State(served): State<Arc<Mutex<Served>>>,
    UrlPath(key): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    let range = headers
        .get(header::RANGE)
        .map(|v| v.to_str().unwrap().to_string());
    let authorization = headers
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap().to_string());
    let (bytes, cut_after, slow, ignore_ranges) = {
        let mut served = served.lock().unwrap();
        served.requests.push((key.clone(), range.clone()));
        served
            .authorizations
            .push((key.clone(), authorization.clone()));
        if served.require.is_some() && served.require != authorization {
            return StatusCode::UNAUTHORIZED.into_response();
        }
        if let Some(to) = served.redirects.get(&key) {
            return (StatusCode::FOUND, [(header::LOCATION, to.clone())]).into_response();
        }
        let Some(bytes) = served.files.get(&key).cloned() else {
            return StatusCode::NOT_FOUND.into_response();
        };
        (bytes, served.cut_after, served.slow, served.ignore_ranges)
    };
    let len = bytes.len();
    // `bytes=FROM-` or `bytes=FROM-LAST`.
    let span = match range.as_deref().filter(|_| !ignore_ranges) {
        None => None,
        Some(range) => {
            let (from, last) = range
                .strip_prefix("bytes=")
                .unwrap()
                .split_once('-')
                .unwrap();
            let from: usize = from.parse().unwrap();
            let end = match last {
                "" => len,
                last => (last.parse::<usize>().unwrap() + 1).min(len),
            };
            if from >= len {
                return StatusCode::RANGE_NOT_SATISFIABLE.into_response();
            }
            Some((from, end))
        }
    };
    let body = span
        .map_or(&bytes[..], |(from, end)| &bytes[from..end])
        .to_vec();
    let in_flight = InFlight::new(&served);
    let promised = body.len();
    let sent = cut_after.map_or(body.len(), |n| n.min(body.len()));
    let mut chunks: Vec<Result<Bytes, std::io::Error>> = body[..sent]
        .chunks(64 * 1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    if sent < promised {
        chunks.push(Err(std::io::Error::other("cut off on purpose")));
    }
    let stream = futures::StreamExt::then(futures::stream::iter(chunks), move |chunk| {
        let _in_flight = &in_flight;
        async move {
            match (&chunk, slow) {
                (Ok(_), Some(pause)) => tokio::time::sleep(pause).await,
                // The pause lets what was sent reach the client before the cut.
                (Err(_), _) => tokio::time::sleep(Duration::from_millis(100)).await,
                _ => {}
            }
            chunk
        }
    });
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_LENGTH, promised.into());
    if let Some((from, end)) = span {
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        let value = format!("bytes {from}-{}/{len}", end - 1);
        response
            .headers_mut()
            .insert(header::CONTENT_RANGE, value.parse().unwrap());
    }
    response
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

struct Setup {
    source: Source,
    _models: tempfile::TempDir,
    fetcher: Fetcher,
    model: TrainedModel,
}

impl Setup {
    /// A model `job` whose files are served by a fresh source.
    async fn new(files: &[(&str, Vec<u8>)]) -> Self {
        Self::on(Source::start().await, files)
    }

    /// A model `job` whose files are served by `source`.
    fn on(source: Source, files: &[(&str, Vec<u8>)]) -> Self {
        let models = tempfile::tempdir().unwrap();
        let fetcher = Fetcher::new(models.path().to_path_buf(), Duration::from_secs(60)).unwrap();
        let mut model_files = Vec::new();
        for (path, contents) in files {
            source.with(|s| s.files.insert(format!("job/{path}"), contents.clone()));
            model_files.push(ModelFile {
                path: path.to_string(),
                size_bytes: contents.len() as u64,
                sha256: Some(sha(contents)),
            });
        }
        let model = TrainedModel::from_files(
            "job",
            format!("{}/{{job_id}}/{{path}}", source.base),
            model_files,
        );
        Self {
            source,
            _models: models,
            fetcher,
            model,
        }
    }

    async fn fetch(&self) -> Result<PathBuf, Error> {
        self.fetcher
            .fetch(&self.model, Arc::new(Quiet), &CancellationToken::new())
            .await
    }

    fn path(&self, file: &str) -> PathBuf {
        self.fetcher.dir_of("job").join(file)
    }

    /// Every entry under the model directory, relative, sorted.
    fn on_disk(&self) -> Vec<String> {
        fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap().flatten() {
                if entry.file_type().unwrap().is_dir() {
                    walk(&entry.path(), base, out);
                } else {
                    out.push(
                        entry
                            .path()
                            .strip_prefix(base)
                            .unwrap()
                            .display()
                            .to_string(),
                    );
                }
            }
        }
        let mut out = Vec::new();
        let dir = self.fetcher.dir_of("job");
        walk(&dir, &dir, &mut out);
        out.sort();
        out
    }
}

#[track_caller]
fn assert_file(setup: &Setup, path: &str, expected: &[u8]) {
    let actual = std::fs::read(setup.path(path)).unwrap();
    assert!(
        actual == expected,
        "{path} holds other bytes than the source's"
    );
}

const BIG: usize = 3 * 1024 * 1024 + 17;

#[tokio::test]
async fn a_broken_off_download_continues_where_it_stopped() {
    let contents = bytes(1, BIG);
    let setup = Setup::new(&[("w/big.bin", contents.clone())]).await;
    setup.source.with(|s| s.cut_after = Some(2 * 1024 * 1024));

    let error = setup.fetch().await.unwrap_err().to_string();
    assert!(
        error.starts_with("file w/big.bin: the download broke off"),
        "{error}"
    );
    assert_eq!(
        setup.on_disk(),
        ["w/.fetch-big.bin"],
        "only the partial download, under its temp name"
    );
    let kept = std::fs::metadata(setup.path("w/.fetch-big.bin"))
        .unwrap()
        .len();
    assert!(kept > 0 && kept <= 2 * 1024 * 1024, "kept {kept} bytes");

    // The process lived through the interruption: it left a checkpoint of
    // its hash, outside the model directory.
    let record = setup
        .fetcher
        .models_dir
        .join(".berth/job.resume/w/big.bin.json");
    assert!(record.exists(), "no checkpoint at {}", record.display());

    setup.source.with(|s| s.cut_after = None);
    setup.fetch().await.unwrap();
    assert_file(&setup, "w/big.bin", &contents);
    assert_eq!(setup.on_disk(), ["w/big.bin"]);
    assert!(!record.exists(), "the checkpoint is used up");
    assert_eq!(
        setup.source.requests("job/w/big.bin"),
        [None, Some(format!("bytes={kept}-"))]
    );
}

#[tokio::test]
async fn kept_bytes_are_hashed_again_and_a_wrong_partial_is_downloaded_whole() {
    let contents = bytes(2, BIG);
    let setup = Setup::new(&[("big.bin", contents.clone())]).await;
    // What an earlier attempt left, with one byte changed since.
    let mut partial = contents[..BIG / 2].to_vec();
    partial[1000] ^= 0xff;
    std::fs::create_dir_all(setup.fetcher.dir_of("job")).unwrap();
    std::fs::write(setup.path(".fetch-big.bin"), &partial).unwrap();

    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(
        setup.source.requests("job/big.bin"),
        [Some(format!("bytes={}-", BIG / 2)), None]
    );
}

/// A download of `big.bin` cut halfway: the setup, the file's contents,
/// the kept partial, its checkpoint record and how many bytes were kept.
async fn cut_halfway(seed: u8) -> (Setup, Vec<u8>, PathBuf, PathBuf, u64) {
    let contents = bytes(seed, BIG);
    let setup = Setup::new(&[("big.bin", contents.clone())]).await;
    setup.source.with(|s| s.cut_after = Some(BIG / 2));
    setup.fetch().await.unwrap_err();
    let partial = setup.path(".fetch-big.bin");
    let record = setup
        .fetcher
        .models_dir
        .join(".berth/job.resume/big.bin.json");
    let kept = std::fs::metadata(&partial).unwrap().len();
    (setup, contents, partial, record, kept)
}

#[tokio::test]
async fn a_partial_changed_since_its_checkpoint_is_hashed_again() {
    let (setup, contents, partial, record, kept) = cut_halfway(12).await;
    let kept = kept as usize;
    let sha256 = sha(&contents);
    // Same length, mtime put back, one byte different: the checkpoint's
    // hash no longer describes the file, and its stamp says so.
    let mtime = std::fs::metadata(&partial).unwrap().modified().unwrap();
    let mut changed = contents[..kept].to_vec();
    changed[100] ^= 0x01;
    std::fs::write(&partial, &changed).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&partial)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    std::fs::copy(&record, record.with_extension("copy")).unwrap();
    assert!(partial::Checkpoint::take(&record, &partial, &sha256).is_none());

    // Through a fetch: the kept bytes are hashed again, found wrong, and the
    // file is downloaded whole.
    std::fs::rename(record.with_extension("copy"), &record).unwrap();
    setup.source.with(|s| s.cut_after = None);
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(
        setup.source.requests("job/big.bin"),
        [None, Some(format!("bytes={kept}-")), None]
    );
}

#[tokio::test]
async fn an_untouched_partial_is_continued_from_its_checkpoint() {
    let (_setup, contents, partial, record, kept) = cut_halfway(13).await;
    let hashed = partial::Checkpoint::take(&record, &partial, &sha(&contents))
        .expect("the checkpoint vouches");
    assert_eq!(hashed.have, Ranges::prefix(kept));
    assert_eq!(
        hashed.hash.map(|h| h.len()),
        Some(kept),
        "the checkpoint's hash covers every kept byte"
    );
}

#[tokio::test]
async fn a_checkpoint_in_the_old_format_is_not_read_and_the_kept_bytes_are_hashed_again() {
    let (setup, contents, partial, record, kept) = cut_halfway(14).await;
    // What berth wrote before checkpoints had a format: the state words of
    // its own SHA-256, the length, the bytes of the unfinished block. The
    // stamp still vouches for the file, so only the format can turn it down.
    // The words are not those of the kept bytes: were they believed, the
    // file would fail its hash and be downloaded whole.
    let new: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    let old = serde_json::json!({
        "stamp": new["stamp"],
        "hash": {
            "state": [0x6a09_e667_u32, 0xbb67_ae85_u32, 0x3c6e_f372_u32, 0xa54f_f53a_u32,
                      0x510e_527f_u32, 0x9b05_688c_u32, 0x1f83_d9ab_u32, 0x5be0_cd19_u32],
            "len": kept,
            "pending": contents[(kept - kept % 64) as usize..kept as usize],
        },
    });
    std::fs::write(&record, serde_json::to_vec(&old).unwrap()).unwrap();
    std::fs::copy(&record, record.with_extension("copy")).unwrap();
    assert!(partial::Checkpoint::take(&record, &partial, &sha(&contents)).is_none());
    assert!(!record.exists(), "the old checkpoint is used up");

    // Through a fetch: continued from the kept bytes, which are hashed
    // again, and verified whole.
    std::fs::rename(record.with_extension("copy"), &record).unwrap();
    setup.source.with(|s| s.cut_after = None);
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(
        setup.source.requests("job/big.bin"),
        [None, Some(format!("bytes={kept}-"))]
    );
}

#[tokio::test]
async fn a_source_without_ranges_is_read_from_the_start() {
    let contents = bytes(3, BIG);
    let setup = Setup::new(&[("big.bin", contents.clone())]).await;
    setup.source.with(|s| s.ignore_ranges = true);
    std::fs::create_dir_all(setup.fetcher.dir_of("job")).unwrap();
    std::fs::write(setup.path(".fetch-big.bin"), &contents[..1000]).unwrap();

    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(setup.on_disk(), ["big.bin"]);
}

#[tokio::test]
async fn a_complete_partial_is_verified_without_asking_the_source() {
    let contents = bytes(4, BIG);
    let setup = Setup::new(&[("big.bin", contents.clone())]).await;
    std::fs::create_dir_all(setup.fetcher.dir_of("job")).unwrap();
    std::fs::write(setup.path(".fetch-big.bin"), &contents).unwrap();

    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert!(setup.source.requests("job/big.bin").is_empty());
}

#[tokio::test]
async fn a_partial_longer_than_the_file_or_of_a_file_without_hash_is_not_continued() {
    let contents = bytes(5, BIG);
    let mut setup = Setup::new(&[("a.bin", contents.clone()), ("b.bin", contents.clone())]).await;
    setup.model.files[1].sha256 = None;
    std::fs::create_dir_all(setup.fetcher.dir_of("job")).unwrap();
    std::fs::write(setup.path(".fetch-a.bin"), vec![0; BIG + 1]).unwrap();
    std::fs::write(setup.path(".fetch-b.bin"), vec![0; 1000]).unwrap();

    setup.fetch().await.unwrap();
    assert_file(&setup, "a.bin", &contents);
    assert_file(&setup, "b.bin", &contents);
    assert_eq!(setup.source.requests("job/a.bin"), [None]);
    assert_eq!(setup.source.requests("job/b.bin"), [None]);
    assert_eq!(setup.on_disk(), ["a.bin", "b.bin"]);
}

#[tokio::test]
async fn a_cancelled_download_keeps_its_bytes_for_the_next_fetch() {
    let contents = bytes(6, BIG);
    let setup = Setup::new(&[("big.bin", contents.clone())]).await;
    setup
        .source
        .with(|s| s.slow = Some(Duration::from_millis(20)));
    let cancel = CancellationToken::new();
    let fetching = setup.fetcher.fetch(&setup.model, Arc::new(Quiet), &cancel);
    let partial = setup.path(".fetch-big.bin");
    let watch = async {
        while std::fs::metadata(&partial).map_or(0, |m| m.len()) < 256 * 1024 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cancel.cancel();
    };
    let (fetched, ()) = tokio::join!(fetching, watch);
    assert_eq!(fetched, Err(Error::Cancelled));

    setup.source.with(|s| s.slow = None);
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    let requests = setup.source.requests("job/big.bin");
    assert_eq!(requests.len(), 2);
    let resumed_at: u64 = requests[1]
        .as_deref()
        .unwrap()
        .trim_start_matches("bytes=")
        .trim_end_matches('-')
        .parse()
        .unwrap();
    assert!(resumed_at >= 256 * 1024, "resumed at {resumed_at}");
}

#[tokio::test]
async fn wrong_bytes_are_never_kept() {
    let contents = bytes(7, BIG);
    let mut setup = Setup::new(&[("big.bin", contents.clone())]).await;
    setup.model.files[0].sha256 = Some("0".repeat(64));
    let error = setup.fetch().await.unwrap_err().to_string();
    assert!(
        error.starts_with("file big.bin: sha256 mismatch: expected 0000"),
        "{error}"
    );
    assert_eq!(setup.on_disk(), Vec::<String>::new());
}

/// Changes a fetched file behind berth's back; the next fetch must notice.
type Tamper = fn(&Path, &[u8]);

#[tokio::test]
async fn the_verification_record_vouches_only_for_untouched_files() {
    let rewrite_in_place: Tamper = |path, contents| {
        let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
        let mut changed = contents.to_vec();
        changed[12345] ^= 0x01;
        std::fs::write(path, &changed).unwrap();
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
    };
    let truncate: Tamper = |path, _| {
        let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_len(1000).unwrap();
        file.set_modified(mtime).unwrap();
    };
    let replace: Tamper = |path, contents| {
        // Another file of the same size and mtime renamed over it.
        let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
        let other = path.with_file_name("other");
        let mut changed = contents.to_vec();
        changed[0] ^= 0x01;
        std::fs::write(&other, &changed).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&other)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        std::fs::rename(&other, path).unwrap();
    };
    let delete: Tamper = |path, _| std::fs::remove_file(path).unwrap();
    let cases = [
        ("rewritten in place", rewrite_in_place),
        ("truncated", truncate),
        ("replaced", replace),
        ("deleted", delete),
    ];

    for (case, tamper) in cases {
        let contents = bytes(8, BIG);
        let kept = bytes(9, 1000);
        let setup = Setup::new(&[("big.bin", contents.clone()), ("kept.bin", kept.clone())]).await;
        setup.fetch().await.unwrap();
        tamper(&setup.path("big.bin"), &contents);

        setup.fetch().await.unwrap();
        assert_file(&setup, "big.bin", &contents);
        assert_file(&setup, "kept.bin", &kept);
        assert_eq!(
            setup.source.requests("job/big.bin").len(),
            2,
            "{case}: fetched again"
        );
        assert_eq!(
            setup.source.requests("job/kept.bin").len(),
            1,
            "{case}: the untouched file is kept"
        );
        assert_eq!(setup.on_disk(), ["big.bin", "kept.bin"], "{case}");
    }
}

#[tokio::test]
async fn an_unchanged_model_is_ready_without_the_lock_or_its_bytes() {
    let contents = bytes(10, BIG);
    let setup = Setup::new(&[("big.bin", contents.clone())]).await;
    setup.fetch().await.unwrap();

    // Another fetch holds the directory: only the record can answer.
    let meta = setup.fetcher.models_dir.join(META_DIR);
    let held = DirLock::acquire(&meta.join("job.lock"), None)
        .await
        .unwrap();
    let refetch = tokio::time::timeout(Duration::from_secs(30), setup.fetch()).await;
    assert!(
        refetch
            .expect("the fetch did not wait for the lock")
            .is_ok()
    );
    drop(held);

    // Without the record, the bytes are read again, but not downloaded.
    std::fs::remove_file(meta.join("job.stamps.json")).unwrap();
    let before = std::fs::metadata(setup.path("big.bin"))
        .unwrap()
        .modified()
        .unwrap();
    setup.fetch().await.unwrap();
    assert_eq!(setup.source.requests("job/big.bin").len(), 1);
    assert!(
        meta.join("job.stamps.json").exists(),
        "the record is written again"
    );
    let after: SystemTime = std::fs::metadata(setup.path("big.bin"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(before, after, "the file was not rewritten");
}

#[tokio::test]
async fn a_re_hash_still_catches_a_damaged_file_without_a_record() {
    let contents = bytes(11, BIG);
    let setup = Setup::new(&[("big.bin", contents.clone())]).await;
    setup.fetch().await.unwrap();
    let meta = setup.fetcher.models_dir.join(META_DIR);
    std::fs::remove_file(meta.join("job.stamps.json")).unwrap();
    let mut damaged = contents.clone();
    damaged[BIG - 1] ^= 0x80;
    std::fs::write(setup.path("big.bin"), &damaged).unwrap();

    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(setup.source.requests("job/big.bin").len(), 2);
}

/// Pieces small enough that `BIG` is read over several connections.
const PIECE: u64 = 256 * 1024;

/// A fetch of `big.bin` over `connections` connections of `PIECE` bytes.
async fn in_pieces(seed: u8, connections: usize) -> (Setup, Vec<u8>) {
    let contents = bytes(seed, BIG);
    let mut setup = Setup::new(&[("big.bin", contents.clone())]).await;
    setup.fetcher = setup.fetcher.clone().split(Split {
        connections,
        piece_bytes: PIECE,
    });
    (setup, contents)
}

/// The `(first, end)` byte spans of `bytes=FIRST-LAST` ranges.
fn spans(requests: &[Option<String>]) -> Vec<(u64, u64)> {
    requests
        .iter()
        .map(|range| {
            let range = range.as_deref().expect("a range request");
            let (first, last) = range
                .strip_prefix("bytes=")
                .unwrap()
                .split_once('-')
                .unwrap();
            (first.parse().unwrap(), last.parse::<u64>().unwrap() + 1)
        })
        .collect()
}

#[tokio::test]
async fn a_large_file_is_read_in_pieces_over_several_connections_and_verified() {
    let (setup, contents) = in_pieces(20, 4).await;
    setup
        .source
        .with(|s| s.slow = Some(Duration::from_millis(2)));
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(setup.on_disk(), ["big.bin"]);

    // Every piece asked for once, in file order, covering the file exactly.
    let spans = spans(&setup.source.requests("job/big.bin"));
    let mut sorted = spans.clone();
    sorted.sort();
    let expected: Vec<(u64, u64)> = (0..BIG as u64)
        .step_by(PIECE as usize)
        .map(|start| (start, (start + PIECE).min(BIG as u64)))
        .collect();
    assert_eq!(sorted, expected);
    let most = setup.source.with(|s| s.most_in_flight);
    assert!(
        (2..=4).contains(&most),
        "{most} answers at once, with 4 connections"
    );
    assert!(
        !setup.fetcher.models_dir.join(".berth/job.resume").exists(),
        "no checkpoint is left once the file is in place"
    );
}

#[tokio::test]
async fn a_small_file_or_a_single_connection_keeps_one_stream() {
    for (connections, piece_bytes) in [(1, PIECE), (4, BIG as u64 / 2 + 1)] {
        let contents = bytes(21, BIG);
        let mut setup = Setup::new(&[("big.bin", contents.clone())]).await;
        setup.fetcher = setup.fetcher.clone().split(Split {
            connections,
            piece_bytes,
        });
        setup.fetch().await.unwrap();
        assert_file(&setup, "big.bin", &contents);
        assert_eq!(setup.source.requests("job/big.bin"), [None]);
    }
}

#[tokio::test]
async fn pieces_cut_off_are_kept_with_a_checkpoint_and_only_the_rest_is_asked_for() {
    let (setup, contents) = in_pieces(22, 4).await;
    // Every answer breaks off after 100 KiB: each connection leaves a
    // piece part-written, so the kept bytes have holes.
    setup.source.with(|s| s.cut_after = Some(100 * 1024));
    let error = setup.fetch().await.unwrap_err().to_string();
    assert!(
        error.starts_with("file big.bin: the download broke off"),
        "{error}"
    );
    assert_eq!(setup.on_disk(), [".fetch-big.bin"]);
    let record = setup
        .fetcher
        .models_dir
        .join(".berth/job.resume/big.bin.json");
    let partial = setup.path(".fetch-big.bin");
    let asked_first = setup.source.requests("job/big.bin").len();
    let kept = partial::Checkpoint::take(&record.clone(), &partial, &sha(&contents));
    let kept = kept.expect("the checkpoint vouches for the kept pieces");
    assert!(
        !kept.have.is_prefix(),
        "pieces after a gap are kept: {:?}",
        kept.have
    );
    let hashed = kept.hash.as_ref().unwrap().len();
    assert!(hashed <= kept.have.contiguous());
    let partial_bytes = std::fs::read(&partial).unwrap();
    for (start, end) in kept.have.iter() {
        let (start, end) = (start as usize, end as usize);
        assert!(
            partial_bytes[start..end] == contents[start..end],
            "kept bytes {start}..{end} are the source's"
        );
    }

    // Put the record back (take used it up) and continue.
    let checkpoint = partial::Checkpoint::new(
        stamp::Stamp::of(&std::fs::metadata(&partial).unwrap(), Some(&sha(&contents))),
        kept.hash.clone().unwrap(),
        kept.have.clone(),
    );
    checkpoint.save(&record).unwrap();
    setup.source.with(|s| s.cut_after = None);
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(setup.on_disk(), ["big.bin"]);
    let requests = setup.source.requests("job/big.bin");
    let asked: Vec<(u64, u64)> = spans(&requests[asked_first..]);
    let mut expected = Vec::new();
    for (start, end) in kept.have.missing(BIG as u64) {
        expected.extend(pieces::cut(&[(start, end)], PIECE).map(|p| (p.start, p.end)));
    }
    let mut asked_sorted = asked.clone();
    asked_sorted.sort();
    assert_eq!(
        asked_sorted, expected,
        "only the missing bytes were asked for"
    );
}

#[tokio::test]
async fn a_cancelled_download_in_pieces_continues_from_its_checkpoint() {
    let (setup, contents) = in_pieces(23, 4).await;
    setup
        .source
        .with(|s| s.slow = Some(Duration::from_millis(20)));
    let cancel = CancellationToken::new();
    let fetching = setup.fetcher.fetch(&setup.model, Arc::new(Quiet), &cancel);
    let watch = async {
        while setup.source.with(|s| s.requests.len()) < 6 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cancel.cancel();
    };
    let (fetched, ()) = tokio::join!(fetching, watch);
    assert_eq!(fetched, Err(Error::Cancelled));
    // The writer threads record the checkpoint after the fetch is dropped.
    let record = setup
        .fetcher
        .models_dir
        .join(".berth/job.resume/big.bin.json");
    for _ in 0..500 {
        if record.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(record.exists(), "no checkpoint at {}", record.display());
    let asked_first = setup.source.requests("job/big.bin").len();

    setup.source.with(|s| s.slow = None);
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    let again: u64 = spans(&setup.source.requests("job/big.bin")[asked_first..])
        .iter()
        .map(|(start, end)| end - start)
        .sum();
    assert!(
        again < BIG as u64,
        "asked for {again} of {BIG} bytes again: the kept pieces were not used"
    );
}

#[tokio::test]
async fn a_source_that_ignores_ranges_is_read_in_one_stream_instead() {
    let (setup, contents) = in_pieces(24, 4).await;
    setup.source.with(|s| s.ignore_ranges = true);
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(
        setup.source.requests("job/big.bin"),
        [Some(format!("bytes=0-{}", PIECE - 1))],
        "the whole file came in answer to the first piece"
    );
}

#[tokio::test]
async fn wrong_bytes_in_pieces_are_never_kept() {
    let (mut setup, _) = in_pieces(25, 4).await;
    setup.model.files[0].sha256 = Some("0".repeat(64));
    let error = setup.fetch().await.unwrap_err().to_string();
    assert!(
        error.starts_with("file big.bin: sha256 mismatch: expected 0000"),
        "{error}"
    );
    assert_eq!(setup.on_disk(), Vec::<String>::new());
}

#[tokio::test]
async fn pieces_left_without_a_checkpoint_are_hashed_and_then_downloaded_whole() {
    // What a kill -9 in the middle of a download in pieces leaves: a file
    // of full length with holes, and no checkpoint.
    let (setup, contents) = in_pieces(26, 4).await;
    let mut holes = contents.clone();
    holes[PIECE as usize..2 * PIECE as usize].fill(0);
    std::fs::create_dir_all(setup.fetcher.dir_of("job")).unwrap();
    std::fs::write(setup.path(".fetch-big.bin"), &holes).unwrap();
    setup.fetch().await.unwrap();
    assert_file(&setup, "big.bin", &contents);
    assert_eq!(setup.on_disk(), ["big.bin"]);
}

#[tokio::test]
async fn a_source_whose_size_differs_from_the_record_is_refused_before_downloading() {
    for connections in [1, 4] {
        let (mut setup, _) = in_pieces(27, connections).await;
        setup.model.files[0].size_bytes += 1;
        let error = setup.fetch().await.unwrap_err().to_string();
        let expected = format!(
            "file big.bin: the source has {BIG} bytes for this file, but the record says {}",
            BIG + 1
        );
        assert!(error.starts_with(&expected), "{connections}: {error}");
        assert_eq!(setup.on_disk(), Vec::<String>::new(), "{connections}");
    }
}

/// A sources file giving `Authorization: Bearer ${TOKEN}` to `prefix`,
/// with `TOKEN` set to `token`.
fn bearer(prefix: &str, token: &str) -> Access {
    let text = format!(
        "[[source]]\nprefix = \"{prefix}\"\nheaders = {{ Authorization = \"Bearer ${{TOKEN}}\" }}"
    );
    Access::parse(&text, |var| (var == "TOKEN").then(|| token.to_string())).unwrap()
}

#[tokio::test]
async fn the_credentials_of_a_prefix_go_to_the_urls_under_it() {
    let contents = bytes(20, 1000);
    let mut setup = Setup::new(&[("a.bin", contents.clone())]).await;
    setup
        .source
        .with(|s| s.require = Some("Bearer t0ken".into()));
    let prefix = format!("{}/job/", setup.source.base);
    setup.fetcher = setup.fetcher.clone().access(bearer(&prefix, "t0ken"));

    setup.fetch().await.unwrap();
    assert_file(&setup, "a.bin", &contents);
    assert_eq!(
        setup.source.authorizations("job/a.bin"),
        [Some("Bearer t0ken".to_string())]
    );
}

#[tokio::test]
async fn a_redirect_to_another_host_carries_no_credentials() {
    let (moved, kept) = (bytes(21, 1000), bytes(22, 1000));
    let mut setup = Setup::new(&[("moved.bin", moved.clone()), ("kept.bin", kept.clone())]).await;
    let elsewhere = Source::start().await;
    elsewhere.with(|s| s.files.insert("other/moved.bin".into(), moved.clone()));
    setup.source.with(|s| {
        s.redirects.insert(
            "job/moved.bin".into(),
            format!("{}/other/moved.bin?signature=abc", elsewhere.base),
        );
        // A redirect within the prefix keeps them.
        s.redirects
            .insert("job/kept.bin".into(), "/job/renamed/kept.bin".into());
        s.files.insert("job/renamed/kept.bin".into(), kept.clone());
    });
    let prefix = format!("{}/job/", setup.source.base);
    setup.fetcher = setup.fetcher.clone().access(bearer(&prefix, "t0ken"));

    setup.fetch().await.unwrap();
    assert_file(&setup, "moved.bin", &moved);
    assert_file(&setup, "kept.bin", &kept);
    let sent = || Some("Bearer t0ken".to_string());
    assert_eq!(setup.source.authorizations("job/moved.bin"), [sent()]);
    assert_eq!(
        elsewhere.authorizations("other/moved.bin"),
        [None],
        "the other host got the token"
    );
    assert_eq!(setup.source.authorizations("job/kept.bin"), [sent()]);
    assert_eq!(
        setup.source.authorizations("job/renamed/kept.bin"),
        [sent()]
    );
}

#[tokio::test]
async fn a_refusal_says_whose_credentials_were_sent_or_that_none_were() {
    let contents = bytes(23, 1000);
    let mut setup = Setup::new(&[("a.bin", contents)]).await;
    setup
        .source
        .with(|s| s.require = Some("Bearer right".into()));

    let error = setup.fetch().await.unwrap_err().to_string();
    assert_eq!(
        error,
        format!(
            "file a.bin: the source answered 401 Unauthorized ({}/job/a.bin) and no prefix in \
             the sources file (--sources-file) covers it, so no credentials were sent",
            setup.source.base
        )
    );

    let prefix = format!("{}/job/", setup.source.base);
    setup.fetcher = setup.fetcher.clone().access(bearer(&prefix, "wrong"));
    let error = setup.fetch().await.unwrap_err().to_string();
    assert_eq!(
        error,
        format!(
            "file a.bin: the source answered 401 Unauthorized ({}/job/a.bin) to the credentials \
             of the prefix {prefix} in the sources file: check them",
            setup.source.base
        )
    );
    assert!(!error.contains("wrong"), "the token is not shown");

    // After a redirect: the message names where it went, without its query
    // (a signature, perhaps), and that nothing was sent there.
    let elsewhere = Source::start().await;
    elsewhere.with(|s| s.require = Some("Bearer right".into()));
    setup.source.with(|s| {
        s.require = None;
        s.redirects.insert(
            "job/a.bin".into(),
            format!("{}/other/a.bin?signature=abc", elsewhere.base),
        )
    });
    let error = setup.fetch().await.unwrap_err().to_string();
    assert_eq!(
        error,
        format!(
            "file a.bin: the source answered 401 Unauthorized ({}/job/a.bin, redirected to \
             {}/other/a.bin) and no prefix in the sources file (--sources-file) covers it, \
             so no credentials were sent",
            setup.source.base, elsewhere.base
        )
    );
}

#[tokio::test]
async fn endless_redirects_are_an_error() {
    let setup = Setup::new(&[("a.bin", bytes(24, 10))]).await;
    setup.source.with(|s| {
        s.redirects.insert("job/a.bin".into(), "/job/a.bin".into());
    });
    let error = setup.fetch().await.unwrap_err().to_string();
    assert_eq!(
        error,
        format!(
            "file a.bin: the source redirected more than 10 times ({}/job/a.bin)",
            setup.source.base
        )
    );
    assert_eq!(setup.source.requests("job/a.bin").len(), 11);
}

#[test]
fn a_sources_file_that_cannot_be_used_stops_the_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sources.toml");
    let cases = [
        (
            "[[source]]\nprefix = \"https://hub.internal/models/\"\n\
             headers = { Authorization = \"Bearer ${BERTH_TEST_UNSET_TOKEN}\" }",
            "prefix \"https://hub.internal/models/\": headers.Authorization: the host environment \
             variable BERTH_TEST_UNSET_TOKEN is not set (set it before starting berth)",
        ),
        (
            "[[source]]\nprefix = \"https://hub.internal/models/\"\ntoken = \"x\"",
            "line 3: unknown field `token`, expected one of `prefix`, `headers`, `options`",
        ),
    ];
    for (text, expected) in cases {
        std::fs::write(&path, text).unwrap();
        let error = Access::load(&path).unwrap_err().to_string();
        assert_eq!(
            error,
            format!("sources file {}: {expected}", path.display())
        );
    }
}

#[tokio::test]
async fn a_model_that_would_not_fit_is_refused_before_a_byte_is_asked_for() {
    let contents = bytes(30, 1000);
    let mut setup = Setup::new(&[("huge.bin", contents.clone()), ("small.bin", contents)]).await;
    // Recorded as a petabyte: no test machine has the room.
    setup.model.files[0].size_bytes = 1 << 50;
    let error = setup.fetch().await.unwrap_err();
    assert!(matches!(error, Error::NoRoom { needed, .. } if needed == (1 << 50) + 1000));
    let error = error.to_string();
    assert!(
        error.contains("the missing files need 1.0 PiB, but the volume has")
            && error.contains("free some space, or move --models-dir"),
        "{error}"
    );
    assert!(setup.source.requests("job/huge.bin").is_empty());
    assert!(setup.source.requests("job/small.bin").is_empty());

    // The reserve counts too: a small model that would eat into it.
    let (mut setup, _) = in_pieces(31, 1).await;
    setup.fetcher = setup.fetcher.clone().reserve(1 << 60);
    let error = setup.fetch().await.unwrap_err().to_string();
    assert!(error.contains("berth keeps 1024 PiB of it"), "{error}");
    assert!(setup.source.requests("job/big.bin").is_empty());
}

#[tokio::test]
async fn an_https_source_signed_by_an_internal_ca_is_trusted_only_with_the_ca_file() {
    let ca = TestCa::new("internal CA");
    let contents = bytes(40, 1000);
    let mut setup = Setup::on(Source::start_tls(&ca).await, &[("a.bin", contents.clone())]);
    let unknown_ca = format!(
        "file a.bin: cannot reach the source ({}/job/a.bin): invalid peer certificate: \
         UnknownIssuer (the certificate is signed by a CA berth does not trust: give the server \
         that CA with --ca-file)",
        setup.source.base
    );
    let error = setup.fetch().await.unwrap_err().to_string();
    assert_eq!(error, unknown_ca);

    let dir = tempfile::tempdir().unwrap();
    let another = TestCa::new("another CA").write(dir.path(), "another.pem");
    setup.fetcher = setup
        .fetcher
        .clone()
        .trust(Trust::load(&another).unwrap())
        .unwrap();
    let error = setup.fetch().await.unwrap_err().to_string();
    assert_eq!(error, unknown_ca, "another CA vouches for nothing here");

    let ca_file = ca.write(dir.path(), "ca.pem");
    setup.fetcher = setup
        .fetcher
        .clone()
        .trust(Trust::load(&ca_file).unwrap())
        .unwrap();
    setup.fetch().await.unwrap();
    assert_file(&setup, "a.bin", &contents);
}

/// An S3-compatible store behind a certificate of an internal CA: its
/// client trusts the CA of `--ca-file` too. The store here has no objects,
/// so a request that got through is answered "no such key".
#[tokio::test]
async fn an_object_store_signed_by_an_internal_ca_is_reached_only_with_the_ca_file() {
    let ca = TestCa::new("store CA");
    let no_such_key = || async {
        (
            StatusCode::NOT_FOUND,
            "<Error><Code>NoSuchKey</Code><Message>none here</Message></Error>",
        )
    };
    let addr = test_tls::serve(
        Router::new().fallback(no_such_key),
        ca.server(&["127.0.0.1"]),
    )
    .await;
    let endpoint = format!("https://{addr}");
    let access = Access::parse(
        &format!(
            "[[source]]\nprefix = \"s3://models/\"\noptions = {{ endpoint = \"{endpoint}\", \
             region = \"us-east-1\", access_key_id = \"k\", secret_access_key = \"s\" }}"
        ),
        |_| None,
    )
    .unwrap();
    let mut setup = Setup::new(&[("a.bin", bytes(41, 100))]).await;
    setup.model.source = "s3://models/{job_id}/{path}".to_string();
    setup.fetcher = setup.fetcher.clone().access(access);
    let error = setup.fetch().await.unwrap_err().to_string();
    assert!(
        error.starts_with(&format!(
            "file a.bin: cannot reach the store at {endpoint} (s3://models/job/a.bin): "
        )) && error.ends_with(
            "invalid peer certificate: UnknownIssuer (the certificate is signed by a CA berth \
             does not trust: give the server that CA with --ca-file)"
        ),
        "{error}"
    );

    let dir = tempfile::tempdir().unwrap();
    let trust = Trust::load(&ca.write(dir.path(), "ca.pem")).unwrap();
    // The credentials stay: trust replaces only the clients.
    setup.fetcher = setup.fetcher.clone().trust(trust).unwrap();
    let error = setup.fetch().await.unwrap_err().to_string();
    assert_eq!(
        error,
        "file a.bin: the store has no object s3://models/job/a.bin"
    );
}
