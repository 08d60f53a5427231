//! A safetensors file's header, checked as the `safetensors` crate checks
//! one before it maps the file: a bounded header length, a JSON object,
//! each tensor's dtype known and its shape's size the length of its
//! `data_offsets`, the tensors laid end to end over exactly the data
//! region (in bounds, no overlap, no gap), and `__metadata__` a map of
//! strings to strings. What a deployer's loader would trip on, found
//! before any deployer runs. Reads only the header.

use std::io::{Read, Seek, SeekFrom};

use serde_json::{Map, Value};

/// The longest header accepted, as the `safetensors` crate's own limit.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// What is wrong with a safetensors file, said of the file.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Fault {
    #[error(
        "its header length says {0} bytes, more than the {MAX_HEADER_BYTES} safetensors allows"
    )]
    HeaderTooLarge(u64),
    #[error("its header of {header} bytes runs past the end of the {file}-byte file (cut short?)")]
    HeaderPastEnd { header: u64, file: u64 },
    #[error("its header is not JSON: {0}")]
    NotJson(String),
    #[error("its header is not a JSON object")]
    NotObject,
    #[error("__metadata__ must map strings to strings: {0}")]
    Metadata(String),
    #[error("tensor {name:?}: {why}")]
    Tensor { name: String, why: String },
    #[error("tensors {first:?} and {second:?} overlap")]
    Overlap { first: String, second: String },
    #[error("bytes {from}..{to} of the data region belong to no tensor")]
    Gap { from: u64, to: u64 },
}

/// Why a header could not be had.
pub(super) enum Unread {
    Io(std::io::Error),
    Fault(Fault),
}

/// Whether `head` opens as a safetensors file: a little-endian header
/// length below 2^40 (a TiB: no real header comes near, and random bytes
/// seldom have five zero bytes there), then `{` and a JSON token.
pub(super) fn opens(head: &[u8]) -> bool {
    head.len() >= 10
        && head[5..8] == [0, 0, 0]
        && head[8] == b'{'
        && matches!(head[9], b'"' | b'}' | b' ' | b'\n' | b'\r' | b'\t')
}

/// The header of the safetensors file `file` (`len` bytes, opening with
/// `head`), bounded by `MAX_HEADER_BYTES` and by the file.
pub(super) fn read_header(
    file: &mut std::fs::File,
    head: &[u8],
    len: u64,
) -> Result<Vec<u8>, Unread> {
    let header = u64::from_le_bytes(head[..8].try_into().expect("opens checked 10 bytes"));
    if header > MAX_HEADER_BYTES {
        return Err(Unread::Fault(Fault::HeaderTooLarge(header)));
    }
    if header > len - 8 {
        return Err(Unread::Fault(Fault::HeaderPastEnd { header, file: len }));
    }
    let mut bytes = vec![0; header as usize];
    file.seek(SeekFrom::Start(8)).map_err(Unread::Io)?;
    file.read_exact(&mut bytes).map_err(Unread::Io)?;
    Ok(bytes)
}

/// Bits per element of each dtype the `safetensors` crate knows.
fn bits(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 8,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "I64" | "U64" | "F64" | "C64" => 64,
        _ => return None,
    })
}

/// One tensor's place in the data region.
struct Span<'a> {
    name: &'a str,
    begin: u64,
    end: u64,
}

/// Checks `header` (the JSON text) of a file of `file_len` bytes.
pub(super) fn check(header: &[u8], file_len: u64) -> Result<(), Fault> {
    let data_len = file_len - 8 - header.len() as u64;
    let value: Value = serde_json::from_slice(header).map_err(|e| Fault::NotJson(e.to_string()))?;
    let Value::Object(entries) = value else {
        return Err(Fault::NotObject);
    };
    let mut spans = Vec::with_capacity(entries.len());
    for (name, entry) in &entries {
        if name == "__metadata__" {
            metadata(entry)?;
            continue;
        }
        let tensor = |why: String| Fault::Tensor {
            name: name.clone(),
            why,
        };
        let span = tensor_span(name, entry, data_len).map_err(tensor)?;
        spans.push(span);
    }
    spans.sort_by_key(|s| (s.begin, s.end));
    let mut covered = 0;
    let mut previous: Option<&Span> = None;
    for span in &spans {
        if span.begin < covered {
            return Err(Fault::Overlap {
                first: previous.map_or_else(String::new, |p| p.name.to_string()),
                second: span.name.to_string(),
            });
        }
        if span.begin > covered {
            return Err(Fault::Gap {
                from: covered,
                to: span.begin,
            });
        }
        covered = span.end;
        previous = Some(span);
    }
    if covered != data_len {
        return Err(Fault::Gap {
            from: covered,
            to: data_len,
        });
    }
    Ok(())
}

fn metadata(entry: &Value) -> Result<(), Fault> {
    let Value::Object(map) = entry else {
        return Err(Fault::Metadata("it is not an object".into()));
    };
    match map.iter().find(|(_, v)| !v.is_string()) {
        Some((key, _)) => Err(Fault::Metadata(format!("{key:?} is not a string"))),
        None => Ok(()),
    }
}

/// Where one tensor lies, if its entry is whole and its size adds up.
fn tensor_span<'a>(name: &'a str, entry: &Value, data_len: u64) -> Result<Span<'a>, String> {
    let fields: &Map<String, Value> = entry.as_object().ok_or("is not an object")?;
    let dtype = fields
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or("has no dtype string")?;
    let bits =
        bits(dtype).ok_or_else(|| format!("dtype {dtype:?} is not one safetensors knows"))?;
    let shape: Vec<u64> = fields
        .get("shape")
        .and_then(Value::as_array)
        .and_then(|dims| dims.iter().map(Value::as_u64).collect())
        .ok_or("has no shape of non-negative integers")?;
    let offsets: Vec<u64> = fields
        .get("data_offsets")
        .and_then(Value::as_array)
        .and_then(|o| o.iter().map(Value::as_u64).collect())
        .filter(|o: &Vec<u64>| o.len() == 2)
        .ok_or("has no data_offsets [begin, end] of non-negative integers")?;
    let (begin, end) = (offsets[0], offsets[1]);
    if begin > end {
        return Err(format!(
            "data_offsets [{begin}, {end}] end before they begin"
        ));
    }
    if end > data_len {
        return Err(format!(
            "data_offsets [{begin}, {end}] run past the end of the data region's {data_len} bytes (cut short?)"
        ));
    }
    let elements = shape
        .iter()
        .try_fold(1u64, |n, d| n.checked_mul(*d))
        .and_then(|n| n.checked_mul(bits))
        .ok_or_else(|| format!("shape {shape:?} is too large to be stored"))?;
    if elements % 8 != 0 {
        return Err(format!(
            "dtype {dtype} and shape {shape:?} make {elements} bits, not whole bytes"
        ));
    }
    let bytes = elements / 8;
    if bytes != end - begin {
        return Err(format!(
            "dtype {dtype} and shape {shape:?} make {bytes} bytes, but data_offsets [{begin}, {end}] hold {}",
            end - begin
        ));
    }
    Ok(Span { name, begin, end })
}
