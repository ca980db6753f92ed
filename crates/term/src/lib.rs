//! Shared output helpers: byte counts in binary and decimal units, and plain aligned tables.
//!
//! Human output writes GiB/MiB (2^30, 2^20) and GB (10^9) by name; JSON always carries integer
//! bytes. Example: `human_bytes(1536 * 1024 * 1024)` is `"1.50 GiB"`.

pub use plan::units::human_bytes;

pub use plan::units::group_digits;

/// With stderr not a terminal (CI, nohup, a redirected log) the progress bar draws nothing:
/// this prints a plain line there every few seconds instead (nothing with `--json` or on a
/// terminal, where the bar shows).
pub struct PlainProgress {
    what: &'static str,
    total: u64,
    on: bool,
    started: std::time::Instant,
    last: std::time::Instant,
}

impl PlainProgress {
    /// Seconds between two lines (`FRUGAL_PROGRESS_EVERY_S` overrides it, for tests).
    pub const EVERY_S: f64 = 5.0;

    fn every_s() -> f64 {
        std::env::var("FRUGAL_PROGRESS_EVERY_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(Self::EVERY_S)
    }

    pub fn new(what: &'static str, total: u64, quiet: bool) -> PlainProgress {
        use std::io::IsTerminal;
        let now = std::time::Instant::now();
        PlainProgress {
            what,
            total,
            on: !quiet && !std::io::stderr().is_terminal(),
            started: now,
            last: now,
        }
    }

    /// After step `done` of `total`; `detail` follows the count (e.g. the loss).
    pub fn tick(&mut self, done: u64, detail: &str) {
        if !self.on || self.last.elapsed().as_secs_f64() < Self::every_s() {
            return;
        }
        self.last = std::time::Instant::now();
        eprintln!(
            "{}: step {done}/{} {detail}({:.0} s)",
            self.what,
            self.total,
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// `1 rank`, `2 ranks`: a count and its noun, plural when the count is not 1.
pub fn plural(n: u64, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        _ => format!("{} {noun}s", group_digits(n)),
    }
}

/// Bytes in decimal gigabytes (10^9), as the classic worked examples write them.
pub fn gigabytes(bytes: u64) -> String {
    format!("{:.2} GB", bytes as f64 / 1e9)
}

/// Which side a column's cells are aligned to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A table of text cells printed with aligned columns and a rule under the header.
pub struct Table {
    header: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles; the first column is left-aligned, the rest right.
    pub fn new(header: &[&str]) -> Table {
        let align = (0..header.len())
            .map(|i| if i == 0 { Align::Left } else { Align::Right })
            .collect();
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            align,
            rows: Vec::new(),
        }
    }

    pub fn align(mut self, align: &[Align]) -> Table {
        assert_eq!(align.len(), self.header.len(), "one alignment per column");
        self.align = align.to_vec();
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.header.len(), "one cell per column");
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| r[i].chars().count())
                .chain(std::iter::once(self.header[i].chars().count()))
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.header.len()).map(width).collect();
        let line = |cells: &[String]| {
            let parts: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let pad = widths[i] - c.chars().count();
                    match self.align[i] {
                        Align::Left => format!("{c}{}", " ".repeat(pad)),
                        Align::Right => format!("{}{c}", " ".repeat(pad)),
                    }
                })
                .collect();
            parts.join("  ").trim_end().to_string()
        };
        let mut out = line(&self.header);
        out.push('\n');
        let total: usize = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
        out.push_str(&"-".repeat(total));
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_pick_the_largest_unit() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536 * 1024 * 1024), "1.50 GiB");
        assert_eq!(gigabytes(14_000_000_000), "14.00 GB");
    }

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(&["name", "bytes"]);
        t.row(vec!["params".into(), "12".into()]);
        t.row(vec!["grads".into(), "1234".into()]);
        let text = t.render();
        assert_eq!(text.lines().nth(2), Some("params     12"));
        assert_eq!(text.lines().nth(3), Some("grads    1234"));
    }
}
