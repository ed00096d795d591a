//! The run's deadline. CI gives a run 90 minutes, `cargo xtask deps` and
//! `cargo xtask test` together; the passes' own limits each catch one hung
//! pass, but together they add up to more than that. So every VM's limit is
//! also cut to what is left of the run: a run slower than planned fails
//! with the name of the pass it was in, before CI kills it without a word.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long `cargo xtask test` may run: CI's 90 minutes less ten for a
/// cold `cargo xtask deps` (Debian packages, kernels, Prometheus, virtme-ng).
pub const RUN_SECS: u64 = 80 * 60;

static STARTED: OnceLock<Instant> = OnceLock::new();

/// Starts the clock (the first call only). Without it, limits are not cut:
/// `cargo xtask bench`, `stress` and `vm` keep their own.
pub fn start() {
    STARTED.get_or_init(Instant::now);
}

/// `limit`, cut to what is left of the run once [`start`] was called (at
/// least a minute, so a pass that starts late still says why it failed);
/// the flag says whether it was cut.
pub fn cut(limit: Duration) -> (Duration, bool) {
    let Some(started) = STARTED.get() else {
        return (limit, false);
    };
    let left = Duration::from_secs(RUN_SECS)
        .saturating_sub(started.elapsed())
        .max(Duration::from_secs(60));
    if left < limit {
        (left, true)
    } else {
        (limit, false)
    }
}

/// [`cut`], saying on standard output when it cut `what`'s limit.
pub fn cut_for(what: &str, limit: Duration) -> Duration {
    let (limit, was_cut) = cut(limit);
    if was_cut {
        println!(
            "xtask: {what} gets {}s, what is left of the run's {} minutes (CI's budget; \
             xtask/src/deadline.rs)",
            limit.as_secs(),
            RUN_SECS / 60
        );
    }
    limit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_cut_to_what_is_left_of_the_run() {
        let long = Duration::from_secs(RUN_SECS * 2);
        let short = Duration::from_secs(90);
        start();
        let (cut_long, was_cut) = cut(long);
        assert!(was_cut);
        assert!(cut_long <= Duration::from_secs(RUN_SECS), "{cut_long:?}");
        assert_eq!(cut(short), (short, false));
    }
}
