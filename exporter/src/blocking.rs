//! Filesystem calls that may never return, kept off the async runtime.
//!
//! node_exporter's stuck-mount rule, applied per volumes directory: a call
//! that has not returned within its timeout marks its key (a directory) as
//! stuck, the scrape goes on without it, and no new call is issued for that
//! key until the blocked one returns. A thread in uninterruptible sleep cannot
//! be cancelled, so this bounds the blocked threads to one per key instead of
//! one per scrape.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Keys with a call outstanding.
#[derive(Debug)]
pub struct InFlight {
    what: &'static str,
    calls: Arc<Mutex<HashSet<String>>>,
}

/// Why a guarded call produced no value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// An earlier call for this key has not returned yet; none was made.
    /// Its text names no duration: the scrape logs an error only when its
    /// text changes, and a stuck mount is reported once, not per scrape
    /// (the time-out said when it began, the recovery says how long).
    Stuck,
    /// The call did not return within the timeout; it is now stuck.
    TimedOut { after: Duration },
    /// The call panicked (a bug): reported, not propagated.
    Panicked,
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocked::Stuck => f.write_str(
                "an earlier call timed out and has not returned; not calling again until it returns",
            ),
            Blocked::TimedOut { after } => write!(
                f,
                "no answer within {:.1}s; treated as stuck until the call returns",
                after.as_secs_f64()
            ),
            Blocked::Panicked => f.write_str("the call panicked"),
        }
    }
}

/// Held by the blocking call; dropping it (when the call returns) frees the
/// key, and logs the recovery when the call had been declared stuck.
#[derive(Debug)]
pub struct Ticket {
    what: &'static str,
    key: String,
    started: Instant,
    stuck: Arc<AtomicBool>,
    calls: Arc<Mutex<HashSet<String>>>,
}

impl Ticket {
    /// Set by the waiting side when it gives up on the call.
    pub fn stuck_flag(&self) -> Arc<AtomicBool> {
        self.stuck.clone()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
        if self.stuck.load(Ordering::Relaxed) {
            crate::info!(
                "a blocked call returned; querying again from the next scrape",
                call = self.what,
                key = self.key,
                blocked_seconds = format!("{:.1}", self.started.elapsed().as_secs_f64()),
            );
        }
    }
}

impl InFlight {
    pub fn new(what: &'static str) -> InFlight {
        InFlight {
            what,
            calls: Arc::default(),
        }
    }

    /// Claims `key` for a new call, unless one is still outstanding.
    pub fn begin(&self, key: &str) -> Result<Ticket, Blocked> {
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        if !calls.insert(key.to_string()) {
            return Err(Blocked::Stuck);
        }
        let started = Instant::now();
        Ok(Ticket {
            what: self.what,
            key: key.to_string(),
            started,
            stuck: Arc::default(),
            calls: self.calls.clone(),
        })
    }

    pub fn is_stuck(&self, key: &str) -> bool {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(key)
    }

    /// Runs `f` on the blocking pool with a timeout, one call per key.
    pub async fn run<T, F>(&self, key: &str, timeout: Duration, f: F) -> Result<T, Blocked>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let ticket = self.begin(key)?;
        let stuck = ticket.stuck_flag();
        let handle = tokio::task::spawn_blocking(move || {
            let out = f();
            drop(ticket);
            out
        });
        match tokio::time::timeout(timeout, handle).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) => Err(Blocked::Panicked),
            Err(_) => {
                stuck.store(true, Ordering::Relaxed);
                Err(Blocked::TimedOut { after: timeout })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stuck_key_is_not_called_again_until_it_returns() {
        let guard = InFlight::new("test");
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let r = guard
            .run("/a", Duration::from_millis(50), move || wait.recv().ok())
            .await;
        assert!(matches!(r, Err(Blocked::TimedOut { .. })), "{r:?}");
        assert!(guard.is_stuck("/a"));
        let r = guard.run("/a", Duration::from_secs(5), || 1).await;
        assert!(matches!(r, Err(Blocked::Stuck)), "{r:?}");
        // The scrape logs a collector's error again only when its text
        // changes: a key that stays stuck must keep the same text.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let again = guard.run("/a", Duration::from_secs(5), || 1).await;
        assert_eq!(
            again.unwrap_err().to_string(),
            r.unwrap_err().to_string(),
            "the error text of a key that stays stuck changed between scrapes"
        );
        // Other keys are unaffected.
        assert_eq!(guard.run("/b", Duration::from_secs(5), || 2).await, Ok(2));
        release.send(()).unwrap();
        for _ in 0..500 {
            if !guard.is_stuck("/a") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(guard.run("/a", Duration::from_secs(5), || 3).await, Ok(3));
    }
}
