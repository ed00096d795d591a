//! Reading a file whose content decides what a root process does (the node
//! configuration, the exporter's web config and the certificates it names).
//!
//! Opened without following a link and without blocking (a FIFO in its place
//! would hold the reader forever), and taken only as a regular file owned by
//! root (or by the user the process runs as) that neither group nor others
//! can write, and no larger than its kind ever is.

use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Why a file was not taken.
#[derive(Debug)]
pub enum Refused {
    /// It could not be read.
    Read(io::Error),
    /// It is not safe to take settings from; the reason and the fix.
    Unsafe(String),
}

/// The file's bytes, or `None` when there is none. `stakes` says what whoever
/// can write it decides ("chooses the project IDs ..."), for the message.
pub fn read(path: &Path, max_bytes: u64, stakes: &str) -> Result<Option<Vec<u8>>, Refused> {
    let shown_path = path.display();
    // std's open, with the flags nix would pass: safe, and no descriptor
    // changes hands through a raw integer.
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(Refused::Unsafe(format!(
                "it is a symlink, and none is followed there; put the file itself in \
                 its place (cp --remove-destination \"$(readlink -f {shown_path})\" {shown_path})"
            )))
        }
        Err(e) => return Err(Refused::Read(e)),
    };
    let st = file.metadata().map_err(Refused::Read)?;
    let ft = st.file_type();
    if !ft.is_file() {
        let what = if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_dir() {
            "a directory"
        } else if ft.is_socket() {
            "a socket"
        } else if ft.is_char_device() || ft.is_block_device() {
            "a device"
        } else {
            "something else"
        };
        return Err(Refused::Unsafe(format!(
            "it is {what}, not a regular file; replace it with a regular file, or remove it \
             if it is not needed"
        )));
    }
    // Root in production; the owner of a test's files on a developer's host.
    let me = nix::unistd::geteuid().as_raw();
    if st.uid() != 0 && st.uid() != me {
        return Err(Refused::Unsafe(format!(
            "it is owned by uid {}, and whoever can write it {stakes}: chown root:root {shown_path}",
            st.uid()
        )));
    }
    if st.mode() & 0o022 != 0 {
        return Err(Refused::Unsafe(format!(
            "it is writable by {} (mode {:04o}), and whoever can write it {stakes}: chmod go-w {shown_path}",
            if st.mode() & 0o002 != 0 {
                "every user"
            } else {
                "its group"
            },
            st.mode() & 0o7777
        )));
    }
    let mut bytes = Vec::new();
    file.take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(Refused::Read)?;
    if bytes.len() as u64 > max_bytes {
        return Err(Refused::Unsafe(format!(
            "it is larger than {max_bytes} bytes, which no such file is; check what was written there"
        )));
    }
    Ok(Some(bytes))
}
