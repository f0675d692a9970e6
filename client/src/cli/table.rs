//! Plain-text tables: a header row and left-aligned columns separated by
//! two spaces, sized to their widest cell.

/// A table being built.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub(crate) fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|title| (*title).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; missing cells are empty, extra cells are dropped.
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    /// Whether no row was added.
    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text, one line per row, each ending with a newline.
    /// Line breaks inside cells become spaces.
    pub(crate) fn render(&self) -> String {
        let clean = |cell: &String| cell.replace(['\n', '\r'], " ");
        let rows: Vec<Vec<String>> = std::iter::once(&self.header)
            .chain(&self.rows)
            .map(|row| row.iter().map(clean).collect())
            .collect();
        let mut widths = vec![0; self.header.len()];
        for row in &rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut text = String::new();
        for row in &rows {
            let mut line = String::new();
            for (index, (cell, width)) in row.iter().zip(&widths).enumerate() {
                if index > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                let padding = width - cell.chars().count();
                line.extend(std::iter::repeat_n(' ', padding));
            }
            text.push_str(line.trim_end());
            text.push('\n');
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let mut table = Table::new(&["ITEM", "STATE"]);
        table.row(vec!["file/config".into(), "CREATED".into()]);
        table.row(vec!["d/x".into()]);
        assert_eq!(
            table.render(),
            "ITEM         STATE\nfile/config  CREATED\nd/x\n"
        );
    }
}
