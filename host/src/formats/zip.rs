//! Just enough of the zip format to find a `torch.save` archive: its first
//! entry's name, and the names of its central directory. Pure: the bytes
//! are handed in. ZIP64 end records are not read (a torch archive names
//! `data.pkl` first, which the first entry already shows).

/// The most of a zip's end read to find its end record: the record (22
/// bytes) and the longest comment it may carry.
pub(super) const MAX_TAIL: u64 = 22 + 0xFFFF;

/// The largest central directory read: thousands of entries.
pub(super) const MAX_DIRECTORY: u64 = 4 << 20;

const LOCAL: &[u8; 4] = b"PK\x03\x04";
const CENTRAL: &[u8; 4] = b"PK\x01\x02";
const END: &[u8; 4] = b"PK\x05\x06";

pub(super) fn is_zip(head: &[u8]) -> bool {
    head.starts_with(LOCAL)
}

/// `torch.save`'s pickle: `data.pkl` under the archive's folder.
pub(super) fn is_data_pkl(name: &[u8]) -> bool {
    name == b"data.pkl" || name.ends_with(b"/data.pkl")
}

fn u16_at(bytes: &[u8], at: usize) -> Option<usize> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?).into())
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?).into())
}

/// The name of the local entry `head` opens with, if the head holds it.
pub(super) fn first_entry(head: &[u8]) -> Option<&[u8]> {
    let len = u16_at(head, 26)?;
    head.get(30..30 + len)
}

/// The central directory's (offset, size) from the end record in `tail`
/// (a file's last bytes): the last `PK\x05\x06` whose comment ends the file.
pub(super) fn directory(tail: &[u8]) -> Option<(u64, u64)> {
    let last = tail.len().checked_sub(22)?;
    (0..=last).rev().find_map(|at| {
        let record = &tail[at..];
        if !record.starts_with(END) || u16_at(record, 20)? != record.len() - 22 {
            return None;
        }
        Some((u32_at(record, 16)?, u32_at(record, 12)?))
    })
}

/// The entry names of a central directory, up to the first record that is
/// not one.
pub(super) fn names(directory: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let record = directory.get(at..)?;
        if !record.starts_with(CENTRAL) {
            return None;
        }
        let (name, extra, comment) = (
            u16_at(record, 28)?,
            u16_at(record, 30)?,
            u16_at(record, 32)?,
        );
        let found = record.get(46..46 + name)?;
        at += 46 + name + extra + comment;
        Some(found)
    })
}
