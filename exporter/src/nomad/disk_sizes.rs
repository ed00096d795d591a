//! The sizes Nomad reserved for the allocations' ephemeral disks
//! (`--nomad.enforce-ephemeral-disk`): `AllocatedResources.Shared.DiskMB`
//! of `/v1/allocation/<id>` for each allocation the scan thread holds,
//! asked once when it appears (during its walk, so that the size is known
//! when it is accounted) and again every [`REFRESH`]: Nomad changes an
//! allocation's disk only by replacing it (an `ephemeral_disk` change is a
//! destructive update), so a new size is a new allocation, asked for at
//! once. The limits themselves are set by the scan thread
//! (`crate::allocs::disk_limits`).
//!
//! An allocation Nomad does not know (404: collected on the servers) is
//! left unlimited and asked again after [`REFRESH`]; a failure of Nomad
//! stops the round, and what is known stays in force.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::api::{Allocation, Endpoint};
use super::client::{Client, Failure};
use crate::allocs::disk_limits::DiskLimits;

/// How often a known allocation's size is asked again.
pub const REFRESH: Duration = Duration::from_secs(600);

/// The sizes asked so far.
#[derive(Default)]
pub struct Sizes {
    asked: BTreeMap<Arc<str>, Instant>,
    /// Allocations whose answer had no size, logged once each.
    logged: BTreeSet<Arc<str>>,
}

impl Sizes {
    /// Asks Nomad for every wanted allocation's size not known or due.
    pub async fn step(&mut self, client: &Client, limits: &DiskLimits) -> Result<(), Failure> {
        let wanted = limits.wanted();
        let now = Instant::now();
        for id in wanted.iter() {
            let fresh = self
                .asked
                .get(id)
                .is_some_and(|at| now.duration_since(*at) < REFRESH);
            if fresh {
                continue;
            }
            let answer = client
                .get(
                    Endpoint::Allocation,
                    &format!("/v1/allocation/{id}"),
                    &[200, 404],
                )
                .await?;
            self.asked.insert(id.clone(), now);
            if answer.status == 404 {
                crate::debug!(
                    "Nomad does not know an allocation this node holds: it stays unlimited",
                    alloc_id = id
                );
                continue;
            }
            let alloc: Allocation = answer.json()?;
            if alloc.id != **id {
                return Err(Failure::Decode(format!(
                    "asked for allocation {id}, Nomad answered with {}",
                    alloc.id
                )));
            }
            match alloc.reserved_disk_bytes() {
                Ok(bytes) => limits.set_reserved(id, bytes),
                Err(why) => {
                    if self.logged.insert(id.clone()) {
                        crate::warn!(
                            "an allocation has no ephemeral disk size to enforce: it stays unlimited",
                            alloc_id = id,
                            err = why
                        );
                    }
                }
            }
        }
        let keep: BTreeSet<&str> = wanted.iter().map(|id| &**id).collect();
        self.asked.retain(|id, _| keep.contains(&**id));
        self.logged.retain(|id| keep.contains(&**id));
        limits.retain_reserved(&keep);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocs::disk_limits::{DiskLimits, Mode};
    use prjquota_vmtests::nomad_api::Agent;

    use crate::nomad::client::client_of as client;

    const A: &str = "8f3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93";
    const B: &str = "0a3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93";
    const GONE: &str = "1b3e9d2c-4b1a-4c6e-9a7d-2e5b6c1f0a93";

    /// Each wanted allocation is asked once; its DiskMB in MiB is its
    /// size; one Nomad does not know is left without one; the next round
    /// asks nothing; a collected allocation's size is forgotten.
    #[tokio::test]
    async fn sizes_are_asked_once_each_and_forgotten_with_their_allocation() {
        let agent = Agent::start("node-1");
        agent.add_allocation(A, "default", 300);
        agent.add_allocation(B, "prod", 1024);
        let (c, limits) = (client(&agent), DiskLimits::new(Mode::Enforce));
        limits.set_wanted(vec![A.into(), B.into(), GONE.into()]);
        let mut sizes = Sizes::default();
        sizes.step(&c, &limits).await.unwrap();
        assert_eq!(limits.reserved_of(A), Some(300 << 20));
        assert_eq!(limits.reserved_of(B), Some(1 << 30));
        assert_eq!(limits.reserved_of(GONE), None);
        let asked = agent.requests_to("/v1/allocation/");
        assert_eq!(asked.len(), 3, "{asked:#?}");
        assert!(asked.iter().all(|r| r.method == "GET"));
        sizes.step(&c, &limits).await.unwrap();
        assert_eq!(agent.requests_to("/v1/allocation/").len(), 3, "asked again");
        limits.set_wanted(vec![B.into()]);
        sizes.step(&c, &limits).await.unwrap();
        assert_eq!(limits.reserved_of(A), None);
        assert_eq!(c.status.up(), Some(true));
    }

    /// Nomad failing mid-round stops it: what was known stays, nothing is
    /// taken for a size.
    #[tokio::test]
    async fn a_failing_nomad_keeps_what_was_known() {
        let agent = Agent::start("node-1");
        agent.add_allocation(A, "default", 300);
        let (c, limits) = (client(&agent), DiskLimits::new(Mode::Enforce));
        limits.set_wanted(vec![A.into()]);
        let mut sizes = Sizes::default();
        sizes.step(&c, &limits).await.unwrap();
        agent.set_mode(prjquota_vmtests::nomad_api::Mode::Status(
            500,
            "rpc error: No cluster leader".into(),
        ));
        limits.set_wanted(vec![A.into(), B.into()]);
        let e = sizes.step(&c, &limits).await.unwrap_err();
        assert_eq!(e.code(), "500", "{e}");
        assert_eq!(limits.reserved_of(A), Some(300 << 20));
        assert_eq!(limits.reserved_of(B), None);
        assert_eq!(c.status.up(), Some(false));
    }
}
