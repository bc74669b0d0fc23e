//! The invalid configs of each section, `fixtures/<section>/*.toml` (kept as envoyproxy/ratelimit
//! keeps its `test/config/`), each opening with the error it must give:
//!
//! ```text
//! # error: 14:10: rule "r": window must be at least 1ms
//! # at: "0ms"
//! ```
//!
//! `L:C` is a line and column of the fixture itself, `FILE:L:C` of a file beside it (an error
//! in a keys file), `0:0` an error about the file as a whole. `# at:` is the text found at that
//! line and column, so that each position is checked against what it points at and not only
//! against a number. `{dir}` in a message stands for the section's folder (some messages name a
//! resolved path). A fixture whose bytes must be exactly what they are (the empty file) keeps
//! its expectation beside it, in `NAME.toml.expect`. Helper files live in `files/`.

use std::path::{Path, PathBuf};

use crate::config::{Config, ConfigError};

/// The error a fixture says it gives.
#[derive(Debug)]
struct Expected {
    file: PathBuf,
    line: usize,
    column: usize,
    message: String,
    /// The text at `line:column` of `file`.
    at: Option<String>,
}

/// Loads every fixture of `section` in process (what `floodgate check` and a reload do) and
/// asserts that each fails with the error it names. All mismatches are reported at once.
pub(super) fn check_section(section: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/config/validate/fixtures")
        .join(section);
    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a folder entry").path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "toml"))
        .collect();
    fixtures.sort();
    assert!(!fixtures.is_empty(), "no fixtures in {}", dir.display());
    let wrong: Vec<String> = fixtures
        .iter()
        .filter_map(|f| {
            check(f, &dir)
                .err()
                .map(|why| format!("{}: {why}", f.display()))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of the {} [{section}] fixtures do not fail as they say:\n{}",
        wrong.len(),
        fixtures.len(),
        wrong.join("\n")
    );
}

fn check(fixture: &Path, dir: &Path) -> Result<(), String> {
    let want = expected(fixture, dir)?;
    let got = match Config::load(fixture) {
        Ok(_) => return Err("accepted".into()),
        Err(e) => e,
    };
    let same = got.file == want.file
        && got.line == want.line
        && got.column == want.column
        && got.message == want.message;
    if !same {
        return Err(format!(
            "fails with\n    {}\n  not with\n    {}",
            shown(&got, dir),
            shown_expected(&want, dir)
        ));
    }
    if let Some(at) = &want.at {
        let text = std::fs::read_to_string(&want.file).map_err(|e| e.to_string())?;
        let found = text_at(&text, want.line, want.column);
        if !found.starts_with(at.as_str()) {
            return Err(format!(
                "{}:{} points at {found:?}, not at {at:?}",
                want.line, want.column
            ));
        }
    }
    Ok(())
}

/// The expectation of `fixture`: its first two lines, or `NAME.toml.expect`.
fn expected(fixture: &Path, dir: &Path) -> Result<Expected, String> {
    let mut sidecar = fixture.as_os_str().to_owned();
    sidecar.push(".expect");
    let head = match std::fs::read(&sidecar) {
        Ok(bytes) => bytes,
        Err(_) => std::fs::read(fixture).map_err(|e| e.to_string())?,
    };
    let head = String::from_utf8_lossy(&head);
    let mut lines = head.lines();
    let error = lines
        .next()
        .and_then(|l| l.strip_prefix("# error: "))
        .ok_or("the first line is not `# error: ...`")?;
    let (place, message) = error
        .split_once(": ")
        .ok_or("`# error:` has no `: ` after its place")?;
    let parts: Vec<&str> = place.split(':').collect();
    let (file, line, column) = match parts[..] {
        [line, column] => (fixture.to_path_buf(), line, column),
        [file, line, column] => (dir.join(file), line, column),
        _ => return Err(format!("`{place}` is not L:C or FILE:L:C")),
    };
    let number = |s: &str| s.parse::<usize>().map_err(|_| format!("`{place}`: {s}?"));
    let (line, column) = (number(line)?, number(column)?);
    let at = lines.next().and_then(|l| l.strip_prefix("# at: "));
    if line > 0 && at.is_none() {
        return Err("a positioned error needs `# at: ...` on the second line".into());
    }
    Ok(Expected {
        file,
        line,
        column,
        message: message.replace("{dir}", &dir.display().to_string()),
        at: at.map(str::to_string),
    })
}

/// The text from 1-based `line` and `column` (in characters) to the end of that line.
fn text_at(text: &str, line: usize, column: usize) -> String {
    text.lines()
        .nth(line.saturating_sub(1))
        .map(|l| l.chars().skip(column.saturating_sub(1)).collect())
        .unwrap_or_default()
}

fn place(file: &Path, line: usize, column: usize, dir: &Path) -> String {
    let file = file.strip_prefix(dir).unwrap_or(file).display();
    format!("{file}:{line}:{column}")
}

fn shown(e: &ConfigError, dir: &Path) -> String {
    format!("{}: {}", place(&e.file, e.line, e.column, dir), e.message)
}

fn shown_expected(e: &Expected, dir: &Path) -> String {
    format!("{}: {}", place(&e.file, e.line, e.column, dir), e.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runner itself: a fixture that names the wrong line, or points at the wrong text,
    /// or is accepted, is reported (so a fixture cannot pass by saying anything).
    #[test]
    fn a_fixture_that_misstates_its_error_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let body = "[server]\nthreads = 0\n";
        let write = |name: &str, head: &str, body: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, format!("{head}{body}")).unwrap();
            p
        };
        let right = "# error: 4:11: server.threads must be a whole number of at least 1\n# at: 0\n";
        assert_eq!(check(&write("right.toml", right, body), dir.path()), Ok(()));
        for (name, head, body) in [
            ("line.toml", right.replace("4:11", "3:11"), body),
            ("text.toml", right.replace("# at: 0", "# at: 1"), body),
            ("message.toml", right.replace("at least 1", "at least 2"), body),
            ("no_at.toml", right.replace("# at: 0\n", "\n"), body),
            ("accepted.toml", right.to_string(), "[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:1\"]\n[[routes]]\nname = \"r\"\nupstream = \"u\"\n"),
        ] {
            let p = write(name, &head, body);
            assert!(check(&p, dir.path()).is_err(), "{name} passed");
        }
    }
}
