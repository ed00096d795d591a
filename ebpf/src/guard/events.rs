//! The guard's events: one record per attempt (or privileged project
//! change) in the ring buffer, parsed from `struct guard_event`.

use super::Guard;

pub(super) const GUARD_ALLOWED: u8 = 0;
pub(super) const GUARD_SRC_LSM: u8 = 1;
pub(super) const GUARD_WHAT_PROJID: u8 = 1;
pub(super) const GUARD_WHAT_NOINHERIT: u8 = 2;
pub(super) const GUARD_WHAT_UNREADABLE: u8 = 4;
pub(super) const GUARD_WHAT_FOREIGN_PROJID: u8 = 8;
pub(super) const GUARD_WHAT_GENERATION: u8 = 16;
pub(super) const GUARD_WHERE_OUTSIDE: u32 = 1;
pub(super) const GUARD_WHERE_VOLUME: u32 = 2;
#[cfg(test)]
pub(super) const GUARD_WHERE_WALK_LIMIT: u32 = 3;
/// `sizeof(struct guard_event)`.
pub(super) const EVENT_SIZE: usize = 80;

/// Events returned by one [`Guard::drain_events`] at most (the rest stay
/// in the ring buffer for the next call).
pub const MAX_EVENTS_PER_DRAIN: usize = 16_384;

/// Where the inode of an event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Place {
    /// At or below a volume root.
    Volume,
    /// Outside every volume root, on a device that holds volumes.
    Outside,
    /// Deeper than [`GUARD_MAX_DEPTH`](super::GUARD_MAX_DEPTH) below the filesystem's root without
    /// a volume root found.
    Unknown,
}

/// The outcome of one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Allowed,
    Denied,
}

impl Outcome {
    /// The `result` label value: `allowed`, `denied`.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
        }
    }
}

/// Which program saw an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventSource {
    /// The detecting fexit (`vfs_fileattr_set`, or the ioctl system call
    /// before 5.13): the kernel's own outcome.
    Fileattr,
    /// The LSM program: refused by the guard.
    Lsm,
}

/// One attempt (or one privileged project change), as the kernel saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardEvent {
    /// Process (thread group) ID.
    pub pid: u32,
    pub tid: u32,
    /// Real uid, as the initial user namespace sees it.
    pub uid: u32,
    pub comm: String,
    /// cgroup v2 ID of the caller (the inode number of its cgroup directory
    /// under /sys/fs/cgroup: `find /sys/fs/cgroup -inum <id>`).
    pub cgroup_id: u64,
    /// Where the inode is.
    pub place: Place,
    pub result: Outcome,
    pub source: EventSource,
    /// The caller has CAP_SYS_ADMIN in the initial user namespace: allowed,
    /// not counted as an attempt.
    pub privileged: bool,
    /// Sets a project ID other than the volume's.
    pub changes_project: bool,
    /// Leaves a directory without PROJINHERIT.
    pub clears_inherit: bool,
    /// The LSM could not read the new attributes (refused).
    pub unreadable: bool,
    /// Outside every volume: gives a file a volume's project ID.
    pub joins_project: bool,
    /// Sets the inode generation (`FS_IOC_SETVERSION` and its twins):
    /// on a root, it would take the volume out of the guard's key.
    pub sets_generation: bool,
    /// The requested project ID (`FS_IOC_FSSETXATTR`), else the file's.
    pub projid: u32,
    /// The volume's project ID (outside every volume: the project asked
    /// for).
    pub volume_projid: u32,
    /// Requested `fsx_xflags` (from `FS_IOC_SETFLAGS`: PROJINHERIT only).
    pub xflags: u32,
    /// The errno the caller got (`None`: success).
    pub errno: Option<i32>,
    /// The ioctl command (LSM events, and detect events before 5.13), else 0.
    pub cmd: u32,
    /// `st_dev` (userspace encoding) and inode number of the changed inode.
    pub st_dev: u64,
    pub ino: u64,
}

impl GuardEvent {
    /// Parses one `struct guard_event` record.
    fn parse(b: &[u8]) -> Option<GuardEvent> {
        if b.len() < EVENT_SIZE {
            return None;
        }
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let comm = &b[64..80];
        let end = comm.iter().position(|&c| c == 0).unwrap_or(comm.len());
        let dev = u64_at(16);
        let place = match u32_at(36) {
            GUARD_WHERE_VOLUME => Place::Volume,
            GUARD_WHERE_OUTSIDE => Place::Outside,
            _ => Place::Unknown,
        };
        let ret = u32_at(52) as i32;
        let what = b[58];
        Some(GuardEvent {
            cgroup_id: u64_at(0),
            ino: u64_at(8),
            st_dev: libc::makedev((dev >> 20) as u32, (dev & 0xf_ffff) as u32),
            pid: u32_at(24),
            tid: u32_at(28),
            uid: u32_at(32),
            place,
            projid: u32_at(40),
            volume_projid: u32_at(44),
            xflags: u32_at(48),
            errno: (ret < 0).then_some(-ret),
            result: if b[56] == GUARD_ALLOWED {
                Outcome::Allowed
            } else {
                Outcome::Denied
            },
            source: if b[57] == GUARD_SRC_LSM {
                EventSource::Lsm
            } else {
                EventSource::Fileattr
            },
            changes_project: what & GUARD_WHAT_PROJID != 0,
            clears_inherit: what & GUARD_WHAT_NOINHERIT != 0,
            unreadable: what & GUARD_WHAT_UNREADABLE != 0,
            joins_project: what & GUARD_WHAT_FOREIGN_PROJID != 0,
            sets_generation: what & GUARD_WHAT_GENERATION != 0,
            privileged: b[59] != 0,
            cmd: u32_at(60),
            comm: String::from_utf8_lossy(&comm[..end]).into_owned(),
        })
    }

    /// What the caller tried, in a few words (for a log line).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.changes_project {
            parts.push(format!(
                "set project ID {} (the volume's is {})",
                self.projid, self.volume_projid
            ));
        }
        if self.clears_inherit {
            parts.push("clear PROJINHERIT on a directory".to_string());
        }
        if self.unreadable {
            parts.push("change attributes (argument unreadable)".to_string());
        }
        if self.sets_generation {
            parts.push(
                "set the inode generation (on a volume root: hides it from the guard)".to_string(),
            );
        }
        if self.joins_project {
            parts.push(format!(
                "give a file outside every volume the volume project ID {}",
                self.projid
            ));
        }
        parts.join(" and ")
    }
}

impl Guard {
    /// The events waiting in the ring buffer, oldest first (at most
    /// [`MAX_EVENTS_PER_DRAIN`]; never blocks).
    pub fn drain_events(&mut self) -> Vec<GuardEvent> {
        let mut out = Vec::new();
        while out.len() < MAX_EVENTS_PER_DRAIN {
            let Some(item) = self.events.next() else {
                break;
            };
            if let Some(e) = GuardEvent::parse(&item) {
                out.push(e);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_size_matches_the_c_struct() {
        // Sum of the fields of struct guard_event, in order, no padding.
        let sizes = [8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 4, 1, 1, 1, 1, 4, 16];
        assert_eq!(sizes.iter().sum::<usize>(), EVENT_SIZE);
    }

    #[test]
    fn events_parse() {
        let mut b = vec![0u8; EVENT_SIZE];
        b[0..8].copy_from_slice(&1234u64.to_ne_bytes());
        b[8..16].copy_from_slice(&131u64.to_ne_bytes());
        b[16..24].copy_from_slice(&((7u64 << 20) | 300).to_ne_bytes());
        b[24..28].copy_from_slice(&42u32.to_ne_bytes());
        b[28..32].copy_from_slice(&43u32.to_ne_bytes());
        b[32..36].copy_from_slice(&1000u32.to_ne_bytes());
        b[36..40].copy_from_slice(&GUARD_WHERE_VOLUME.to_ne_bytes());
        b[40..44].copy_from_slice(&0u32.to_ne_bytes());
        b[44..48].copy_from_slice(&10_000_001u32.to_ne_bytes());
        b[48..52].copy_from_slice(&0u32.to_ne_bytes());
        b[52..56].copy_from_slice(&(-1i32).to_ne_bytes());
        b[56] = 1;
        b[57] = GUARD_SRC_LSM;
        b[58] = GUARD_WHAT_PROJID;
        b[59] = 0;
        b[60..64].copy_from_slice(&0x401c_5820u32.to_ne_bytes());
        b[64..70].copy_from_slice(b"xfs_io");
        let e = GuardEvent::parse(&b).unwrap();
        assert_eq!(e.cgroup_id, 1234);
        assert_eq!(e.ino, 131);
        assert_eq!(e.st_dev, libc::makedev(7, 300));
        assert_eq!((e.pid, e.tid, e.uid), (42, 43, 1000));
        assert_eq!(e.place, Place::Volume);
        assert_eq!((e.projid, e.volume_projid), (0, 10_000_001));
        assert_eq!(e.errno, Some(libc::EPERM));
        assert_eq!(e.result, Outcome::Denied);
        assert_eq!(e.source, EventSource::Lsm);
        assert!(e.changes_project && !e.clears_inherit && !e.unreadable && !e.privileged);
        assert!(!e.joins_project);
        assert_eq!(e.comm, "xfs_io");
        assert_eq!(e.describe(), "set project ID 0 (the volume's is 10000001)");
        b[36..40].copy_from_slice(&GUARD_WHERE_WALK_LIMIT.to_ne_bytes());
        b[56] = GUARD_ALLOWED;
        b[52..56].copy_from_slice(&0i32.to_ne_bytes());
        let e = GuardEvent::parse(&b).unwrap();
        assert_eq!(
            (e.place, e.result, e.errno),
            (Place::Unknown, Outcome::Allowed, None)
        );
        b[36..40].copy_from_slice(&GUARD_WHERE_OUTSIDE.to_ne_bytes());
        b[58] = GUARD_WHAT_FOREIGN_PROJID;
        b[40..44].copy_from_slice(&77u32.to_ne_bytes());
        let e = GuardEvent::parse(&b).unwrap();
        assert_eq!(e.place, Place::Outside);
        assert!(e.joins_project && !e.changes_project);
        assert!(
            e.describe().contains("volume project ID 77"),
            "{}",
            e.describe()
        );
        assert!(GuardEvent::parse(&b[..79]).is_none());
    }
}
