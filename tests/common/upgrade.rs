//! The hand-over of a binary upgrade, as the upgrade tests drive it: a second floodgate started
//! with `--upgrade` binds its upgrade socket, the running one is sent SIGQUIT, passes its
//! listening sockets over and exits. The callers keep their own load running meanwhile.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use super::{send_signal, spawn_floodgate_with, Spawned};

/// How long the new process may take to bind its upgrade socket.
const SOCKET_LIMIT: Duration = Duration::from_secs(20);
/// How long the old process may take to exit after SIGQUIT (it serves beside the new one for
/// a few seconds, then drains).
const EXIT_LIMIT: Duration = Duration::from_secs(40);

/// The process that took over, and how the old one ended.
pub struct HandedOver {
    /// The new floodgate (stopped when dropped).
    pub new: Spawned,
    /// Its log file.
    pub new_log: PathBuf,
    /// The old process's exit status.
    pub old_status: ExitStatus,
}

/// The running floodgate being upgraded: its pid, a poll of its exit, and its logs for a
/// failure message.
pub trait Upgraded {
    /// Its process id.
    fn pid(&self) -> u32;
    /// Its exit status, without waiting, once it has exited.
    fn exited(&mut self) -> Option<ExitStatus>;
    /// What it logged.
    fn logs(&self) -> String;
}

impl Upgraded for super::Gateway {
    fn pid(&self) -> u32 {
        super::Gateway::pid(self)
    }
    fn exited(&mut self) -> Option<ExitStatus> {
        self.wait_exit(Duration::ZERO)
    }
    fn logs(&self) -> String {
        super::Gateway::logs(self)
    }
}

impl Upgraded for super::rls::RlsGateway {
    fn pid(&self) -> u32 {
        super::rls::RlsGateway::pid(self)
    }
    fn exited(&mut self) -> Option<ExitStatus> {
        self.wait_exit(Duration::ZERO)
    }
    fn logs(&self) -> String {
        super::rls::RlsGateway::logs(self)
    }
}

/// Upgrades `old` (running `config`, its upgrade socket in `dir`): starts the new process,
/// waits for its socket, sends `old` SIGQUIT and waits for it to exit. Async, so that a load
/// on the caller's runtime keeps running while it waits.
pub async fn hand_over(old: &mut impl Upgraded, config: &Path, dir: &Path) -> HandedOver {
    let new_log = dir.join("floodgate-new.log");
    let mut new = spawn_floodgate_with(config, dir, &new_log, &["--upgrade"]);
    let sock = dir.join("upgrade.sock");
    let start = Instant::now();
    while !sock.exists() {
        assert!(
            new.child.try_wait().unwrap().is_none(),
            "the new process exited: {}",
            std::fs::read_to_string(&new_log).unwrap_or_default()
        );
        assert!(start.elapsed() < SOCKET_LIMIT, "no upgrade socket");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    send_signal(old.pid(), "QUIT");
    let quit = Instant::now();
    let old_status = loop {
        if let Some(status) = old.exited() {
            break status;
        }
        assert!(
            quit.elapsed() < EXIT_LIMIT,
            "the old process did not exit after SIGQUIT\n{}",
            old.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    HandedOver {
        new,
        new_log,
        old_status,
    }
}

/// [`hand_over`] from a test without a runtime (one whose load runs on threads of its own).
pub fn hand_over_blocking(old: &mut impl Upgraded, config: &Path, dir: &Path) -> HandedOver {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime")
        .block_on(hand_over(old, config, dir))
}
