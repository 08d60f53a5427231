//! The url a key lands at under each kind of target, part sizes, and
//! that publishers and puts cross threads.

use super::testing::key;
use super::*;

#[test]
fn a_key_lands_under_each_kind_of_target_url_and_nowhere_else() {
    let text = "[[target]]\nname = \"s3\"\nurl = \"s3://bucket/pre fix/\"\n\
                [[target]]\nname = \"mirror\"\nurl = \"https://mirror.example/base/\"\n\
                [[target]]\nname = \"root\"\nurl = \"https://mirror.example/\"\n\
                [[target]]\nname = \"local\"\nurl = \"file:///srv/out/\"\n";
    let targets = Targets::parse(text, "sources.toml", |_| None).unwrap();
    let publishers = Publishers::new(Arc::new(targets), &Trust::default());
    let cases = [
        ("s3", "a:b/c d.bin", "s3://bucket/pre%20fix/a:b/c%20d.bin"),
        ("s3", "x", "s3://bucket/pre%20fix/x"),
        ("mirror", "a:b", "https://mirror.example/base/a:b"),
        (
            "mirror",
            "http:/x/ü",
            "https://mirror.example/base/http:/x/%C3%BC",
        ),
        ("mirror", "...", "https://mirror.example/base/..."),
        ("root", "job/m.bin", "https://mirror.example/job/m.bin"),
        ("local", "a:b/m.bin", "file:///srv/out/a:b/m.bin"),
    ];
    for (target, text, expected) in cases {
        let publisher = publishers.get(target).unwrap();
        assert_eq!(
            publisher.url(&key(text)).unwrap(),
            expected,
            "{target} {text}"
        );
    }
    assert_eq!(
        publishers.get("absent").err().unwrap().to_string(),
        "target \"absent\" is not configured on this server"
    );
}

#[test]
fn parts_grow_so_that_a_huge_file_fits_in_s3s_part_count() {
    let tuning = Tuning::default();
    assert_eq!(tuning.part_bytes_for(1 << 30), 6 << 20);
    assert_eq!(tuning.part_bytes_for(50 << 30), 6 << 20);
    assert_eq!(tuning.part_bytes_for(78 << 30), 8 << 20);
    assert_eq!(tuning.part_bytes_for(100 << 30), 11 << 20);
    assert!(tuning.part_bytes_for(5 << 40) * 10_000 >= 5 << 40);
}

#[test]
fn publishers_are_shared_across_threads_and_a_put_is_a_send_future() {
    fn shared<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: T) {}
    let text = "[[target]]\nname = \"local\"\nurl = \"file:///srv/out/\"\n";
    let targets = Targets::parse(text, "sources.toml", |_| None).unwrap();
    let publishers = Publishers::new(Arc::new(targets), &Trust::default());
    shared(&publishers);
    let publisher = publishers.get("local").unwrap();
    shared(&publisher);
    let (k, never) = (key("x"), CancellationToken::new());
    let body = Body::Bytes {
        bytes: bytes::Bytes::from_static(b"x"),
        content_type: "text/plain".into(),
    };
    // Built, never polled: whether it may cross threads is the point.
    send(publisher.put(&k, body, &|_| {}, &never));
    send(publisher.stat(&k));
}
