//! A test-only pause for the race tests: with the `fault-injection`
//! feature (the builds the VM tests run as attackers' targets, never a
//! release), [`pause_before_open`] stops the process right before it opens
//! the entry named by `PRJQUOTA_PAUSE_NAME`, so that a test can swap the
//! entry inside the window every time rather than once in a million tries:
//! it creates `$PRJQUOTA_PAUSE_DIR/paused` and waits (at most two minutes)
//! for `$PRJQUOTA_PAUSE_DIR/go`, then removes both. Once per process: the
//! name's later opens go on. Without the feature it compiles to nothing.

/// Pauses before opening `name`, when the environment asks for it.
#[inline(always)]
pub fn pause_before_open(name: &std::ffi::CStr) {
    #[cfg(feature = "fault-injection")]
    pause(name);
    #[cfg(not(feature = "fault-injection"))]
    let _ = name;
}

#[cfg(feature = "fault-injection")]
fn pause(name: &std::ffi::CStr) {
    use std::path::PathBuf;
    use std::time::{Duration, Instant};
    let (Some(dir), Some(want)) = (
        std::env::var_os("PRJQUOTA_PAUSE_DIR"),
        std::env::var_os("PRJQUOTA_PAUSE_NAME"),
    ) else {
        return;
    };
    if name.to_bytes() != std::os::unix::ffi::OsStrExt::as_bytes(want.as_os_str()) {
        return;
    }
    static PAUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if PAUSED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    let dir = PathBuf::from(dir);
    let (paused, go) = (dir.join("paused"), dir.join("go"));
    if std::fs::write(&paused, b"").is_err() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while !go.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::fs::remove_file(&go);
    let _ = std::fs::remove_file(&paused);
}
