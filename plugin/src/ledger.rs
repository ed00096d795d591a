//! The ledger: what admission and the project-ID allocator need from the
//! registry, in one small file, so that a create reads O(1) of it whatever
//! the number of volumes.
//!
//! `<volumes dir>/.prjquota/ledger` holds the sum of every record's
//! `provisioned_bytes`, the number of records, the lowest project ID above
//! every reserved or recorded one, and whether any reservation lacks its
//! record, and when the reservations and records last changed. It is a cache: the records and reservations stay the truth, and
//! the ledger is rebuilt from them whenever it is missing or unreadable.
//!
//! Why it can be trusted without an fsync of its own (the protocol lives in
//! [`crate::admission::Book`], under the allocation lock): an operation that
//! changes a promise or a reservation first removes the ledger, then makes
//! its changes, and writes a new ledger (temp file, rename) only once all of
//! them succeeded. XFS and ext4 with a journal commit metadata in order, so
//! after a crash the disk holds a prefix of those steps: the old ledger with
//! none of the changes, no ledger, or the new name. A new name whose content
//! never reached the disk is empty or zeroed, and fails the checksum. Where
//! the journal does not order metadata the ledger is not used at all
//! ([`crate::registry::Registry::follow_journal_of`]).

/// The figures the ledger keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ledger {
    /// Sum of `provisioned_bytes` over every record, whatever its state.
    pub promised: u64,
    /// Number of records.
    pub volumes: u64,
    /// One more than the highest project ID any record or reservation of
    /// this registry holds (0 when there is none): no ID at or above it is
    /// reserved here.
    pub above: u64,
    /// Some reservation has no record that names it (a create or delete
    /// stopped between the two): creates then list the reservations, to
    /// take back their own.
    pub orphans: bool,
    /// When the reservations' and the records' directories last changed,
    /// as the ledger was written (nanoseconds of their mtimes): a
    /// reservation or record written since by anything but this protocol
    /// (an older plugin after a downgrade, a hand, a restore from backup)
    /// makes the ledger stale.
    pub ids_changed: u64,
    pub records_changed: u64,
}

const MAGIC: &str = "prjquota-ledger 1";

impl Ledger {
    /// The lowest project ID no reservation of this registry holds or
    /// exceeds, when it is in `range`.
    pub fn next_unreserved(&self, range: &std::ops::RangeInclusive<u32>) -> Option<u32> {
        let above = u32::try_from(self.above).ok()?;
        Some(above.max(*range.start())).filter(|p| range.contains(p))
    }

    /// A record now promises `bytes` with project `pid`: a new one, or one
    /// that promised `was` bytes.
    pub fn recorded(&mut self, pid: u32, bytes: u64, was: Option<u64>) {
        match was {
            Some(old) => self.promised = self.promised.saturating_sub(old).saturating_add(bytes),
            None => {
                self.promised = self.promised.saturating_add(bytes);
                self.volumes += 1;
            }
        }
        self.above = self.above.max(u64::from(pid) + 1);
    }

    /// A record promising `bytes` is gone.
    pub fn unrecorded(&mut self, bytes: u64) {
        self.promised = self.promised.saturating_sub(bytes);
        self.volumes = self.volumes.saturating_sub(1);
    }

    /// The file's content: a line per figure and a checksum of them.
    pub fn encode(&self) -> String {
        let body = format!(
            "{MAGIC}\npromised {}\nvolumes {}\nabove {}\norphans {}\nids_changed {}\nrecords_changed {}\n",
            self.promised, self.volumes, self.above, self.orphans as u8, self.ids_changed, self.records_changed
        );
        let sum = fnv1a(body.as_bytes());
        format!("{body}sum {sum:016x}\n")
    }

    /// The figures of a ledger file, or `None` when it is not one written
    /// whole by [`Ledger::encode`] (torn, zeroed, empty or foreign).
    pub fn decode(text: &[u8]) -> Option<Ledger> {
        let text = std::str::from_utf8(text).ok()?;
        let (body, sum_line) = text.strip_suffix('\n')?.rsplit_once('\n')?;
        let body = format!("{body}\n");
        let sum = u64::from_str_radix(sum_line.strip_prefix("sum ")?, 16).ok()?;
        if sum != fnv1a(body.as_bytes()) {
            return None;
        }
        let mut lines = body.lines();
        if lines.next()? != MAGIC {
            return None;
        }
        let mut field = |name: &str| -> Option<u64> {
            lines
                .next()?
                .strip_prefix(name)?
                .strip_prefix(' ')?
                .parse()
                .ok()
        };
        let l = Ledger {
            promised: field("promised")?,
            volumes: field("volumes")?,
            above: field("above")?,
            orphans: match field("orphans")? {
                0 => false,
                1 => true,
                _ => return None,
            },
            ids_changed: field("ids_changed")?,
            records_changed: field("records_changed")?,
        };
        lines.next().is_none().then_some(l)
    }
}

/// 64-bit FNV-1a: enough to tell a whole write from a torn or zeroed one
/// (the registry is root's alone; nothing forges it).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Ledger {
        Ledger {
            promised: 12 << 30,
            volumes: 3,
            above: 1_000_000_003,
            orphans: true,
            ids_changed: 1_764_000_000_123_456_789,
            records_changed: 1_764_000_001_000_000_001,
        }
    }

    #[test]
    fn a_ledger_reads_back_what_was_written() {
        for l in [sample(), Ledger::default()] {
            assert_eq!(Ledger::decode(l.encode().as_bytes()), Some(l));
        }
    }

    #[test]
    fn a_torn_zeroed_or_altered_ledger_is_no_ledger() {
        let text = sample().encode();
        let bytes = text.as_bytes();
        for cut in 0..bytes.len() {
            assert_eq!(Ledger::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        assert_eq!(Ledger::decode(&vec![0u8; bytes.len()]), None);
        let altered = text.replace("volumes 3", "volumes 4");
        assert_eq!(Ledger::decode(altered.as_bytes()), None);
        let mut extra = text.clone();
        extra.push_str("more\n");
        assert_eq!(Ledger::decode(extra.as_bytes()), None);
    }

    #[test]
    fn the_next_unreserved_id_stays_in_the_range() {
        let over = |above| Ledger {
            above,
            ..Ledger::default()
        };
        let range = 100..=199;
        assert_eq!(over(0).next_unreserved(&range), Some(100));
        assert_eq!(over(150).next_unreserved(&range), Some(150));
        assert_eq!(over(199).next_unreserved(&range), Some(199));
        assert_eq!(over(200).next_unreserved(&range), None);
        let past_every_id = over(u64::from(u32::MAX) + 1);
        assert_eq!(past_every_id.next_unreserved(&(0..=u32::MAX)), None);
    }

    #[test]
    fn a_ledger_counts_new_grown_and_removed_promises() {
        let mut l = Ledger::default();
        l.recorded(10, 100, None);
        l.recorded(12, 50, None);
        l.recorded(10, 300, Some(100));
        assert_eq!((l.promised, l.volumes, l.above), (350, 2, 13));
        l.unrecorded(50);
        assert_eq!((l.promised, l.volumes, l.above), (300, 1, 13));
    }
}
