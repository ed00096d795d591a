//! Directories a test makes under a base (the temp dir, /dev/shm) and
//! removes when it ends, passed or failed: a host run makes hundreds, and
//! /tmp must not keep them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh directory, removed with everything in it when dropped. Declare
/// it before whatever runs in it (a child exporter), so that it goes last.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// `<base>/<prefix>-<tag>-<pid>-<n>`, made afresh.
    pub fn new(base: &Path, prefix: &str, tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let d = base.join(format!(
            "{prefix}-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
        TempDir(d)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The path, no longer removed on drop: for an owner that removes it
    /// itself.
    pub fn keep(mut self) -> PathBuf {
        std::mem::take(&mut self.0)
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TempDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Empty once kept.
        if !self.0.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temp_dir_is_gone_after_its_scope_with_its_content() {
        let kept;
        {
            let d = TempDir::new(&std::env::temp_dir(), "prjq-temp-unit", "scope");
            std::fs::create_dir_all(d.join("a/b")).unwrap();
            std::fs::write(d.join("a/b/f"), b"x").unwrap();
            kept = d.to_path_buf();
            assert!(kept.is_dir());
        }
        assert!(!kept.exists());
        let kept = TempDir::new(&std::env::temp_dir(), "prjq-temp-unit", "kept").keep();
        assert!(kept.is_dir(), "a kept directory stays");
        std::fs::remove_dir(&kept).unwrap();
    }
}
