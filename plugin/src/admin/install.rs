//! `prjquota install --plugin-dir DIR`: puts this executable into Nomad's
//! plugin directory as `prjquota`, what the packages' scripts run and what
//! docs/install.md gives for a hand install.
//!
//! Nomad (client/fingerprint/dynamic_host_volumes.go, helper.FindExecutableFiles)
//! reads the plugin directory with one `ReadDir`, not recursively, and
//! takes every entry that is not a directory and has an execute bit as a
//! plugin, dot-files included; it then `lstat`s each entry, and a single
//! entry that vanished in between (ENOENT) fails the whole fingerprint, so
//! that the agent starts with no external plugin at all. At create and
//! delete it runs `<dir>/<plugin id>`, refusing a file without an execute
//! bit. So nothing but the final name may appear in that directory, not
//! even for a moment, and that name must always be a complete executable:
//!
//! - the new plugin is written under a temporary name in the plugin
//!   directory's PARENT (Nomad's data_dir by default, which no fingerprint
//!   reads), on the same filesystem, already with its final mode 0755,
//!   flushed with fsync;
//! - then renamed over `<dir>/prjquota`: one step in which the old plugin
//!   is replaced by the new whole one, executable from its first instant
//!   under that name, so a create or delete Nomad starts meanwhile runs one
//!   or the other, never a partial file nor a non-executable one;
//! - then both directories are fsynced, so a crash after the install does
//!   not bring the old plugin (or none) back.
//!
//! A plugin directory that is a mount point of its own cannot be renamed
//! into from its parent (EXDEV); there the temporary file is a dot-file in
//! the plugin directory itself, as the packages did before, which only an
//! agent (re)started in those milliseconds can trip over.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The plugin's name in Nomad's directory: its plugin ID.
pub const PLUGIN_NAME: &str = "prjquota";

/// The mode the plugin has from its first instant under its final name.
const MODE: u32 = 0o755;

/// Where the temporary copy is written: the plugin directory's parent when
/// it is on the same filesystem, else the plugin directory itself.
pub fn staging_dir(plugin_dir: &Path) -> Result<PathBuf> {
    let dir_dev = fs::metadata(plugin_dir)
        .with_context(|| format!("{} (Nomad's host_volume_plugin_dir)", plugin_dir.display()))?
        .dev();
    let parent = match plugin_dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => return Ok(plugin_dir.to_path_buf()),
    };
    match fs::metadata(&parent) {
        Ok(m) if m.dev() == dir_dev => Ok(parent),
        _ => Ok(plugin_dir.to_path_buf()),
    }
}

/// Copies `src` to `<plugin_dir>/prjquota` as the module docs say, and
/// returns the installed path.
pub fn install(src: &Path, plugin_dir: &Path) -> Result<PathBuf> {
    if !plugin_dir.is_dir() {
        bail!(
            "{} is not a directory: pass Nomad's client host_volume_plugin_dir (create it \
             first if Nomad has not)",
            plugin_dir.display()
        );
    }
    let target = plugin_dir.join(PLUGIN_NAME);
    let staging = staging_dir(plugin_dir)?;
    let tmp = staging.join(format!(".prjquota-plugin.{}.tmp", std::process::id()));
    let result = write_synced(src, &tmp).and_then(|()| {
        fs::rename(&tmp, &target)
            .with_context(|| format!("rename {} to {}", tmp.display(), target.display()))
    });
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    for d in [plugin_dir, staging.as_path()] {
        File::open(d)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("fsync the directory {}", d.display()))?;
    }
    Ok(target)
}

/// `src`'s bytes into a new file `tmp` of mode 0755 (whatever the umask),
/// flushed to the disk.
fn write_synced(src: &Path, tmp: &Path) -> Result<()> {
    let bytes = fs::read(src).with_context(|| format!("read {}", src.display()))?;
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(MODE)
        .open(tmp)
        .with_context(|| format!("create {}", tmp.display()))?;
    f.set_permissions(fs::Permissions::from_mode(MODE))
        .with_context(|| format!("chmod {MODE:o} {}", tmp.display()))?;
    f.write_all(&bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("write {}", tmp.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("prjquota-install-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("host_volume_plugins")).unwrap();
        d
    }

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn installs_0755_and_leaves_nothing_else_anywhere() {
        let d = scratch("once");
        let plugins = d.join("host_volume_plugins");
        let src = d.join("src");
        fs::write(&src, b"#!/bin/sh\necho new\n").unwrap();
        fs::set_permissions(&src, fs::Permissions::from_mode(0o600)).unwrap();
        let installed = install(&src, &plugins).unwrap();
        assert_eq!(installed, plugins.join("prjquota"));
        assert_eq!(mode(&installed), 0o755);
        assert_eq!(fs::read(&installed).unwrap(), fs::read(&src).unwrap());
        let mut left: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["host_volume_plugins", "src"]);
        let in_plugins: Vec<_> = fs::read_dir(&plugins).unwrap().collect();
        assert_eq!(in_plugins.len(), 1);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn stages_in_the_parent_on_the_same_filesystem() {
        let d = scratch("staging");
        let plugins = d.join("host_volume_plugins");
        assert_eq!(staging_dir(&plugins).unwrap(), d);
        assert!(staging_dir(&d.join("missing")).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn refuses_a_missing_plugin_dir_by_name() {
        let d = scratch("missing");
        let e = install(&d.join("src"), &d.join("nope")).unwrap_err();
        assert!(format!("{e:#}").contains("host_volume_plugin_dir"), "{e:#}");
        fs::remove_dir_all(&d).unwrap();
    }

    /// What Nomad's fingerprint and its create see while the plugin is
    /// upgraded, over and over: one entry, `prjquota`, always executable
    /// and always one whole version.
    #[test]
    fn nomad_sees_only_a_whole_executable_prjquota_during_upgrades() {
        let d = scratch("race");
        let plugins = d.join("host_volume_plugins");
        let (old, new) = (d.join("old"), d.join("new"));
        fs::write(&old, vec![b'o'; 100_000]).unwrap();
        fs::write(&new, vec![b'n'; 300_000]).unwrap();
        install(&old, &plugins).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (stop, plugins) = (stop.clone(), plugins.clone());
            std::thread::spawn(move || {
                let mut looks = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for e in fs::read_dir(&plugins).unwrap() {
                        let e = e.unwrap();
                        assert_eq!(e.file_name(), "prjquota", "a second entry in Nomad's dir");
                        let m = fs::symlink_metadata(e.path()).expect("lstat after readdir");
                        assert_eq!(m.permissions().mode() & 0o111, 0o111);
                        let content = fs::read(e.path()).unwrap();
                        assert!(
                            content == vec![b'o'; 100_000] || content == vec![b'n'; 300_000],
                            "a partial plugin of {} bytes",
                            content.len()
                        );
                    }
                    looks += 1;
                }
                looks
            })
        };
        for i in 0..200 {
            install(if i % 2 == 0 { &new } else { &old }, &plugins).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        let looks = watcher.join().expect("the watcher saw what Nomad must not");
        assert!(looks > 0);
        fs::remove_dir_all(&d).unwrap();
    }
}
