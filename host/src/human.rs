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

/// `412 B`, `16.0 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

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
