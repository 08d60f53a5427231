use std::path::Path;

use super::*;

/// A safetensors file: the header's length, the header, `data` bytes.
fn safetensors(header: &str, data: usize) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(std::iter::repeat_n(7u8, data));
    bytes
}

/// A zip of `entries` (stored, no compression), as a writer lays it out:
/// local entries, then the central directory, then the end record.
fn zip(entries: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for name in entries {
        let offset = out.len() as u32;
        out.extend_from_slice(b"PK\x03\x04");
        out.extend_from_slice(&[0; 22]);
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        central.extend_from_slice(b"PK\x01\x02");
        central.extend_from_slice(&[0; 24]);
        central.extend_from_slice(&(name.len() as u16).to_le_bytes());
        central.extend_from_slice(&[0; 12]);
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let at = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(b"PK\x05\x06");
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&at.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

#[track_caller]
fn examined(bytes: &[u8]) -> Result<Format, Problem> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, bytes).unwrap();
    examine(&path)
}

#[track_caller]
fn fault(bytes: &[u8], expected: &str) {
    match examined(bytes) {
        Err(Problem::Safetensors(fault)) => assert!(
            fault.to_string().contains(expected),
            "{fault} does not say {expected:?}"
        ),
        other => panic!("expected a fault saying {expected:?}, got {other:?}"),
    }
}

const TWO: &str = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}}"#;

#[test]
fn formats_are_told_by_their_first_bytes() {
    let table: &[(&[u8], Format)] = &[
        (b"\x80\x02}q\x00.", Format::Pickle),
        (b"\x80\x04\x95\x10\x00\x00\x00", Format::Pickle),
        (b"\x80\x05\x95\x10\x00\x00\x00", Format::Pickle),
        // Protocols 0 and 1 have no opening opcode to know them by.
        (b"\x80\x01}q\x00.", Format::Other),
        (b"(dp0\n.", Format::Other),
        (b"GGUF\x03\x00\x00\x00", Format::Gguf),
        (b"{\"a\": 1}", Format::Json),
        (b"\xEF\xBB\xBF  [1, 2]", Format::Json),
        (b"        {\"padded\": true}", Format::Json),
        (b"\n{\"cut\": \"\xC3", Format::Json),
        (b"{\"bad\": \"\xFF\"}", Format::Other),
        (b"# Model card", Format::Other),
        (b"", Format::Other),
        (b"\x02\x00\x00\x00\x00\x00\x00\x00{}", Format::Safetensors),
        // A `{` at byte 8 of random bytes is not enough.
        (b"\x02\x00\x00\x00\x00\x01\x00\x00{}", Format::Other),
        (b"\x02\x00\x00\x00\x00\x00\x00\x00{x", Format::Other),
    ];
    for (head, format) in table {
        assert_eq!(sniff(head), *format, "{:?}", String::from_utf8_lossy(head));
    }
    assert_eq!(sniff(&safetensors(TWO, 12)), Format::Safetensors);
    assert_eq!(
        sniff(&zip(&["archive/data.pkl", "archive/data/0"])),
        Format::ZipPickle
    );
    assert_eq!(sniff(&zip(&["data.pkl"])), Format::ZipPickle);
    assert_eq!(sniff(&zip(&["a.txt"])), Format::Other);
}

#[test]
fn a_zip_with_a_data_pkl_anywhere_is_a_zip_pickle() {
    let later = zip(&["archive/version", "archive/data.pkl"]);
    assert_eq!(sniff(&later), Format::Other, "the head alone cannot tell");
    assert_eq!(examined(&later), Ok(Format::ZipPickle));
    assert_eq!(
        examined(&zip(&["a/b.txt", "a/data.pkl.txt"])),
        Ok(Format::Other)
    );
}

#[test]
fn a_sound_header_passes() {
    assert_eq!(examined(&safetensors(TWO, 12)), Ok(Format::Safetensors));
    // Padded with spaces, as writers align the data region to 8 bytes.
    let padded = format!("{TWO}      ");
    assert_eq!(examined(&safetensors(&padded, 12)), Ok(Format::Safetensors));
    // No tensors at all, and tensors of no elements, are sound.
    assert_eq!(examined(&safetensors("{}", 0)), Ok(Format::Safetensors));
    let empty = r#"{"z":{"dtype":"F16","shape":[0,4],"data_offsets":[0,0]}}"#;
    assert_eq!(examined(&safetensors(empty, 0)), Ok(Format::Safetensors));
    // Sub-byte dtypes count in bits.
    let f4 = r#"{"q":{"dtype":"F4","shape":[6],"data_offsets":[0,3]}}"#;
    assert_eq!(examined(&safetensors(f4, 3)), Ok(Format::Safetensors));
}

#[test]
fn hostile_headers_are_refused_each_with_its_fault() {
    let one = |dtype: &str, shape: &str, offsets: &str| {
        format!(r#"{{"t":{{"dtype":"{dtype}","shape":{shape},"data_offsets":{offsets}}}}}"#)
    };
    // Offsets past the end of the file.
    fault(
        &safetensors(&one("F32", "[4]", "[0,16]"), 8),
        "tensor \"t\": data_offsets [0, 16] run past the end of the data region's 8 bytes",
    );
    // Overlapping tensors.
    let overlapping = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    fault(
        &safetensors(overlapping, 12),
        "tensors \"a\" and \"b\" overlap",
    );
    // An 8 GiB header length.
    let mut huge = (8u64 << 30).to_le_bytes().to_vec();
    huge.extend_from_slice(b"{\"a\":1}");
    fault(
        &huge,
        "header length says 8589934592 bytes, more than the 100000000",
    );
    // A header longer than the file.
    let mut long = 4096u64.to_le_bytes().to_vec();
    long.extend_from_slice(b"{\"a\":");
    fault(
        &long,
        "header of 4096 bytes runs past the end of the 13-byte file",
    );
    // A truncated file: a sound one cut in its data.
    let mut cut = safetensors(TWO, 12);
    cut.truncate(cut.len() - 3);
    fault(
        &cut,
        "tensor \"b\": data_offsets [8, 12] run past the end of the data region's 9 bytes",
    );
    // Size and shape that disagree.
    fault(
        &safetensors(&one("F32", "[3]", "[0,8]"), 8),
        "dtype F32 and shape [3] make 12 bytes, but data_offsets [0, 8] hold 8",
    );
    fault(
        &safetensors(&one("F99", "[2]", "[0,8]"), 8),
        "dtype \"F99\" is not one safetensors knows",
    );
    fault(
        &safetensors(&one("F32", "[-2]", "[0,8]"), 8),
        "has no shape of non-negative integers",
    );
    fault(
        &safetensors(&one("F32", "[2]", "[8,0]"), 8),
        "end before they begin",
    );
    fault(
        &safetensors(&one("F32", "[2]", "[0]"), 8),
        "has no data_offsets [begin, end]",
    );
    fault(
        &safetensors(&one("F4", "[3]", "[0,1]"), 1),
        "make 12 bits, not whole bytes",
    );
    fault(
        &safetensors(&one("U8", "[4294967296,4294967296,4294967296]", "[0,8]"), 8),
        "is too large to be stored",
    );
    // Bytes no tensor owns: between two, and after the last.
    let gap = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}"#;
    fault(
        &safetensors(gap, 6),
        "bytes 2..4 of the data region belong to no tensor",
    );
    fault(
        &safetensors(&one("U8", "[2]", "[0,2]"), 5),
        "bytes 2..5 of the data region",
    );
    fault(&safetensors("{\"a\": ", 0), "its header is not JSON");
    fault(
        &safetensors(r#"{"__metadata__":{"n":1}}"#, 0),
        "__metadata__ must map strings to strings: \"n\" is not a string",
    );
    fault(
        &safetensors(r#"{"__metadata__":[]}"#, 0),
        "it is not an object",
    );
}

#[test]
fn bytes_decide_not_names() {
    // Random bytes named .safetensors are other, left to the deployer.
    assert_eq!(
        examined(b"\x01\x02\x03 not a header at all"),
        Ok(Format::Other)
    );
    assert_eq!(examined(b"\x80\x02}q\x00."), Ok(Format::Pickle));
}

/// Files written by real torch, transformers and peft.
#[test]
fn the_real_training_files_are_told_apart() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/training");
    let mut seen = std::collections::BTreeMap::<Format, usize>::new();
    for entry in walk(&root) {
        let name = entry.file_name().unwrap().to_str().unwrap().to_string();
        let format = examine(&entry).unwrap_or_else(|e| panic!("{}: {e}", entry.display()));
        let expected = match name.rsplit_once('.').map(|(_, ext)| ext) {
            Some("safetensors") => Format::Safetensors,
            Some("json") => Format::Json,
            Some("pt" | "pth" | "bin") => Format::ZipPickle,
            _ => format,
        };
        assert_eq!(format, expected, "{}", entry.display());
        *seen.entry(format).or_default() += 1;
    }
    for format in [Format::Safetensors, Format::Json, Format::ZipPickle] {
        assert!(seen.get(&format).is_some_and(|n| *n >= 3), "{seen:?}");
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else if path.is_file() {
            files.push(path);
        }
    }
    files
}
