//! The filesystems prjquota runs on, told apart by their `statfs(2)` magic:
//! the plugin refuses any other and words its errors by it, the exporter's
//! eBPF self-test picks the hook a buffered write takes on it.

use std::fmt;

const XFS_SUPER_MAGIC: i64 = 0x5846_5342;
const EXT4_SUPER_MAGIC: i64 = 0xEF53;

/// Filesystem type, from the statfs magic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsType {
    Xfs,
    Ext4,
    Other(i64),
}

impl FsType {
    pub fn from_magic(magic: i64) -> FsType {
        match magic {
            XFS_SUPER_MAGIC => FsType::Xfs,
            EXT4_SUPER_MAGIC => FsType::Ext4,
            m => FsType::Other(m),
        }
    }

    /// The name used in records and metric labels.
    pub fn name(&self) -> &'static str {
        match self {
            FsType::Xfs => "xfs",
            FsType::Ext4 => "ext4",
            FsType::Other(_) => "other",
        }
    }
}

impl fmt::Display for FsType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FsType::Xfs => f.write_str("XFS"),
            FsType::Ext4 => f.write_str("ext4"),
            FsType::Other(m) => write!(f, "a filesystem with magic {m:#x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FsType;

    #[test]
    fn magic_numbers_name_the_filesystem() {
        assert_eq!(FsType::from_magic(0x5846_5342), FsType::Xfs);
        assert_eq!(FsType::from_magic(0xEF53), FsType::Ext4);
        assert_eq!(FsType::from_magic(0x0102_1994).name(), "other");
        assert_eq!(
            FsType::from_magic(0x0102_1994).to_string(),
            "a filesystem with magic 0x1021994"
        );
    }
}
