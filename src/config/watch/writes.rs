//! What the file watcher has seen of the files a reload reads: whether some process still has
//! one open for writing, and when each was last written. A reload asks it before it reads.
//!
//! Why not "two reads 100 ms apart agree": a writer that pauses longer than that mid-write (a
//! slow pipe, a script, a stopped process) has its prefix taken for the whole file, and a
//! prefix can be a valid config with fewer rules. inotify says when a writer is done: every
//! write is an `IN_MODIFY`, and the writer's `close()` is an `IN_CLOSE_WRITE` (also when the
//! process dies). So a file is complete when its last modification has been followed by a
//! close, or when it arrived whole by a rename (`IN_MOVED_TO`) or a new directory entry
//! (`IN_CREATE`, which `ln -s` and `ln` make). It is also quiet for [`QUIET`] before it is read,
//! for writers that close and reopen between two parts.
//!
//! One tracker per process ([`writes`]): the watcher's thread feeds it, and any reload (file
//! change, `SIGHUP`, `POST /reload`) reads it.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
use parking_lot::Mutex;

/// How long a watched file must go without a write before it is read.
pub const QUIET: Duration = Duration::from_millis(100);

/// The process's tracker.
pub fn writes() -> &'static Writes {
    static WRITES: LazyLock<Writes> = LazyLock::new(Writes::default);
    &WRITES
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct Writes {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Every path watched (a canonical folder and a name), with what was seen of it.
    points: HashMap<PathBuf, Seen>,
    /// Folders whose events come from inotify (with close events); a folder that is polled
    /// reports changes late and never reports a close.
    live: HashSet<PathBuf>,
    /// Write events (modify, close-write, rename, create, remove) seen on watched paths.
    seq: u64,
    /// Close-write events seen on watched paths.
    closes: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    /// Modified and not closed since.
    open_for_write: bool,
    /// The last write event.
    last: Option<Instant>,
}

/// Whether a set of files may be read now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Every file is watched by inotify, none is open for writing, none was written in the
    /// last [`QUIET`].
    Quiet,
    /// A process has this file open, and has written it since it opened it.
    Writing(PathBuf),
    /// This file was written less than [`QUIET`] ago: wait this long.
    Recent(Duration),
    /// Some file is not watched by inotify: nothing is known of its writers.
    Unknown,
}

impl Writes {
    /// Replaces the watched paths (points) and the folders inotify watches; what was seen of
    /// a point that stays is kept.
    pub fn watch(&self, points: &[PathBuf], live: &[PathBuf]) {
        let mut st = self.state.lock();
        let kept: HashMap<PathBuf, Seen> = points
            .iter()
            .map(|p| (p.clone(), st.points.get(p).copied().unwrap_or_default()))
            .collect();
        st.points = kept;
        st.live = live.iter().cloned().collect();
    }

    /// Takes in one event of the watcher. Returns whether it can change what a reload reads:
    /// an event on a watched path other than an open or a read (a reload's own reads are
    /// reported too: they must not trigger the next one).
    pub fn record(&self, event: &notify::Event) -> bool {
        let mut st = self.state.lock();
        if event.need_rescan() {
            // The kernel's queue overflowed: events were lost, closes among them.
            for seen in st.points.values_mut() {
                seen.open_for_write = false;
                seen.last = Some(Instant::now());
            }
            st.seq += 1;
            st.closes += 1;
            return true;
        }
        let mut concerns = false;
        for path in &event.paths {
            let live = path.parent().is_some_and(|f| st.live.contains(f));
            let Some(seen) = st.points.get_mut(path) else {
                continue;
            };
            let now = Some(Instant::now());
            match event.kind {
                EventKind::Access(AccessKind::Close(AccessMode::Write)) => {
                    seen.open_for_write = false;
                    seen.last = now;
                    st.closes += 1;
                }
                EventKind::Access(_) => continue,
                // A change of mode or times only: the bytes are what they were.
                EventKind::Modify(ModifyKind::Metadata(_)) => {
                    concerns = true;
                    continue;
                }
                EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Any | ModifyKind::Other) => {
                    // Only inotify reports the close that ends this; a polled folder's change
                    // is seen whole.
                    seen.open_for_write = live;
                    seen.last = now;
                }
                // A rename over it, a new entry, a removal: another file is at this name now.
                _ => {
                    seen.open_for_write = false;
                    seen.last = now;
                }
            }
            st.seq += 1;
            concerns = true;
        }
        concerns
    }

    /// Whether `points` (see [`super::targets::points`]) may be read now.
    pub fn readiness(&self, points: &[PathBuf]) -> Readiness {
        let st = self.state.lock();
        let mut wait = Duration::ZERO;
        let mut unknown = false;
        for p in points {
            let watched = p.parent().is_some_and(|f| st.live.contains(f));
            let Some(seen) = st.points.get(p) else {
                unknown = true;
                continue;
            };
            if watched && seen.open_for_write {
                return Readiness::Writing(p.clone());
            }
            if let Some(last) = seen.last {
                wait = wait.max(QUIET.saturating_sub(last.elapsed()));
            }
            unknown |= !watched;
        }
        if !wait.is_zero() {
            Readiness::Recent(wait)
        } else if unknown {
            Readiness::Unknown
        } else {
            Readiness::Quiet
        }
    }

    /// Write events seen so far: a reload compares it before and after reading, to tell a
    /// file written while it was being read.
    pub fn seq(&self) -> u64 {
        self.state.lock().seq
    }

    /// Close-write events seen so far: the reloader forgets that some bytes failed to load
    /// once a writer has closed (the failure may have been that it was still writing).
    pub fn closes(&self) -> u64 {
        self.state.lock().closes
    }
}

/// The folder of a point.
pub fn folder(point: &Path) -> PathBuf {
    point.parent().map(Path::to_path_buf).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, DataChange, MetadataKind, RenameMode};

    fn event(kind: EventKind, path: &Path) -> notify::Event {
        notify::Event::new(kind).add_path(path.to_path_buf())
    }

    fn modify() -> EventKind {
        EventKind::Modify(ModifyKind::Data(DataChange::Any))
    }

    fn close_write() -> EventKind {
        EventKind::Access(AccessKind::Close(AccessMode::Write))
    }

    #[test]
    fn a_modified_file_is_being_written_until_its_writer_closes_it() {
        let w = Writes::default();
        let p = PathBuf::from("/etc/fg/gateway.toml");
        w.watch(std::slice::from_ref(&p), &[folder(&p)]);
        assert_eq!(w.readiness(std::slice::from_ref(&p)), Readiness::Quiet);
        assert!(w.record(&event(modify(), &p)));
        assert_eq!(
            w.readiness(std::slice::from_ref(&p)),
            Readiness::Writing(p.clone())
        );
        // However long the writer pauses.
        std::thread::sleep(QUIET + Duration::from_millis(20));
        assert_eq!(
            w.readiness(std::slice::from_ref(&p)),
            Readiness::Writing(p.clone())
        );
        let closes = w.closes();
        assert!(w.record(&event(close_write(), &p)));
        assert_eq!(w.closes(), closes + 1);
        assert!(matches!(
            w.readiness(std::slice::from_ref(&p)),
            Readiness::Recent(_)
        ));
        std::thread::sleep(QUIET);
        assert_eq!(w.readiness(std::slice::from_ref(&p)), Readiness::Quiet);
    }

    #[test]
    fn reads_and_opens_change_nothing_and_renames_arrive_whole() {
        let w = Writes::default();
        let p = PathBuf::from("/etc/fg/gateway.toml");
        w.watch(std::slice::from_ref(&p), &[folder(&p)]);
        let seq = w.seq();
        for kind in [
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
        ] {
            assert!(!w.record(&event(kind, &p)));
        }
        assert!(w.record(&event(
            EventKind::Modify(ModifyKind::Metadata(MetadataKind::Any)),
            &p
        )));
        assert_eq!(w.seq(), seq, "neither reads nor touch are writes");
        w.record(&event(modify(), &p));
        for kind in [
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            EventKind::Create(CreateKind::File),
        ] {
            w.record(&event(modify(), &p));
            w.record(&event(kind, &p));
            assert!(
                matches!(w.readiness(std::slice::from_ref(&p)), Readiness::Recent(_)),
                "{kind:?}"
            );
        }
        // Another file in the folder is none of its business.
        assert!(!w.record(&event(modify(), Path::new("/etc/fg/other.log"))));
    }

    #[test]
    fn files_not_watched_by_inotify_are_unknown_and_overflow_forgets_writers() {
        let w = Writes::default();
        let p = PathBuf::from("/etc/fg/gateway.toml");
        let polled = PathBuf::from("/srv/keys.toml");
        w.watch(&[p.clone(), polled.clone()], &[folder(&p)]);
        assert_eq!(
            w.readiness(&[p.clone(), polled.clone()]),
            Readiness::Unknown
        );
        // A polled folder reports no closes: its change does not count as an open writer.
        w.record(&event(modify(), &polled));
        assert!(matches!(
            w.readiness(std::slice::from_ref(&polled)),
            Readiness::Recent(_)
        ));
        w.record(&event(modify(), &p));
        assert!(matches!(
            w.readiness(std::slice::from_ref(&p)),
            Readiness::Writing(_)
        ));
        w.record(&notify::Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan));
        assert!(!matches!(
            w.readiness(std::slice::from_ref(&p)),
            Readiness::Writing(_)
        ));
    }
}
