//! A model's parameter count, from what its weights files say of
//! themselves: a sharded model's index (`metadata.total_parameters`, which
//! transformers writes), else the safetensors headers, read without the
//! tensors (eight bytes of length, then the header's JSON).

use std::io::Read;
use std::path::Path;

use serde_json::Value;

use crate::cli::choose;
use crate::cli::folder::Listed;

/// The largest header read: the `safetensors` crate's own limit.
const MAX_HEADER: u64 = 100_000_000;

const INDEX: &str = "model.safetensors.index.json";

/// What counting found.
#[derive(Debug, Default, PartialEq)]
pub struct Counted {
    pub parameters: Option<u64>,
    /// A sentence per file that could not be counted.
    pub notes: Vec<String>,
}

/// The parameters of the model's weights among `files` of `dir`: a
/// checkpoint's copies are not the model's, so `checkpoint-N/` is left out.
pub fn parameters(dir: &Path, files: &[Listed]) -> Counted {
    let mut counted = Counted::default();
    let model_files: Vec<&Listed> = files
        .iter()
        .filter(|f| {
            f.path
                .split_once('/')
                .is_none_or(|(top, _)| choose::checkpoint_number(top).is_none())
        })
        .collect();
    if let Some(index) = model_files.iter().find(|f| f.path == INDEX) {
        let total = std::fs::read_to_string(dir.join(&index.path))
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok())
            .and_then(|v| v.pointer("/metadata/total_parameters")?.as_u64());
        if let Some(total) = total {
            counted.parameters = Some(total);
            return counted;
        }
    }
    let mut sum: Option<u64> = None;
    for file in model_files
        .iter()
        .filter(|f| f.path.ends_with(".safetensors"))
    {
        match header(&dir.join(&file.path), file.size).and_then(|h| count(&h)) {
            Ok(n) => sum = Some(sum.unwrap_or(0).saturating_add(n)),
            Err(why) => counted.notes.push(format!(
                "{}: {why}; the parameters are not counted",
                file.path
            )),
        }
    }
    if counted.notes.is_empty() {
        counted.parameters = sum;
    }
    counted
}

/// The header of the safetensors file at `path`, of `size` bytes.
fn header(path: &Path, size: u64) -> Result<String, String> {
    let mut file = std::fs::File::open(path).map_err(|e| format!("cannot be read ({e})"))?;
    let mut length = [0u8; 8];
    file.read_exact(&mut length)
        .map_err(|_| "is shorter than a safetensors header".to_string())?;
    let length = u64::from_le_bytes(length);
    if length > MAX_HEADER || length > size.saturating_sub(8) {
        return Err(format!(
            "says its safetensors header is {length} bytes, more than the file holds \
             or a header may be"
        ));
    }
    let mut text = String::new();
    file.take(length)
        .read_to_string(&mut text)
        .map_err(|_| "has a safetensors header that is not UTF-8".to_string())?;
    Ok(text)
}

/// The elements of every tensor a safetensors header lists.
fn count(header: &str) -> Result<u64, String> {
    let Ok(Value::Object(tensors)) = serde_json::from_str::<Value>(header) else {
        return Err("has a safetensors header that is not a JSON object".into());
    };
    let mut total: u64 = 0;
    for (name, tensor) in tensors.iter().filter(|(name, _)| *name != "__metadata__") {
        let shape = tensor
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("has a tensor {name} with no shape"))?;
        let elements = shape.iter().try_fold(1u64, |product, dim| {
            dim.as_u64().and_then(|d| product.checked_mul(d))
        });
        let elements = elements.ok_or_else(|| format!("has a tensor {name} of a bad shape"))?;
        total = total.saturating_add(elements);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file of `tensors` (name, shape), data zeroed as f32.
    fn safetensors(tensors: &[(&str, &[u64])]) -> Vec<u8> {
        let mut offset = 0u64;
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
        for (name, shape) in tensors {
            let bytes = 4 * shape.iter().product::<u64>();
            header.insert(
                (*name).into(),
                serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + bytes]}),
            );
            offset += bytes;
        }
        let text = serde_json::Value::Object(header).to_string();
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend(text.as_bytes());
        out.resize(out.len() + offset as usize, 0);
        out
    }

    fn listed(dir: &Path, files: &[(&str, Vec<u8>)]) -> Vec<Listed> {
        files
            .iter()
            .map(|(path, bytes)| {
                let at = dir.join(path);
                std::fs::create_dir_all(at.parent().unwrap()).unwrap();
                std::fs::write(&at, bytes).unwrap();
                Listed {
                    path: path.to_string(),
                    size: bytes.len() as u64,
                }
            })
            .collect()
    }

    #[test]
    fn the_headers_are_counted_and_a_checkpoints_copy_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let files = listed(
            dir.path(),
            &[
                (
                    "adapter_model.safetensors",
                    safetensors(&[("a", &[8, 4]), ("b", &[4, 8])]),
                ),
                (
                    "checkpoint-3/adapter_model.safetensors",
                    safetensors(&[("a", &[8, 4])]),
                ),
                ("extra/more.safetensors", safetensors(&[("c", &[3])])),
                ("config.json", b"{}".to_vec()),
            ],
        );
        assert_eq!(
            parameters(dir.path(), &files),
            Counted {
                parameters: Some(67),
                notes: vec![]
            }
        );
    }

    #[test]
    fn an_index_says_the_total_and_a_bad_header_is_a_note_with_no_count() {
        let dir = tempfile::tempdir().unwrap();
        let index =
            br#"{"metadata": {"total_parameters": 1234, "total_size": 4936}, "weight_map": {}}"#;
        let files = listed(dir.path(), &[(INDEX, index.to_vec())]);
        assert_eq!(parameters(dir.path(), &files).parameters, Some(1234));

        let mut lying = 9_000u64.to_le_bytes().to_vec();
        lying.extend(b"{}");
        let files = listed(
            dir.path(),
            &[
                ("good.safetensors", safetensors(&[("a", &[2])])),
                ("bad.safetensors", lying),
            ],
        );
        let counted = parameters(dir.path(), &files);
        assert_eq!(counted.parameters, None);
        assert_eq!(
            counted.notes,
            vec![
                "bad.safetensors: says its safetensors header is 9000 bytes, more than the file \
                 holds or a header may be; the parameters are not counted"
                    .to_string()
            ]
        );
    }
}
