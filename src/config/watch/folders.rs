//! The folders of the config's files, watched: by inotify when it can, polled otherwise.
//! [`ConfigWatch`] is what the reloader waits on; which changes it acts on is the reloader's
//! business (it knows what is in force).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::writes::{self, writes, Readiness};
use super::{fingerprint, points_of, DEBOUNCE};

/// How often folders are polled when inotify cannot watch them.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The files of the config in force (see [`super::files_of`]), their folders watched.
pub struct ConfigWatch {
    events: mpsc::UnboundedReceiver<()>,
    watch: Watch,
    files: Vec<PathBuf>,
}

impl ConfigWatch {
    /// Starts watching the folders of every point on the way to `files` (gateway.toml first).
    /// From here on a writer's open file is known; one that was already writing before is not,
    /// until its next write or its close.
    pub fn start(files: Vec<PathBuf>) -> ConfigWatch {
        let (tx, events) = mpsc::unbounded_channel();
        let mut watch = Watch::new(tx);
        watch.follow(&files);
        tracing::info!(folders = ?watch.folders.iter().map(|(f, _)| f).collect::<Vec<_>>(), "watching the config files");
        ConfigWatch {
            events,
            watch,
            files,
        }
    }

    /// Watches `files` from now on (the config in force may name another keys or token file).
    pub fn set_files(&mut self, files: Vec<PathBuf>) {
        if files != self.files {
            self.files = files;
            self.watch.follow(&self.files);
        }
    }

    /// Queues one change, as a file event would: for an edit made before the watch was up.
    pub fn nudge(&self) {
        let _ = self.watch.events.send(());
    }

    /// The next event on a watched folder. Cancel-safe (it only receives), so it can race
    /// other triggers.
    pub async fn next(&mut self) -> Option<()> {
        self.events.recv().await
    }

    /// After an event: waits until the folders have been quiet for [`DEBOUNCE`], follows the
    /// names again (a link on the way may have been swapped), and says whether the files may be
    /// read: `false` while a writer still has one open (its close is the next event).
    pub async fn settle(&mut self) -> bool {
        while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, self.events.recv()).await {}
        self.watch.follow(&self.files);
        !matches!(
            writes().readiness(&points_of(&self.files)),
            Readiness::Writing(_)
        )
    }

    /// A digest of the watched files' bytes now, comparable with `Config::fingerprint`.
    pub fn fingerprint(&self) -> [u8; 32] {
        fingerprint(&self.files)
    }

    /// Writers' closes seen so far: a failed reload of the same bytes is worth retrying once a
    /// writer has closed since (the failure may have been that it was still writing).
    pub fn closes(&self) -> u64 {
        writes().closes()
    }
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
