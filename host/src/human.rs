//! How berth writes quantities for people — in error messages, logs and
//! the CLI's tables — so a duration or a size reads the same wherever it
//! appears.
//! The API never uses it: JSON carries plain numbers (`duration_ms`).

use std::time::Duration;

/// `850ms`, `12.3s`, `45s`, `1m 30s`, `30m`, `2h 1m`: as people write
/// them, precise where it matters and no more.
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    let secs = d.as_secs();
    match (secs / 3600, secs % 3600 / 60, secs % 60) {
        _ if ms < 1000 => format!("{ms}ms"),
        (0, 0, s) if ms.is_multiple_of(1000) => format!("{s}s"),
        (0, 0, s) => format!("{s}.{}s", ms % 1000 / 100),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m {s}s"),
        (h, 0, _) => format!("{h}h"),
        (h, m, _) => format!("{h}h {m}m"),
    }
}

/// `900 bytes`, `4 KiB`, `1.5 MiB`, `16 MiB`, `2 GiB`, `1 PiB`: binary
/// units, whole when exact, else one decimal (rounded down, so a size over
/// a cap never reads as the cap itself).
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut unit = 0;
    while unit + 1 < UNITS.len() && bytes >= 1 << (10 * (unit + 2)) {
        unit += 1;
    }
    let scale = 1u64 << (10 * (unit + 1));
    let (whole, tenths) = (bytes / scale, bytes % scale * 10 / scale);
    if bytes.is_multiple_of(scale) {
        format!("{whole} {}", UNITS[unit])
    } else {
        format!("{whole}.{tenths} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_people_write_them() {
        let cases: &[(u64, &str)] = &[
            (0, "0 bytes"),
            (1023, "1023 bytes"),
            (1024, "1 KiB"),
            (4097, "4.0 KiB"),
            (1536, "1.5 KiB"),
            (1 << 20, "1 MiB"),
            ((1 << 20) + 1, "1.0 MiB"),
            (10 << 20, "10 MiB"),
            (3 << 30, "3 GiB"),
            (5 << 40, "5 TiB"),
            (1 << 60, "1024 PiB"),
        ];
        for &(bytes, expected) in cases {
            assert_eq!(size(bytes), expected, "{bytes} bytes");
        }
    }

    #[test]
    fn durations_read_like_people_write_them() {
        let cases: &[(u64, &str)] = &[
            (0, "0ms"),
            (250, "250ms"),
            (999, "999ms"),
            (1_000, "1s"),
            (1_240, "1.2s"),
            (45_000, "45s"),
            (59_960, "59.9s"),
            (90_000, "1m 30s"),
            (1_800_000, "30m"),
            (3_600_000, "1h"),
            (7_260_000, "2h 1m"),
        ];
        for &(ms, expected) in cases {
            assert_eq!(duration(Duration::from_millis(ms)), expected, "{ms} ms");
        }
    }
}
