//! The plugin's `prjquota.toml`, read off the caller's thread: the plugin
//! directory may sit on storage that stops answering, and a read stuck
//! there must cost only what needs the file, never a start, a scrape or
//! the guard's sync.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use prjquota_core::config::{self, Config};

/// What a bounded read gave.
#[derive(Debug)]
pub enum Read {
    Done(Result<Config, String>),
    /// No answer within the bound: the read goes on on its own thread.
    Stuck,
}

/// Reads `dir`'s prjquota.toml on a thread of its own, waiting at most
/// `within` for it.
pub fn load_within(dir: &Path, within: Duration) -> Read {
    let (tx, rx) = mpsc::channel();
    let dir: PathBuf = dir.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("plugin-config".into())
        .spawn(move || {
            let _ = tx.send(config::load(&dir).map_err(|e| format!("{e:#}")));
        });
    if let Err(e) = spawned {
        return Read::Done(Err(format!("cannot start a thread to read it: {e}")));
    }
    match rx.recv_timeout(within) {
        Ok(r) => Read::Done(r),
        Err(_) => Read::Stuck,
    }
}
