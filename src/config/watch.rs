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

use super::fingerprint_of;
use crate::gateway::Gateway;

/// How long the files must stay quiet before a reload: editors write in several steps.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// The background service that reloads the config.
pub struct Reloader {
    /// The gateway to reload.
    pub gateway: Arc<Gateway>,
}

/// The files a reload reads: the config and, if set, its keys file.
fn watched_files(gateway: &Gateway) -> Vec<PathBuf> {
    let mut files = vec![gateway.path.clone()];
    if let Some(k) = &gateway.config.load().auth.keys_file {
        files.push(k.clone());
    }
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
        let mut last = self.gateway.config.load().fingerprint;
        if fingerprint(&files) != last {
            let _ = tx.send(());
        }
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
                    let now = fingerprint(&files);
                    if now == last {
                        continue;
                    }
                    "file change"
                }
                Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => "SIGHUP",
            };
            last = fingerprint(&files);
            let _ = self.gateway.reload(trigger).await;
            if trigger == "SIGHUP" {
                // A SIGHUP reload may have read newer bytes than `last`; trust what is in force.
                last = self.gateway.config.load().fingerprint;
            }
            // The keys file may have moved: watch what the config in force names.
            let now_files = watched_files(&self.gateway);
            if now_files != files {
                files = now_files;
                _watcher = watch(&files, tx.clone());
                last = fingerprint(&files);
            }
        }
    }
}
