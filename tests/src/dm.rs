//! A filesystem on device-mapper over a loop device, whose disk a test can
//! make fail: every I/O an error (the `error` target), stalled
//! (`dmsetup suspend`), slow to write (the `delay` target), or healthy
//! again (the `linear` table back).
//!
//! XFS is made and mounted with `prjquota`; ext4 with `-O quota,project`
//! and `errors=remount-ro,prjquota`, so that an I/O error makes it
//! read-only, as a production ext4 does.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::fixture::{Fixture, FsCase};
use crate::sh;

pub struct DmDisk {
    pub mount: PathBuf,
    /// The device-mapper name (`/dev/mapper/<name>`).
    pub name: String,
    pub fs: &'static str,
    img: PathBuf,
    loop_dev: String,
    sectors: u64,
}

impl DmDisk {
    /// A `size`-byte filesystem of `case`'s type, mounted with project quota.
    pub fn new(case: &FsCase, tag: &str, size: u64) -> DmDisk {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("prjq-{}-{tag}-{}-{n}", case.name, std::process::id());
        // On the VM's scratch disk, as SmallFs.
        let base = crate::xfs_noquota_mount()
            .parent()
            .expect("the test mounts sit in a directory of the scratch disk")
            .to_path_buf();
        let img = base.join(format!("{name}.img"));
        let mount = base.join(&name);
        std::fs::create_dir_all(&mount).expect("mount point");
        let mkfs = match case.name {
            "xfs" => "mkfs.xfs -q -f",
            _ => "mkfs.ext4 -q -F -O quota,project -I 256",
        };
        sh(&format!("truncate -s {size} {}", img.display()));
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&img)
            .output()
            .expect("run losetup");
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let loop_dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let disk = DmDisk {
            mount,
            name,
            fs: case.name,
            img,
            loop_dev,
            sectors: size / 512,
        };
        sh(&format!(
            // One dmsetup create at a time: the first ones of a boot race
            // to make /dev/mapper/control ("mknod failed: File exists").
            "set -e; flock /tmp/prjquota-dmsetup.lock dmsetup create {n} --table '{t}'; \
             udevadm settle 2>/dev/null || true; {mkfs} {dev} >/dev/null",
            n = disk.name,
            t = disk.linear(),
            dev = disk.dev()
        ));
        disk.mount_with(true);
        disk
    }

    pub fn dev(&self) -> String {
        format!("/dev/mapper/{}", self.name)
    }

    fn linear(&self) -> String {
        format!("0 {} linear {} 0", self.sectors, self.loop_dev)
    }

    /// The options a production mount has, with or without `prjquota`.
    fn options(&self, prjquota: bool) -> String {
        let q = if prjquota { "prjquota" } else { "noquota" };
        match self.fs {
            "xfs" => q.to_string(),
            // ext4 has no `noquota` for projects: leaving `prjquota` out
            // keeps accounting (the quota feature) without enforcement.
            _ if prjquota => "errors=remount-ro,prjquota".into(),
            _ => "errors=remount-ro".into(),
        }
    }

    pub fn mount_with(&self, prjquota: bool) {
        sh(&format!(
            "mount -o {} {} {}",
            self.options(prjquota),
            self.dev(),
            self.mount.display()
        ));
    }

    pub fn umount(&self) {
        sh(&format!("umount {}", self.mount.display()));
    }

    /// Swaps the table for `table` without unmounting. Suspended without
    /// freezing the filesystem first: a shut-down XFS cannot be frozen, and
    /// the resume would freeze it.
    fn swap(&self, table: &str) {
        sh(&format!(
            "set -e; dmsetup load {n} --table '{table}'; dmsetup suspend --nolockfs {n}; \
             dmsetup resume {n}",
            n = self.name
        ));
    }

    /// Every I/O fails from now on. Then a write and a sync make the
    /// filesystem notice: XFS shuts down, ext4 remounts read-only.
    /// Waits (at most 30 s) until the filesystem refuses a new file, as it
    /// does once shut down (EIO) or read-only (EROFS): ext4 turns read-only
    /// only when a change starts after its journal aborted.
    pub fn fail(&self) {
        self.swap(&format!("0 {} error", self.sectors));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let probe = self.mount.join(format!(".fault-{}", crate::nomad::uuid()));
            match std::fs::write(&probe, b"x") {
                Err(e) if matches!(e.raw_os_error(), Some(libc::EIO | libc::EROFS)) => return,
                _ => {}
            }
            let _ = Command::new("sync").arg("-f").arg(&self.mount).status();
            assert!(
                std::time::Instant::now() < deadline,
                "{} still takes new files 30 s after its disk failed",
                self.fs
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// The disk answers again; a remount (log replay) recovers the
    /// filesystem.
    /// ext4 is checked first (`e2fsck -fy`), as its runbook says: it
    /// recorded the errors, and keeps refusing changes until checked.
    pub fn heal_and_remount(&self) {
        self.swap(&self.linear());
        self.umount();
        if self.fs != "xfs" {
            // 0: clean, 1: errors corrected; anything else fails the test.
            sh(&format!(
                "e2fsck -fy {} >/dev/null 2>&1 || [ $? -eq 1 ]",
                self.dev()
            ));
        }
        self.mount_with(true);
    }

    /// Every write (and flush) takes `ms` milliseconds longer from now on
    /// (the `delay` target); reads are not delayed. [`DmDisk::undelay`]
    /// ends it.
    pub fn delay_writes(&self, ms: u32) {
        self.swap(&format!(
            "0 {s} delay {d} 0 0 {d} 0 {ms}",
            s = self.sectors,
            d = self.loop_dev
        ));
    }

    /// Writes take their own time again.
    pub fn undelay(&self) {
        self.swap(&self.linear());
    }

    /// I/O is held (queued) until [`DmDisk::resume`]; the filesystem is
    /// not frozen first (`--nolockfs`), as a stalled cloud disk is not.
    pub fn suspend(&self) {
        sh(&format!("dmsetup suspend --nolockfs {}", self.name));
    }

    pub fn resume(&self) {
        sh(&format!("dmsetup resume {}", self.name));
    }

    pub fn remount_ro(&self, ro: bool) {
        sh(&format!(
            "mount -o remount,{} {}",
            if ro { "ro" } else { "rw" },
            self.mount.display()
        ));
    }

    /// The power is cut: the filesystem shuts down without writing its
    /// journal (what no commit made durable is lost, as after a power loss;
    /// dirty pages are never written), then is mounted again, replaying
    /// what was committed.
    pub fn power_cut(&self) {
        sh(&format!(
            "set -e; xfs_io -x -c shutdown {m}; umount {m}",
            m = self.mount.display()
        ));
        self.mount_with(true);
    }

    /// A node whose volumes directory is on this disk and whose plugin
    /// directory is on the shared XFS, as Nomad's are apart: a failing
    /// volumes disk must not take the plugin's executable with it.
    pub fn fixture(&self, tag: &str) -> Fixture {
        self.fixture_with_plugin(tag, &crate::bin("prjquota"))
    }

    /// [`DmDisk::fixture`] with `plugin` as the node's plugin.
    pub fn fixture_with_plugin(&self, tag: &str, plugin: &Path) -> Fixture {
        let mut f = Fixture::with_plugin(&crate::xfs_mount(), &format!("xfs-{tag}"), plugin);
        f.node.volumes_dir = self.mount.join(format!("volumes-{tag}"));
        f
    }

    pub fn path(&self) -> &Path {
        &self.mount
    }
}

impl Drop for DmDisk {
    fn drop(&mut self) {
        let _ = Command::new("dmsetup")
            .args(["resume", &self.name])
            .status();
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = Command::new("dmsetup")
            .args(["remove", "--retry", &self.name])
            .status();
        let _ = Command::new("losetup")
            .args(["-d", &self.loop_dev])
            .status();
        let _ = std::fs::remove_dir(&self.mount);
        let _ = std::fs::remove_file(&self.img);
    }
}
