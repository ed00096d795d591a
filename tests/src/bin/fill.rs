//! Writes until told to stop or until the kernel refuses, and prints
//! `{"written": N, "errno": E}` (`errno` null when everything was done).
//!
//! - `fill PATH BYTES [CHUNK]`: appends zeros to PATH, then fsyncs.
//! - `fill --files DIR COUNT`: creates empty files DIR/f0, DIR/f1, …
//!
//! A separate process so tests can run it under another uid: ext4 lets a
//! writer with CAP_SYS_RESOURCE (root) ignore project quotas.

use std::io::Write;

fn report(written: u64, errno: Option<i32>) {
    let errno = errno.map_or("null".to_string(), |e| e.to_string());
    println!("{{\"written\": {written}, \"errno\": {errno}}}");
}

fn files(dir: &str, count: u64) {
    let mut made = 0;
    let mut errno = None;
    while made < count {
        match std::fs::File::create(format!("{dir}/f{made}")) {
            Ok(_) => made += 1,
            Err(e) => {
                errno = e.raw_os_error();
                break;
            }
        }
    }
    report(made, errno);
}

fn bytes(path: &str, total: u64, chunk: usize) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {path}: {e}"));
    let buf = vec![0u8; chunk];
    let mut written = 0u64;
    let mut errno: Option<i32> = None;
    while written < total {
        let n = (total - written).min(chunk as u64) as usize;
        match f.write(&buf[..n]) {
            Ok(0) => break,
            Ok(k) => written += k as u64,
            Err(e) => {
                errno = e.raw_os_error();
                break;
            }
        }
    }
    if errno.is_none() {
        if let Err(e) = f.sync_all() {
            errno = e.raw_os_error();
        }
    }
    report(written, errno);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args[1] == "--files" {
        files(&args[2], args[3].parse().expect("COUNT"));
    } else {
        let total = args[2].parse().expect("BYTES");
        let chunk = args.get(3).map_or(1 << 20, |c| c.parse().expect("CHUNK"));
        bytes(&args[1], total, chunk);
    }
}
