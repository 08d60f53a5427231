//! Text for people: aligned tables, sizes, durations, timestamps. Pure
//! functions of their input; never prints.

/// Rows under a header, each column as wide as its widest cell, two spaces
/// apart. Width counts characters, which is right for the text berth
/// stores (names, paths, sentences) though not for wide scripts.
pub struct Table {
    headers: Vec<&'static str>,
    right_aligned: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&'static str]) -> Self {
        Self {
            headers: headers.to_vec(),
            right_aligned: vec![false; headers.len()],
            rows: Vec::new(),
        }
    }

    /// Numbers line up on their last digit.
    pub fn right_align(mut self, columns: &[usize]) -> Self {
        for &column in columns {
            self.right_aligned[column] = true;
        }
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        // A line break inside a cell (an error's stderr tail) would break
        // the table's lines.
        self.rows.push(
            cells
                .into_iter()
                .map(|c| c.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect(),
        );
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let headers: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        let mut out = String::new();
        for row in std::iter::once(&headers).chain(&self.rows) {
            let mut line = String::new();
            for (column, cell) in row.iter().enumerate() {
                if column > 0 {
                    line.push_str("  ");
                }
                let pad = " ".repeat(widths[column] - cell.chars().count());
                if self.right_aligned[column] {
                    line.push_str(&pad);
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&pad);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// A stored `duration_ms`, written as berth writes every duration.
pub fn duration_ms(ms: i64) -> String {
    crate::human::duration(std::time::Duration::from_millis(ms.max(0) as u64))
}

/// `2026-11-29T22:14:50.123Z` → `2026-11-29 22:14:50` (UTC, as stored).
pub fn timestamp(rfc3339: &str) -> String {
    match (rfc3339.get(..10), rfc3339.get(11..19)) {
        (Some(date), Some(time)) if rfc3339.as_bytes()[10] == b'T' => format!("{date} {time}"),
        _ => rfc3339.to_string(),
    }
}

/// At most `max` characters, the cut marked with `…`.
pub fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let kept: String = text.chars().take(max.saturating_sub(1)).collect();
    format!("{kept}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_flatten_line_breaks() {
        let mut table = Table::new(&["ID", "NAME", "SIZE"]).right_align(&[0, 2]);
        table.row(vec!["7".into(), "adapter".into(), "1.0 KiB".into()]);
        table.row(vec!["12".into(), "a\nb".into(), "3 B".into()]);
        assert_eq!(
            table.render(),
            "ID  NAME        SIZE\n 7  adapter  1.0 KiB\n12  a b          3 B\n"
        );
    }

    #[test]
    fn stored_durations_read_naturally() {
        assert_eq!(duration_ms(-5), "0ms", "a clock stepped back");
        assert_eq!(duration_ms(65_000), "1m 5s");
    }

    #[test]
    fn timestamps_and_truncation() {
        assert_eq!(timestamp("2026-11-29T22:14:50.123Z"), "2026-11-29 22:14:50");
        assert_eq!(timestamp("yesterday"), "yesterday");
        assert_eq!(truncate("abcdef", 6), "abcdef");
        assert_eq!(truncate("abcdef", 4), "abc…");
    }
}
