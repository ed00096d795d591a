//! The lifecycle of a collector whose kernel programs load in the
//! background (`ebpf`, `guard`): loading them off the async threads at
//! start-up, what a scrape reports meanwhile, and the readiness start-up
//! waits for ([`super::Collector::ready`]).
//!
//! A background collector is `Loading` until its load returns, then `Off`
//! (switched off by its flag, or the load failed: a bounded reason label
//! and the words) or `Loaded` for good: the state never goes back, so a
//! scrape takes what it finds, after waiting a moment at most while the
//! load is still running.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// Where a background collector stands. `L` is what a load gives, `O`
/// what an off collector still reports (the eBPF hooks it would have
/// attached).
pub(super) enum Status<L, O = ()> {
    /// Start-up has not finished loading.
    Loading,
    /// Nothing loaded: `reason` is the bounded label (`disabled` when its
    /// flag switched it off), `error` the loader's words (`None` when
    /// switched off).
    Off {
        reason: &'static str,
        error: Option<String>,
        detail: O,
    },
    Loaded(L),
}

/// What a load gave: whether it is what the flags asked for.
pub(super) trait Loaded: Send + Sync + 'static {
    /// Why this is not what was asked for (the guard pinned nowhere, or
    /// detecting where enforcement was asked), for the readiness to say.
    fn shortfall(&self) -> Option<String> {
        None
    }
}

/// A background collector's status, as its scrapes and start-up see it.
pub(super) struct Background<L, O = ()> {
    status: watch::Receiver<Arc<Status<L, O>>>,
    /// How long a scrape waits for a load still in progress before
    /// reporting it as loading.
    wait: Duration,
    /// Who loads, for the error when it stopped without a result ("the
    /// eBPF loader").
    loader: &'static str,
}

/// Runs a start-up load on the runtime's blocking pool when there is a
/// runtime (always, in the exporter), on a thread of its own otherwise.
pub(super) fn spawn_load(work: impl FnOnce() + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn_blocking(work)),
        Err(_) => drop(std::thread::spawn(work)),
    }
}

impl<L: Loaded, O: Send + Sync + 'static> Background<L, O> {
    /// Switched off by its flag: `disabled`, and nothing to load.
    pub fn off(detail: O, wait: Duration, loader: &'static str) -> Self {
        Self::with_status(
            Status::Off {
                reason: "disabled",
                error: None,
                detail,
            },
            wait,
            loader,
        )
        .0
    }

    /// Starts `load` on the blocking pool and publishes what it gives;
    /// then, when it loaded, runs `then` with it (there, still off the
    /// async threads).
    pub fn load(
        wait: Duration,
        loader: &'static str,
        load: impl FnOnce() -> Status<L, O> + Send + 'static,
        then: impl FnOnce(&L) + Send + 'static,
    ) -> Self {
        let (background, tx) = Self::with_status(Status::Loading, wait, loader);
        spawn_load(move || {
            let status = Arc::new(load());
            let _ = tx.send(status.clone());
            if let Status::Loaded(l) = &*status {
                then(l);
            }
        });
        background
    }

    /// A collector in `status`, and the sender that moves it on (tests
    /// hold it to keep one loading).
    pub fn with_status(
        status: Status<L, O>,
        wait: Duration,
        loader: &'static str,
    ) -> (Self, watch::Sender<Arc<Status<L, O>>>) {
        let (tx, rx) = watch::channel(Arc::new(status));
        (
            Background {
                status: rx,
                wait,
                loader,
            },
            tx,
        )
    }

    /// The status a scrape reports: a scrape right at start-up gives the
    /// load a moment (the `wait` given), never a long one, then takes
    /// whatever it is.
    pub async fn status(&self) -> Arc<Status<L, O>> {
        let mut rx = self.status.clone();
        let settled = tokio::time::timeout(self.wait, rx.wait_for(|s| !s.is_loading())).await;
        match settled {
            Ok(Ok(s)) => s.clone(),
            _ => self.now(),
        }
    }

    /// The status as it is, without waiting.
    pub fn now(&self) -> Arc<Status<L, O>> {
        self.status.borrow().clone()
    }

    /// Waits for the load to finish, however long it takes: `Err` with the
    /// reason when it failed or gave less than asked for, `Ok` when loaded
    /// as asked or switched off.
    pub fn ready(&self) -> impl Future<Output = Result<(), String>> + Send + 'static {
        let (mut rx, loader) = (self.status.clone(), self.loader);
        async move {
            let status = match rx.wait_for(|s| !s.is_loading()).await {
                Ok(s) => s.clone(),
                Err(_) => return Err(format!("{loader} stopped without a result")),
            };
            match &*status {
                Status::Off { error: Some(e), .. } => Err(e.clone()),
                Status::Loaded(l) => l.shortfall().map_or(Ok(()), Err),
                _ => Ok(()),
            }
        }
    }
}

impl<L, O> Status<L, O> {
    fn is_loading(&self) -> bool {
        matches!(self, Status::Loading)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Short(Option<&'static str>);

    impl Loaded for Short {
        fn shortfall(&self) -> Option<String> {
            self.0.map(str::to_string)
        }
    }

    fn wait() -> Duration {
        Duration::from_millis(10)
    }

    #[tokio::test]
    async fn switched_off_is_ready_and_disabled() {
        let b: Background<Short> = Background::off((), wait(), "the test loader");
        assert_eq!(b.ready().await, Ok(()));
        assert!(matches!(
            &*b.status().await,
            Status::Off {
                reason: "disabled",
                error: None,
                ..
            }
        ));
    }

    #[tokio::test]
    async fn readiness_says_why_a_load_failed_or_fell_short() {
        let failed: Background<Short> = Background::load(
            wait(),
            "the test loader",
            || Status::Off {
                reason: "permission",
                error: Some("no CAP_BPF".into()),
                detail: (),
            },
            |_| unreachable!("not loaded"),
        );
        assert_eq!(failed.ready().await, Err("no CAP_BPF".into()));
        let (then, ran) = tokio::sync::oneshot::channel();
        let short: Background<Short> = Background::load(
            wait(),
            "the test loader",
            || Status::Loaded(Short(Some("not pinned"))),
            move |_| {
                let _ = then.send(());
            },
        );
        assert_eq!(short.ready().await, Err("not pinned".into()));
        ran.await.expect("then runs after a load");
        let fine: Background<Short> = Background::load(
            wait(),
            "the test loader",
            || Status::Loaded(Short(None)),
            |_| {},
        );
        assert_eq!(fine.ready().await, Ok(()));
    }

    #[tokio::test]
    async fn a_loader_that_dies_is_an_error_and_a_scrape_does_not_wait_long() {
        let b: Background<Short> =
            Background::load(wait(), "the test loader", || panic!("on purpose"), |_| {});
        assert_eq!(
            b.ready().await,
            Err("the test loader stopped without a result".into())
        );
        let (still, _tx) = Background::<Short>::with_status(Status::Loading, wait(), "x");
        assert!(still.status().await.is_loading());
    }
}
