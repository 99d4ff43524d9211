//! The one printer of every command: a value as pretty JSON (`--json`) or
//! as its human text, and the tables the human text of lists is made of.
//! Writes return their error rather than panic, so `fastack … | head` ends
//! quietly when the reader goes away.

use std::fmt::Display;

use serde::Serialize;

/// `println!` that returns the write's error instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}
pub(crate) use out;

/// Prints `value` as JSON with `--json`, else as `human` says.
pub fn print<T: Serialize>(
    json: bool,
    value: &T,
    human: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    if json {
        out!("{}", serde_json::to_string_pretty(value)?)?;
    } else {
        out!("{}", human(value))?;
    }
    Ok(())
}

/// How a column's cells are padded.
#[derive(Clone, Copy)]
pub enum Align {
    Left,
    Right,
}

/// A table of fixed-width columns two spaces apart, the header first; the
/// last column is never padded. Cells are formatted with the column's width
/// by their own `Display`.
pub struct Table {
    columns: Vec<(usize, Align)>,
    text: String,
}

impl Table {
    /// A table whose header names each column, with its width and
    /// alignment (the last one's width is not used).
    pub fn new(header: &[(&str, usize, Align)]) -> Table {
        let mut table = Table {
            columns: header.iter().map(|&(_, w, a)| (w, a)).collect(),
            text: String::new(),
        };
        let names: Vec<&dyn Display> = header.iter().map(|(n, _, _)| n as &dyn Display).collect();
        table.line(&names);
        table
    }

    /// One row, a cell per column.
    pub fn row(&mut self, cells: &[&dyn Display]) {
        self.text.push('\n');
        self.line(cells);
    }

    fn line(&mut self, cells: &[&dyn Display]) {
        use std::fmt::Write as _;
        let last = cells.len().saturating_sub(1);
        for (i, cell) in cells.iter().enumerate() {
            let (width, align) = self.columns.get(i).copied().unwrap_or((0, Align::Left));
            // Writing to a String cannot fail.
            let _ = match (i == last, align) {
                (true, _) => write!(self.text, "{cell}"),
                (false, Align::Left) => write!(self.text, "{cell:<width$}  "),
                (false, Align::Right) => write!(self.text, "{cell:>width$}  "),
            };
        }
    }
}

impl Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// `T` as people read it in a table: `2026-01-31 12:00:00`.
pub fn time(t: &chrono::DateTime<chrono::Utc>) -> impl Display + use<> {
    t.format("%Y-%m-%d %H:%M:%S")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tables read as the format strings they replaced.
    #[test]
    fn a_table_pads_every_column_but_the_last() {
        let mut t = Table::new(&[
            ("NAME", 6, Align::Left),
            ("N", 4, Align::Right),
            ("WHAT", 0, Align::Left),
        ]);
        t.row(&[&"a", &12, &"x y"]);
        let expected = format!(
            "{:<6}  {:>4}  {}\n{:<6}  {:>4}  {}",
            "NAME", "N", "WHAT", "a", 12, "x y"
        );
        assert_eq!(t.to_string(), expected);
    }
}
