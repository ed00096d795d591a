//! The served_dirs collector: whether this exporter watches the volumes
//! directories the plugin on this host has served (the markers of
//! `prjquota_core::served_dirs`). An exporter given another `--volumes-dir`
//! than Nomad's `host_volumes_dir` exports nothing for the volumes Nomad
//! has, and nothing else looks wrong: this is what says so.
//!
//! Per served directory that still exists, one
//! `prjquota_exporter_plugin_volumes_dir_watched{volumes_dir, node_id}`: 1
//! when it is one of this exporter's volumes directories (both resolved, as
//! the plugin's announcements compare them), 0 when not. A served directory
//! that is gone (moved away, a test's) is left out: there is nothing in it
//! to watch.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::anyhow;
use prjquota_core::announce::canonical;
use prjquota_core::served_dirs::{self, Served};

use super::{BoxFuture, Collector, Scrape};
use crate::blocking::InFlight;
use crate::exposition::Family;

pub struct ServedDirs {
    /// Where the markers are: `served_dirs::DIR` but in tests.
    markers: PathBuf,
    /// This exporter's volumes directories, as configured.
    watched: Vec<PathBuf>,
    timeout: Duration,
    inflight: InFlight,
}

/// A served directory and whether it is watched here.
type Seen = (Served, bool);

impl ServedDirs {
    pub fn new(watched: &[PathBuf], timeout: Duration) -> ServedDirs {
        Self::reading(Path::new(served_dirs::DIR), watched, timeout)
    }

    /// The collector of the markers in `markers` (tests).
    pub fn reading(markers: &Path, watched: &[PathBuf], timeout: Duration) -> ServedDirs {
        ServedDirs {
            markers: markers.to_path_buf(),
            watched: watched.to_vec(),
            timeout,
            inflight: InFlight::new("served volumes directories"),
        }
    }
}

/// The markers, each with whether `watched` holds its directory; those
/// whose directory is gone left out. Resolving a path may wait on its
/// filesystem: run on the blocking pool.
fn compare(markers: &Path, watched: &[PathBuf]) -> std::io::Result<Vec<Seen>> {
    let ours: Vec<PathBuf> = watched.iter().map(|d| canonical(d)).collect();
    Ok(served_dirs::read_all(markers)?
        .into_iter()
        .filter_map(|s| {
            let here = ours.contains(&s.volumes_dir);
            (here || std::fs::symlink_metadata(&s.volumes_dir).is_ok()).then_some((s, here))
        })
        .collect())
}

/// The family for what [`compare`] found (pure, for the tests).
pub fn family(seen: &[Seen]) -> Family {
    let mut f = Family::gauge(
        "prjquota_exporter_plugin_volumes_dir_watched",
        "For each volumes directory the prjquota plugin on this host has served since boot (its markers in /run/prjquota/volumes-dirs), 1 when this exporter watches it (--volumes-dir), 0 when it does not: its volumes are then not exported at all.",
    );
    for (s, here) in seen {
        f.labelled(
            vec![
                ("volumes_dir", s.volumes_dir.display().to_string()),
                ("node_id", s.node_id.clone()),
            ],
            if *here { 1.0 } else { 0.0 },
        );
    }
    f
}

impl Collector for ServedDirs {
    fn name(&self) -> &'static str {
        "served_dirs"
    }

    fn collect<'a>(
        &'a self,
        _scrape: &'a Scrape,
        out: &'a mut Vec<Family>,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let (markers, watched) = (self.markers.clone(), self.watched.clone());
            let key = markers.display().to_string();
            let read = self
                .inflight
                .run(&key, self.timeout, move || compare(&markers, &watched))
                .await;
            match read {
                Ok(Ok(seen)) => {
                    out.push(family(&seen));
                    Ok(())
                }
                // The family, without samples: it is known, its values not.
                Ok(Err(e)) => {
                    out.push(family(&[]));
                    Err(anyhow!("cannot read the plugin's markers in {key}: {e}"))
                }
                Err(blocked) => {
                    out.push(family(&[]));
                    Err(anyhow!("reading the plugin's markers in {key}: {blocked}"))
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::Inventory;

    fn scratch(tag: &str) -> PathBuf {
        crate::inventory::tests::temp_dir(tag)
    }

    async fn text(c: &ServedDirs) -> (String, anyhow::Result<()>) {
        let scrape = Scrape::new(Inventory::default());
        let mut out = Vec::new();
        let r = c.collect(&scrape, &mut out).await;
        // Every scrape has the family, samples or not (the catalogue).
        assert_eq!(
            out.iter().map(|f| f.name).collect::<Vec<_>>(),
            ["prjquota_exporter_plugin_volumes_dir_watched"]
        );
        (crate::exposition::encode_all(&out, &scrape.inventory), r)
    }

    fn is_root() -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    }

    /// The plugin served two directories; the exporter watches one of them
    /// (by a path with a trailing slash, as an operator may write it): 1
    /// for it, 0 for the other, and a third that was removed since is left
    /// out.
    #[tokio::test]
    async fn a_served_directory_not_watched_is_0_and_a_watched_one_1() {
        let base = scratch("served");
        let markers = base.join("markers");
        let (a, b, gone) = (base.join("a"), base.join("b"), base.join("gone"));
        for d in [&a, &b, &gone] {
            std::fs::create_dir(d).unwrap();
        }
        if !is_root() {
            // Markers are root's; elsewhere the plugin cannot write them.
            assert!(served_dirs::note(&markers, &a, "node-1").is_err());
            return;
        }
        for d in [&a, &b, &gone] {
            served_dirs::note(&markers, d, "node-1").unwrap();
        }
        std::fs::remove_dir(&gone).unwrap();
        let mut slash = a.clone().into_os_string();
        slash.push("/");
        let c = ServedDirs::reading(&markers, &[PathBuf::from(slash)], Duration::from_secs(5));
        let (t, r) = text(&c).await;
        r.unwrap();
        let line = |d: &Path, v: u8| {
            format!(
                "prjquota_exporter_plugin_volumes_dir_watched{{volumes_dir=\"{}\",node_id=\"node-1\"}} {v}\n",
                canonical(d).display()
            )
        };
        assert!(t.contains(&line(&a, 1)), "{t}");
        assert!(t.contains(&line(&b, 0)), "{t}");
        assert!(!t.contains("gone"), "{t}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// No marker directory: no plugin ran since boot, nothing to compare;
    /// the family is known, with no samples, and the collector succeeds.
    /// A marker that is not the plugin's fails it, naming the file.
    #[tokio::test]
    async fn no_markers_is_nothing_and_a_foreign_file_fails_the_collector() {
        let base = scratch("no-markers");
        let markers = base.join("markers");
        let c = ServedDirs::reading(
            &markers,
            std::slice::from_ref(&base),
            Duration::from_secs(5),
        );
        let (t, r) = text(&c).await;
        r.unwrap();
        assert!(
            !t.contains("prjquota_exporter_plugin_volumes_dir_watched{"),
            "{t}"
        );
        if is_root() {
            served_dirs::note(&markers, &base, "node-1").unwrap();
            std::fs::write(markers.join("stray"), b"{").unwrap();
            let (_, r) = text(&c).await;
            let e = r.unwrap_err().to_string();
            assert!(e.contains("stray"), "{e}");
        }
        std::fs::remove_dir_all(&base).unwrap();
    }
}
