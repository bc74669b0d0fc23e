//! Hot reload triggers: file changes (with `notify`), SIGHUP, and (from the admin API)
//! `POST /reload`, all funnelled into [`Gateway::reload`], which reads the files with
//! [`load_settled`].
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

mod targets;
mod writes;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use notify::{RecursiveMode, Watcher};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::sync::mpsc;

pub use writes::QUIET;
use writes::{writes, Readiness};

use super::{fingerprint_of, Config, ConfigError};
use crate::gateway::Gateway;

/// How long the files must stay quiet (no event) before the watcher reloads: editors write in
/// several steps.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// Where inotify cannot watch a file (the watch limit reached, a filesystem without events):
/// how long two reads must agree before the file is applied. Weaker than a writer's close: a
/// writer pausing longer than this mid-write is not detected there.
pub const POLLED_SETTLE: Duration = Duration::from_secs(1);

/// How often folders are polled when inotify cannot watch them.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

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
fn files_of(path: &Path, cfg: &Config) -> Vec<PathBuf> {
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
pub fn load_settled(path: &Path) -> Result<Config, ConfigError> {
    let deadline = Instant::now() + SETTLE_LIMIT;
    let mut files = vec![path.to_path_buf()];
    loop {
        let watched = wait_until_complete(&files, deadline)?;
        let seq = writes().seq();
        let bytes = std::fs::read(path);
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
        if !watched {
            std::thread::sleep(POLLED_SETTLE);
        }
        let unchanged = writes().seq() == seq
            && match &loaded {
                Ok(cfg) => fingerprint(&files) == cfg.fingerprint,
                Err(_) => std::fs::read(path).ok().as_ref() == bytes.as_ref().ok(),
            };
        if unchanged {
            return loaded;
        }
        if Instant::now() >= deadline {
            return Err(kept_changing(path));
        }
    }
}

/// The background service that reloads the config.
pub struct Reloader {
    /// The gateway to reload.
    pub gateway: Arc<Gateway>,
}

/// The files a reload of the config in force reads.
fn watched_files(gateway: &Gateway) -> Vec<PathBuf> {
    files_of(&gateway.path, &gateway.config.load())
}

/// A digest of the files' bytes as they are now, comparable with `Config::fingerprint`.
fn fingerprint(files: &[PathBuf]) -> [u8; 32] {
    let contents: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(f).unwrap_or_default())
        .collect();
    let slices: Vec<&[u8]> = contents.iter().map(Vec::as_slice).collect();
    fingerprint_of(&slices)
}

/// The folders being watched, by inotify when it can and by polling otherwise.
struct Watch {
    events: mpsc::UnboundedSender<()>,
    inotify: Option<notify::RecommendedWatcher>,
    polling: Option<notify::PollWatcher>,
    /// Folders watched, and whether by inotify.
    folders: Vec<(PathBuf, bool)>,
}

impl Watch {
    fn new(events: mpsc::UnboundedSender<()>) -> Watch {
        let tx = events.clone();
        let inotify = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
            if e.is_ok_and(|e| writes().record(&e)) {
                let _ = tx.send(());
            }
        })
        .map_err(|e| tracing::warn!(error = %e, "cannot watch the config with inotify; polling it every second"))
        .ok();
        Watch {
            events,
            inotify,
            polling: None,
            folders: Vec::new(),
        }
    }

    fn polling(&mut self) -> Option<&mut notify::PollWatcher> {
        if self.polling.is_none() {
            let tx = self.events.clone();
            let config = notify::Config::default().with_poll_interval(POLL_INTERVAL);
            self.polling = notify::PollWatcher::new(
                move |e: notify::Result<notify::Event>| {
                    if e.is_ok_and(|e| writes().record(&e)) {
                        let _ = tx.send(());
                    }
                },
                config,
            )
            .map_err(|e| tracing::error!(error = %e, "cannot watch the config; use SIGHUP or POST /reload"))
            .ok();
        }
        self.polling.as_mut()
    }

    /// Watches the folders of every point of `files` (resolved now) and no other.
    fn follow(&mut self, files: &[PathBuf]) {
        let points = points_of(files);
        let wanted: BTreeSet<PathBuf> = points.iter().map(|p| writes::folder(p)).collect();
        let mut kept = Vec::new();
        for (folder, live) in std::mem::take(&mut self.folders) {
            if wanted.contains(&folder) {
                kept.push((folder, live));
                continue;
            }
            // Gone already (a swapped ConfigMap's old folder): nothing to undo.
            let _ = match (live, &mut self.inotify, &mut self.polling) {
                (true, Some(w), _) => w.unwatch(&folder),
                (false, _, Some(w)) => w.unwatch(&folder),
                _ => Ok(()),
            };
        }
        self.folders = kept;
        for folder in wanted {
            if self.folders.iter().any(|(f, _)| *f == folder) || !folder.is_dir() {
                continue;
            }
            let by_inotify = self
                .inotify
                .as_mut()
                .map(|w| w.watch(&folder, RecursiveMode::NonRecursive));
            match by_inotify {
                Some(Ok(())) => self.folders.push((folder, true)),
                failed => {
                    if let Some(Err(e)) = failed {
                        tracing::warn!(folder = %folder.display(), error = %e, "cannot watch folder with inotify; polling it every second");
                    }
                    if let Some(w) = self.polling() {
                        match w.watch(&folder, RecursiveMode::NonRecursive) {
                            Ok(()) => self.folders.push((folder, false)),
                            Err(e) => {
                                tracing::error!(folder = %folder.display(), error = %e, "cannot watch folder; use SIGHUP or POST /reload")
                            }
                        }
                    }
                }
            }
        }
        let live: Vec<PathBuf> = self
            .folders
            .iter()
            .filter(|(_, live)| *live)
            .map(|(f, _)| f.clone())
            .collect();
        writes().watch(&points, &live);
    }
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut files = watched_files(&self.gateway);
        let mut watch = Watch::new(tx.clone());
        watch.follow(&files);
        // From here on a writer's open file is known. One that was already writing before
        // (during the start) is not: its next write or its close is.
        tracing::info!(folders = ?watch.folders.iter().map(|(f, _)| f).collect::<Vec<_>>(), "watching the config files");
        // Compare with what the config in force was read from, not with the files now: an
        // edit made while the watch was being set up must not be missed.
        if fingerprint(&files) != self.gateway.config.load().fingerprint {
            let _ = tx.send(());
        }
        // The files' digest when a reload of them failed, with the writers' closes seen then:
        // the same bytes would fail again, unless a writer has closed since (the failure may
        // have been that it was still writing).
        let mut failed: Option<([u8; 32], u64)> = None;
        let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(error = %e, "cannot handle SIGHUP");
                None
            }
        };
        loop {
            let trigger = tokio::select! {
                _ = shutdown.changed() => return,
                Some(()) = rx.recv() => {
                    // Debounce: wait until the folders have been quiet for DEBOUNCE.
                    while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {}
                    // A link on the way may have been swapped: follow what the names resolve
                    // to now.
                    watch.follow(&files);
                    // A writer still has a file open: its close is the next event.
                    if matches!(writes().readiness(&points_of(&files)), Readiness::Writing(_)) {
                        continue;
                    }
                    // Nothing to do when the files hold what is in force (a no-op write, or bytes
                    // a POST /reload or SIGHUP already applied) or what already failed. Compared
                    // with the config in force, not with the last reload of this loop: a reload
                    // from elsewhere must not make the watcher miss the file's next state.
                    let now = fingerprint(&files);
                    if now == self.gateway.config.load().fingerprint
                        || failed == Some((now, writes().closes()))
                    {
                        continue;
                    }
                    "file change"
                }
                Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => "SIGHUP",
            };
            let before = (fingerprint(&files), writes().closes());
            failed = match self.gateway.reload(trigger).await {
                Ok(_) => None,
                Err(_) => Some(before),
            };
            // The keys or token file may have moved: watch what the config in force names.
            let now_files = watched_files(&self.gateway);
            if now_files != files {
                files = now_files;
                watch.follow(&files);
            }
        }
    }
}
