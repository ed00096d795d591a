//! Checks that the VM runner gave us the filesystems it promised.

use std::path::Path;

const XFS_SUPER_MAGIC: i64 = 0x5846_5342;
const EXT4_SUPER_MAGIC: i64 = 0xEF53;

fn fs_type(path: &Path) -> i64 {
    let st =
        nix::sys::statfs::statfs(path).unwrap_or_else(|e| panic!("statfs {}: {e}", path.display()));
    st.filesystem_type().0 as i64
}

/// Mount options of the mount point `path`, from /proc/mounts.
fn mount_options(path: &Path) -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let line = mounts
        .lines()
        .rfind(|l| l.split(' ').nth(1) == Some(path.to_str().unwrap()))
        .unwrap_or_else(|| panic!("{} is not a mount point:\n{mounts}", path.display()));
    line.split(' ')
        .nth(3)
        .unwrap()
        .split(',')
        .map(str::to_owned)
        .collect()
}

#[test]
fn xfs_mount_enforces_project_quota() {
    let mnt = prjquota_vmtests::xfs_mount();
    assert_eq!(fs_type(&mnt), XFS_SUPER_MAGIC);
    let opts = mount_options(&mnt);
    assert!(opts.iter().any(|o| o == "prjquota"), "{opts:?}");
}

#[test]
fn xfs_noquota_mount_has_no_project_quota() {
    let mnt = prjquota_vmtests::xfs_noquota_mount();
    assert_eq!(fs_type(&mnt), XFS_SUPER_MAGIC);
    let opts = mount_options(&mnt);
    assert!(
        !opts
            .iter()
            .any(|o| o.contains("prjquota") || o.contains("pquota")),
        "{opts:?}"
    );
}

#[test]
fn ext4_mount_has_project_quota() {
    let mnt = prjquota_vmtests::ext4_mount();
    assert_eq!(fs_type(&mnt), EXT4_SUPER_MAGIC);
    let opts = mount_options(&mnt);
    assert!(opts.iter().any(|o| o == "prjquota"), "{opts:?}");
}
