//! Host unit tests of the crate's shared parts: pure logic and the C/Rust
//! layout contract. Write telemetry's own are in `write_telemetry/tests.rs`.

use std::collections::HashMap;

use super::*;
use crate::raw::{RawCounters, RootKey};

#[test]
fn errno_buckets() {
    assert_eq!(ErrnoBucket::from_errno(libc::ENOSPC), ErrnoBucket::Enospc);
    assert_eq!(ErrnoBucket::from_errno(libc::EDQUOT), ErrnoBucket::Edquot);
    assert_eq!(ErrnoBucket::from_errno(libc::EIO), ErrnoBucket::Eio);
    assert_eq!(ErrnoBucket::from_errno(libc::EROFS), ErrnoBucket::Erofs);
    for other in [libc::EPERM, libc::EFBIG, libc::EINTR, libc::EAGAIN, 0, 4095] {
        assert_eq!(
            ErrnoBucket::from_errno(other),
            ErrnoBucket::Other,
            "{other}"
        );
    }
    let labels: Vec<&str> = ErrnoBucket::ALL.iter().map(|b| b.label()).collect();
    assert_eq!(labels, ["ENOSPC", "EDQUOT", "EIO", "EROFS", "other"]);
    // ALL is in index order: errors[i] is ALL[i].
    for (i, b) in ErrnoBucket::ALL.iter().enumerate() {
        assert_eq!(b.index(), i);
    }
}

#[test]
fn errno_values_in_kernel_h_match_libc() {
    let h = defines(include_str!("bpf/kernel.h"));
    assert_eq!(h["EIO"], libc::EIO as u64);
    assert_eq!(h["EAGAIN"], libc::EAGAIN as u64);
    assert_eq!(h["ENOSPC"], libc::ENOSPC as u64);
    assert_eq!(h["EROFS"], libc::EROFS as u64);
    assert_eq!(h["EDQUOT"], libc::EDQUOT as u64);
    assert_eq!(h["IOCB_NOWAIT"], libc::RWF_NOWAIT as u64);
    assert_eq!(h["XFS_SUPER_MAGIC"], 0x5846_5342);
}

#[test]
fn kernel_dev_encoding() {
    // Userspace st_dev (glibc makedev) vs the kernel's MKDEV.
    let cases: [(u32, u32, u64, u64); 6] = [
        (0, 0, 0, 0),
        (7, 0, 0x700, 0x70_0000),       // loop0
        (8, 17, 0x811, 0x80_0011),      // sdb1
        (0, 45, 0x2d, 0x2d),            // anonymous (tmpfs, overlay)
        (259, 1, 0x10301, 0x1030_0001), // nvme0n1p1: major > 255
        (7, 300, 0x10_072c, 0x70_012c), // loop300: minor > 255
    ];
    for (major, minor, st_dev, kdev) in cases {
        assert_eq!(libc::makedev(major, minor), st_dev, "{major}:{minor}");
        assert_eq!(kernel_dev(st_dev), Some(kdev), "{major}:{minor}");
    }
    // Beyond the kernel's 12-bit major / 20-bit minor: no kernel dev_t.
    assert_eq!(kernel_dev(libc::makedev(4096, 0)), None);
    assert_eq!(kernel_dev(libc::makedev(0, 1 << 20)), None);
}

#[test]
fn mode_parses() {
    assert_eq!("off".parse::<Mode>(), Ok(Mode::Off));
    assert_eq!("Auto".parse::<Mode>(), Ok(Mode::Auto));
    assert_eq!("required".parse::<Mode>(), Ok(Mode::Required));
    assert!("on"
        .parse::<Mode>()
        .unwrap_err()
        .contains("off, auto or required"));
    for m in [Mode::Off, Mode::Auto, Mode::Required] {
        assert_eq!(m.to_string().parse::<Mode>(), Ok(m));
    }
    assert_eq!(Mode::default(), Mode::Auto);
    assert!(WriteTelemetry::start(Mode::Off, &LoadOptions::default())
        .unwrap()
        .is_none());
}

#[test]
fn counters_arithmetic() {
    let mut a = VolumeCounters::default();
    a.add(&RawCounters {
        bytes: 10,
        ops: 2,
        errors: [1, 0, 0, 0, 3],
    });
    a.add(&RawCounters {
        bytes: 5,
        ops: 1,
        errors: [1, 1, 0, 0, 0],
    });
    assert_eq!(a.written_bytes, 15);
    assert_eq!(a.write_ops, 3);
    assert_eq!(a.errors(ErrnoBucket::Enospc), 2);
    assert_eq!(a.errors(ErrnoBucket::Other), 3);
    assert_eq!(a.errors_total(), 6);
    let d = a.since(&VolumeCounters {
        written_bytes: 5,
        write_ops: 1,
        errors: [1, 0, 0, 0, 0],
    });
    assert_eq!((d.written_bytes, d.write_ops, d.errors_total()), (10, 2, 5));
    assert_eq!(a.errors_by_bucket().count(), 5);
}

/// `#define NAME VALUE` lines of a C header.
pub(crate) fn defines(header: &str) -> HashMap<String, u64> {
    header
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            if w.next()? != "#define" {
                return None;
            }
            let name = w.next()?.to_string();
            let value = w.next()?;
            let v = if let Some(hex) = value.strip_prefix("0x") {
                u64::from_str_radix(hex, 16).ok()?
            } else {
                value.parse().ok()?
            };
            Some((name, v))
        })
        .collect()
}

#[test]
fn header_matches_rust() {
    let h = defines(include_str!("bpf/shared.h"));
    let expect: [(&str, u64); 23] = [
        ("BUCKET_ENOSPC", raw::BUCKET_ENOSPC as u64),
        ("BUCKET_EDQUOT", raw::BUCKET_EDQUOT as u64),
        ("BUCKET_EIO", raw::BUCKET_EIO as u64),
        ("BUCKET_EROFS", raw::BUCKET_EROFS as u64),
        ("BUCKET_OTHER", raw::BUCKET_OTHER as u64),
        ("N_BUCKETS", raw::N_BUCKETS as u64),
        ("UNATTR_OTHER_FS", raw::UNATTR_OTHER_FS as u64),
        ("UNATTR_OUTSIDE", raw::UNATTR_OUTSIDE as u64),
        ("UNATTR_WALK_LIMIT", raw::UNATTR_WALK_LIMIT as u64),
        ("UNATTR_MAP_FULL", raw::UNATTR_MAP_FULL as u64),
        ("N_UNATTR", raw::N_UNATTR as u64),
        ("GEN_RENAMES", raw::GEN_RENAMES as u64),
        ("GEN_ROOTS", raw::GEN_ROOTS as u64),
        ("GEN_CACHE_ON", raw::GEN_CACHE_ON as u64),
        ("N_GEN", raw::N_GEN as u64),
        ("UNFINISHED_DIRECT", raw::UNFINISHED_DIRECT as u64),
        ("UNFINISHED_BUFFERED", raw::UNFINISHED_BUFFERED as u64),
        ("LOST_BUFFERED", raw::LOST_BUFFERED as u64),
        ("N_UNFINISHED", raw::N_UNFINISHED as u64),
        ("MAX_DEPTH", raw::MAX_DEPTH as u64),
        ("MAX_ROOTS", raw::MAX_ROOTS as u64),
        ("MAX_VOLUMES", raw::MAX_VOLUMES as u64),
        ("MAX_DEVS", raw::MAX_DEVS as u64),
    ];
    for (name, value) in expect {
        assert_eq!(h.get(name), Some(&value), "{name} in shared.h");
    }
    assert_eq!(std::mem::size_of::<RootKey>(), 16);
    assert_eq!(std::mem::size_of::<RawCounters>(), 8 * (2 + raw::N_BUCKETS));
}

#[test]
fn skipped_runs_are_unknown_where_the_kernel_did_not_fill_them() {
    use aya_obj::generated::bpf_prog_info;
    let mut info = super::raw::zeroed_prog_info();
    info.recursion_misses = 7;
    let whole = std::mem::size_of::<bpf_prog_info>();
    assert_eq!(crate::loader::recursion_misses(&info, whole), Some(7));
    // Linux 5.10 fills the struct up to run_cnt: unknown, not zero.
    let up_to_run_cnt = std::mem::offset_of!(bpf_prog_info, run_cnt) + 8;
    assert_eq!(crate::loader::recursion_misses(&info, up_to_run_cnt), None);
}
