//! The device-swap attack's witness: the kernel's software watchdog
//! (`softdog`, loaded with `soft_noboot=1`, so that an armed one never
//! reboots the VM), and a device node of it (misc 10:130, `/dev/watchdog`)
//! that a tenant with `CAP_MKNOD` (root in a Docker container) can make
//! anywhere. Opening that node runs the driver and arms the watchdog, and
//! a close without the magic character leaves it running: the kernel says
//! "watchdog did not stop!". Whether a walker ever opened it is read from
//! the watchdog's own state and that line, never from the walker.
//!
//! Tests that use it hold a host-wide lock for their whole run: one
//! watchdog serves every test of the VM.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The software watchdog, held by one test at a time.
pub struct Softdog {
    _lock: nix::fcntl::Flock<File>,
    class: PathBuf,
    /// "did not stop" lines in the kernel log when the test began.
    before: usize,
}

const LOCK: &str = "/tmp/prjquota-softdog.lock";

impl Softdog {
    /// Loads softdog (never rebooting) and takes it for this test.
    pub fn take() -> Softdog {
        let lock = File::create(LOCK).expect("the softdog lock file");
        let lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .expect("flock the softdog lock");
        let out = std::process::Command::new("modprobe")
            .args(["softdog", "soft_noboot=1", "soft_margin=3600"])
            .output()
            .expect("modprobe");
        assert!(
            out.status.success(),
            "modprobe softdog: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let class = std::fs::read_dir("/sys/class/watchdog")
            .expect("/sys/class/watchdog")
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                std::fs::read_to_string(p.join("identity"))
                    .is_ok_and(|i| i.trim() == "Software Watchdog")
            })
            .expect("softdog registered a watchdog");
        let dog = Softdog {
            _lock: lock,
            class,
            before: did_not_stop_lines(),
        };
        dog.disarm();
        assert!(!dog.armed(), "softdog is armed before the test");
        dog
    }

    /// Makes a device node of the watchdog at `at`, as a tenant would: the
    /// misc device the first watchdog answers, 10:130.
    pub fn mknod(&self, at: &Path) {
        nix::sys::stat::mknod(
            at,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(10, 130),
        )
        .unwrap_or_else(|e| panic!("mknod {}: {e}", at.display()));
    }

    /// Whether anything opened the watchdog since [`Softdog::take`]: it
    /// runs, or the kernel logged a close that left it running.
    pub fn armed(&self) -> bool {
        let state = std::fs::read_to_string(self.class.join("state")).unwrap_or_default();
        state.trim() == "active" || did_not_stop_lines() > self.before
    }

    /// Stops it the way its driver allows: open, the magic character,
    /// close.
    pub fn disarm(&self) {
        let state = std::fs::read_to_string(self.class.join("state")).unwrap_or_default();
        if state.trim() != "active" {
            return;
        }
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/watchdog")
        {
            let _ = f.write_all(b"V");
        }
    }
}

impl Drop for Softdog {
    fn drop(&mut self) {
        self.disarm();
    }
}

fn did_not_stop_lines() -> usize {
    let out = std::process::Command::new("dmesg").output().expect("dmesg");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("did not stop"))
        .count()
}

/// The pause the fault-injection builds make before opening one entry
/// (`prjquota_core::fault`): the variables to give the process, then
/// [`Pause::wait`] for it to stop there and [`Pause::go`] to let it on.
pub struct Pause {
    dir: PathBuf,
    name: String,
}

impl Pause {
    /// A pause before the entry named `name` is opened, signalled through
    /// the directory `dir` (made empty).
    pub fn new(dir: &Path, name: &str) -> Pause {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
        Pause {
            dir: dir.to_path_buf(),
            name: name.into(),
        }
    }

    /// What the paused process's environment must hold.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("PRJQUOTA_PAUSE_DIR", self.dir.display().to_string()),
            ("PRJQUOTA_PAUSE_NAME", self.name.clone()),
        ]
    }

    /// Waits until the process stopped right before opening the entry.
    pub fn wait(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.dir.join("paused").exists() {
            assert!(
                Instant::now() < deadline,
                "nothing paused before opening {} within {within:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Lets it open the entry.
    pub fn go(&self) {
        std::fs::write(self.dir.join("go"), b"").unwrap();
    }
}

/// Swaps two names of one directory in one step (`renameat2(2)` with
/// `RENAME_EXCHANGE`), as an attacker races a walker.
pub fn exchange(a: &Path, b: &Path) {
    nix::fcntl::renameat2(None, a, None, b, nix::fcntl::RenameFlags::RENAME_EXCHANGE)
        .unwrap_or_else(|e| panic!("exchange {} and {}: {e}", a.display(), b.display()));
}
