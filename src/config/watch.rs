//! What a reload needs of the config's files: when they are complete enough to read
//! ([`load_settled`]), and when they change ([`ConfigWatch`]). The reloader that acts on them
//! (file changes, SIGHUP and `POST /reload`, all funnelled into one reload) is the gateway's,
//! `crate::gateway::reload`: this module loads and watches files and knows nothing of what is in
//! force.
//!
//! Folders are watched, not files: editors that write a temporary file and rename it over the
//! original, and Kubernetes ConfigMaps that swap a `..data` symlink, replace the file's inode,
//! which a watch on the file itself would lose. The folders are those of every name on the way
//! from a configured path to the file it finally names ([`targets`]), so a config symlinked into
//! another folder is seen when its target is edited or replaced, and the chain is resolved again
//! after every change. Events are debounced, and a reload runs only when the bytes of a watched
//! file changed.
//!
//! When a file is complete ([`writes`]): no process has it open for writing (inotify reports
//! each writer's close), and nothing wrote it for 100 ms. A writer that pauses mid-write,
//! however long, is waited for; its prefix is never applied.

mod folders;
mod targets;
mod writes;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use folders::ConfigWatch;
pub use writes::QUIET;
use writes::{writes, Readiness};

use super::{fingerprint_of, Config, ConfigError};

/// How long the files must stay quiet (no event) before the watcher reloads: editors write in
/// several steps.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// Where inotify cannot watch a file (the watch limit reached, a filesystem without events):
/// how long two reads must agree before the file is applied. Weaker than a writer's close: a
/// writer pausing longer than this mid-write is not detected there.
pub const POLLED_SETTLE: Duration = Duration::from_secs(1);

/// How long a reload waits for a writer to close the file, or for the files to stop changing,
/// before it gives up (the config in force stays, and the reload counts as failed; the
/// watcher reloads again when the writer closes).
pub const SETTLE_LIMIT: Duration = Duration::from_secs(5);

/// How often a reload waiting for a writer looks again.
const WAIT_STEP: Duration = Duration::from_millis(10);

/// Every point (see [`targets::points`]) of `files`.
fn points_of(files: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for f in files {
        for p in targets::points(f) {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// The files a config was read from, in the order of `Config::fingerprint`: gateway.toml and,
/// if named, the keys file and the admin token file.
pub fn files_of(path: &Path, cfg: &Config) -> Vec<PathBuf> {
    let mut files = vec![path.to_path_buf()];
    files.extend(cfg.auth.keys_file.iter().cloned());
    files.extend(cfg.server.admin_token_file.iter().cloned());
    files
}

/// Waits until `files` may be read: none open for writing, none written in the last
/// [`QUIET`]. `Ok(true)` when inotify vouches for all of them, `Ok(false)` when some are not
/// watched by it (then only a settle window can tell), an error past `deadline`.
fn wait_until_complete(files: &[PathBuf], deadline: Instant) -> Result<bool, ConfigError> {
    loop {
        let readiness = writes().readiness(&points_of(files));
        let wait = match &readiness {
            Readiness::Quiet => return Ok(true),
            Readiness::Unknown => return Ok(false),
            Readiness::Recent(d) => *d,
            Readiness::Writing(_) => WAIT_STEP,
        };
        if Instant::now() >= deadline {
            return Err(match readiness {
                Readiness::Writing(p) => still_open(&p),
                _ => kept_changing(&files[0]),
            });
        }
        std::thread::sleep(wait.max(WAIT_STEP));
    }
}

fn still_open(path: &Path) -> ConfigError {
    ConfigError::whole_file(
        path,
        format!(
            "still open for writing by another process (no close within {}s); not applied, the \
             previous config stays in force (it is applied when the writer closes it; or write \
             another file and rename it over this one)",
            SETTLE_LIMIT.as_secs()
        ),
    )
}

fn kept_changing(path: &Path) -> ConfigError {
    ConfigError::whole_file(
        path,
        format!(
            "the file kept changing for {}s; not applied (the previous config stays in force)",
            SETTLE_LIMIT.as_secs()
        ),
    )
}

/// Loads `path` (and the keys and token files it names) once they are complete: no process
/// has one open for writing and none was written in the last [`QUIET`] (as the watcher saw
/// it), and nothing was written while they were read and validated. Files inotify does not
/// watch must instead read the same twice, [`POLLED_SETTLE`] apart. A file caught mid-write is
/// never applied half-written (a prefix can be valid TOML with fewer routes and rules).
/// Blocking: run it off the request workers.
///
/// `known` is what the config in force names ([`files_of`]): the likely list, so that a
/// config with a keys file is read once, not once to learn of the file and again with it (a
/// keys file of a million keys takes seconds to read).
pub fn load_settled(path: &Path, known: Vec<PathBuf>) -> Result<Config, ConfigError> {
    let deadline = Instant::now() + SETTLE_LIMIT;
    let mut files = if known.first().map(PathBuf::as_path) == Some(path) {
        known
    } else {
        vec![path.to_path_buf()]
    };
    loop {
        let watched = wait_until_complete(&files, deadline)?;
        let seq = writes().seq();
        let bytes = crate::config::read_capped(path, crate::config::MAX_CONFIG_BYTES);
        let loaded = match &bytes {
            Ok(b) => String::from_utf8(b.clone())
                .map_err(|_| ConfigError::whole_file(path, "cannot read: not UTF-8 text"))
                .and_then(|text| Config::from_str(path, &text)),
            Err(e) => Err(ConfigError::whole_file(path, format!("cannot read: {e}"))),
        };
        let named = match &loaded {
            Ok(cfg) => files_of(path, cfg),
            Err(_) => vec![path.to_path_buf()],
        };
        if named != files {
            // The config names other files (a keys file), which were read without knowing
            // whether they were complete: wait for them too, and read everything again.
            files = named;
            continue;
        }
        // The watcher's thread takes inotify's events in on its own time: a write made just
        // before or during the read may not be counted yet, and the prefix read would pass for
        // the whole file. It gets [`QUIET`] to count it before the count is compared (files
        // inotify does not watch: two reads [`POLLED_SETTLE`] apart must agree instead).
        std::thread::sleep(if watched { QUIET } else { POLLED_SETTLE });
        let unchanged = writes().seq() == seq
            && match &loaded {
                Ok(cfg) => fingerprint(&files) == cfg.fingerprint,
                Err(_) => {
                    crate::config::read_capped(path, crate::config::MAX_CONFIG_BYTES)
                        .ok()
                        .as_ref()
                        == bytes.as_ref().ok()
                }
            };
        if unchanged {
            return loaded;
        }
        if Instant::now() >= deadline {
            return Err(kept_changing(path));
        }
    }
}

/// A digest of the files' bytes as they are now, comparable with `Config::fingerprint`.
pub fn fingerprint(files: &[PathBuf]) -> [u8; 32] {
    let contents: Vec<Vec<u8>> = files
        .iter()
        .map(|f| {
            crate::config::read_capped(f, crate::config::MAX_KEYS_FILE_BYTES).unwrap_or_default()
        })
        .collect();
    let slices: Vec<&[u8]> = contents.iter().map(Vec::as_slice).collect();
    fingerprint_of(&slices)
}
