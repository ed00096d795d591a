//! `fill PATH BYTES [CHUNK]`: writes zeros to PATH until BYTES are written or
//! the kernel refuses, then fsyncs, and prints `{"written": N, "errno": E}`
//! (`errno` null when everything was written). A separate process so tests
//! can run it under another uid, without CAP_SYS_RESOURCE.

use std::io::Write;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = &args[1];
    let total: u64 = args[2].parse().expect("BYTES");
    let chunk: usize = args.get(3).map_or(1 << 20, |c| c.parse().expect("CHUNK"));
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
    let errno = errno.map_or("null".to_string(), |e| e.to_string());
    println!("{{\"written\": {written}, \"errno\": {errno}}}");
}
