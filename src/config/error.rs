//! Configuration errors that point at the file, line and column at fault.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// An invalid configuration: where it is wrong and a sentence saying why.
///
/// `Display` renders `file:line:column: message`, the form editors and CI logs link to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file at fault (gateway.toml or the keys file).
    pub file: PathBuf,
    /// 1-based line, 0 when the error is about the file as a whole (unreadable, say).
    pub line: usize,
    /// 1-based column, 0 with `line`.
    pub column: usize,
    /// What is wrong, for a human.
    pub message: String,
}

impl ConfigError {
    /// An error about the whole file, such as one that cannot be read.
    pub fn whole_file(file: &Path, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_path_buf(),
            line: 0,
            column: 0,
            message: message.into(),
        }
    }

    /// An error at a byte span of `source`, the text of `file`.
    pub fn at(
        file: &Path,
        source: &str,
        span: Option<Range<usize>>,
        message: impl Into<String>,
    ) -> Self {
        let (line, column) = span.map_or((0, 0), |s| line_column(source, s.start));
        ConfigError {
            file: file.to_path_buf(),
            line,
            column,
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file.display(),
                self.line,
                self.column,
                self.message
            )
        }
    }
}

impl std::error::Error for ConfigError {}

/// 1-based line and column (in characters) of byte `offset` in `source`.
pub fn line_column(source: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(source.len());
    let before = source.get(..offset).unwrap_or(source);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_are_one_based() {
        let src = "a = 1\nbb = 2\n";
        assert_eq!(line_column(src, 0), (1, 1));
        assert_eq!(line_column(src, 6), (2, 1));
        assert_eq!(line_column(src, 9), (2, 4));
    }

    #[test]
    fn display_names_file_line_column() {
        let e = ConfigError::at(Path::new("g.toml"), "x\ny = 1", Some(2..3), "bad");
        assert_eq!(e.to_string(), "g.toml:2:1: bad");
        assert_eq!(
            ConfigError::whole_file(Path::new("g.toml"), "gone").to_string(),
            "g.toml: gone"
        );
    }
}
