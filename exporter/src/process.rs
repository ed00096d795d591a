//! The standard `process_*` metrics of the exporter itself, from procfs, as
//! every Prometheus client library exports them.

use crate::exposition::Family;

/// The families, or none (and a log line) when /proc cannot be read: a scrape
/// never fails for them.
pub fn families() -> Vec<Family> {
    match read() {
        Ok(f) => f,
        Err(e) => {
            crate::warn!(
                "cannot read this process's /proc entries; process_* metrics left out",
                err = e
            );
            Vec::new()
        }
    }
}

/// The boot time, read once: it is the `btime` line of `/proc/stat`, whose
/// per-CPU and interrupt lines are most of the text a scrape would parse
/// for it.
fn boot_time() -> procfs::ProcResult<f64> {
    static BOOT: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    if let Some(b) = BOOT.get() {
        return Ok(*b);
    }
    let b = procfs::boot_time_secs()? as f64;
    Ok(*BOOT.get_or_init(|| b))
}

fn read() -> procfs::ProcResult<Vec<Family>> {
    let me = procfs::process::Process::myself()?;
    let stat = me.stat()?;
    let ticks = procfs::ticks_per_second() as f64;
    let boot = boot_time()?;
    let mut out = Vec::with_capacity(6);
    let mut f = Family::counter(
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
    );
    f.plain((stat.utime + stat.stime) as f64 / ticks);
    out.push(f);
    let mut f = Family::gauge(
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
    );
    f.plain((stat.rss * procfs::page_size()) as f64);
    out.push(f);
    let mut f = Family::gauge(
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
    );
    f.plain(stat.vsize as f64);
    out.push(f);
    let mut f = Family::gauge("process_open_fds", "Number of open file descriptors.");
    f.plain(me.fd_count()? as f64);
    out.push(f);
    let mut f = Family::gauge(
        "process_max_fds",
        "Maximum number of open file descriptors.",
    );
    f.plain(match me.limits()?.max_open_files.soft_limit {
        procfs::process::LimitValue::Value(n) => n as f64,
        procfs::process::LimitValue::Unlimited => f64::INFINITY,
    });
    out.push(f);
    let mut f = Family::gauge(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
    );
    f.plain(boot + stat.starttime as f64 / ticks);
    out.push(f);
    Ok(out)
}

/// When this process started, seconds since the epoch (as
/// `process_start_time_seconds`), read once; `None` when /proc cannot say.
/// Never later than the true start: `btime` is whole seconds, cut.
pub fn start_time() -> Option<f64> {
    static START: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    *START.get_or_init(|| {
        let stat = procfs::process::Process::myself().ok()?.stat().ok()?;
        let ticks = procfs::ticks_per_second() as f64;
        Some(boot_time().ok()? + stat.starttime as f64 / ticks)
    })
}
