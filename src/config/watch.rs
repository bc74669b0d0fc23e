//! Hot reload triggers: file changes (with `notify`), SIGHUP, and (from the admin API)
//! `POST /reload`, all funnelled into [`Gateway::reload`].
//!
//! The folders of gateway.toml and the keys file are watched, not the files: editors that write
//! a temporary file and rename it over the original, and Kubernetes ConfigMaps that swap a
//! `..data` symlink, replace the file's inode, which a watch on the file itself would lose.
//! Events are debounced, and a reload runs only when the bytes of a watched file changed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use notify::{RecursiveMode, Watcher};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::sync::mpsc;

use super::{fingerprint_of, Config, ConfigError};
use crate::gateway::Gateway;

/// How long the files must stay quiet before a reload: editors write in several steps.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// The pause between the two reads of a file that must agree before it is applied: a file
/// caught mid-write (truncated, then written slowly) reads differently after it.
pub const SETTLE: Duration = Duration::from_millis(100);

/// How long a reload waits for the files to stop changing before it gives up (the config in
/// force stays, and the reload counts as failed).
pub const SETTLE_LIMIT: Duration = Duration::from_secs(5);

/// Loads `path` (and its keys file) once the bytes hold still: the config file is read until
/// two reads [`SETTLE`] apart are byte-identical, and only then validated; a keys file is read
/// again after the same pause and must match what was validated. A file caught mid-write is
/// never applied half-written (a truncated file can be valid TOML with fewer routes and rules).
/// Blocking: run it off the request workers.
pub fn load_settled(path: &Path) -> Result<Config, ConfigError> {
    let deadline = std::time::Instant::now() + SETTLE_LIMIT;
    let read = |p: &Path| std::fs::read(p).map_err(|e| e.to_string());
    let mut previous = read(path);
    loop {
        std::thread::sleep(SETTLE);
        if std::time::Instant::now() > deadline {
            return Err(ConfigError::whole_file(
                path,
                format!(
                    "the file kept changing for {}s; not applied (the previous config stays in force)",
                    SETTLE_LIMIT.as_secs()
                ),
            ));
        }
        let now = read(path);
        if now != previous {
            previous = now;
            continue;
        }
        let bytes = now.map_err(|e| ConfigError::whole_file(path, format!("cannot read: {e}")))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| ConfigError::whole_file(path, "cannot read: not UTF-8 text"))?;
        let config = Config::from_str(path, &text)?;
        if let Some(keys) = &config.auth.keys_file {
            std::thread::sleep(SETTLE);
            let files = [path.to_path_buf(), keys.clone()];
            if fingerprint(&files) != config.fingerprint {
                previous = read(path);
                continue;
            }
        }
        return Ok(config);
    }
}

/// The background service that reloads the config.
pub struct Reloader {
    /// The gateway to reload.
    pub gateway: Arc<Gateway>,
}

/// The files a reload reads: the config and, if set, its keys file and admin token file (in
/// the order of `Config::fingerprint`).
fn watched_files(gateway: &Gateway) -> Vec<PathBuf> {
    let cfg = gateway.config.load();
    let mut files = vec![gateway.path.clone()];
    files.extend(cfg.auth.keys_file.iter().cloned());
    files.extend(cfg.server.admin_token_file.iter().cloned());
    files
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

fn folder_of(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Whether an event in a watched folder can concern `names`: the files themselves (written in
/// place or renamed over), or Kubernetes' `..data` symlink swap. Anything else in the folder,
/// such as a log file written next to the config, is ignored.
fn concerns(event: &notify::Event, names: &[std::ffi::OsString]) -> bool {
    // Opening or reading a file is reported too (inotify IN_OPEN/IN_ACCESS): the reloader's
    // own read would trigger the next one, forever.
    if matches!(event.kind, notify::EventKind::Access(_)) {
        return false;
    }
    event.paths.iter().any(|p| {
        p.file_name()
            .is_some_and(|n| names.iter().any(|w| w == n) || n.to_string_lossy().starts_with(".."))
    })
}

fn watch(files: &[PathBuf], tx: mpsc::UnboundedSender<()>) -> Option<notify::RecommendedWatcher> {
    let names: Vec<std::ffi::OsString> = files
        .iter()
        .filter_map(|f| f.file_name().map(|n| n.to_os_string()))
        .collect();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| concerns(&e, &names)) {
            let _ = tx.send(());
        }
    })
    .map_err(|e| tracing::error!(error = %e, "cannot watch the config; use SIGHUP or POST /reload"))
    .ok()?;
    let mut folders: Vec<PathBuf> = files.iter().map(|f| folder_of(f)).collect();
    folders.sort();
    folders.dedup();
    for folder in &folders {
        if let Err(e) = watcher.watch(folder, RecursiveMode::NonRecursive) {
            tracing::error!(folder = %folder.display(), error = %e, "cannot watch folder; use SIGHUP or POST /reload");
        }
    }
    Some(watcher)
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut files = watched_files(&self.gateway);
        let mut _watcher = watch(&files, tx.clone());
        // Compare with what the config in force was read from, not with the files now: an
        // edit made while the watch was being set up must not be missed.
        if fingerprint(&files) != self.gateway.config.load().fingerprint {
            let _ = tx.send(());
        }
        // The files' digest when a reload of them failed: the same bytes would fail again.
        let mut failed: Option<[u8; 32]> = None;
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
                    // Debounce: wait until the folder has been quiet for DEBOUNCE.
                    while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {}
                    // Nothing to do when the files hold what is in force (a no-op write, or bytes
                    // a POST /reload or SIGHUP already applied) or what already failed. Compared
                    // with the config in force, not with the last reload of this loop: a reload
                    // from elsewhere must not make the watcher miss the file's next state.
                    let now = fingerprint(&files);
                    if now == self.gateway.config.load().fingerprint || failed == Some(now) {
                        continue;
                    }
                    "file change"
                }
                Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => "SIGHUP",
            };
            let before = fingerprint(&files);
            failed = match self.gateway.reload(trigger).await {
                Ok(_) => None,
                Err(_) => Some(before),
            };
            // The keys file may have moved: watch what the config in force names.
            let now_files = watched_files(&self.gateway);
            if now_files != files {
                files = now_files;
                _watcher = watch(&files, tx.clone());
            }
        }
    }
}
