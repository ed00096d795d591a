//! The nomad collector (with `--nomad.*`): what the Nomad client's task
//! last learned (`crate::nomad`): whether Nomad answers, the requests by
//! outcome, the unprovisioned bytes last published, and each allocation's
//! reserved ephemeral disk. It reads memory only: no request to Nomad is
//! ever made on a scrape's path.

use std::sync::Arc;

use super::{BoxFuture, Collector, Scrape};
use crate::exposition::Family;
use crate::nomad::Nomad;

pub struct NomadCollector(pub Arc<Nomad>);

impl Collector for NomadCollector {
    fn name(&self) -> &'static str {
        "nomad"
    }

    fn collect<'a>(
        &'a self,
        _scrape: &'a Scrape,
        out: &'a mut Vec<Family>,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            out.extend(self.0.families());
            Ok(())
        })
    }
}

/// Every family this collector can publish (the dashboards' lint).
pub fn catalogue() -> Vec<Family> {
    crate::nomad::catalogue()
}
