//! Whether Nomad answers, as the requests found it: every request counted
//! by endpoint and outcome, the last one's outcome as `up`, and one log
//! line when that changes (from up to unreachable, refused or failing,
//! and back), never one per request.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::api::Endpoint;
use super::client::Failure;
use super::settings::Address;
use crate::exposition::Family;

/// What the requests found.
#[derive(Debug, Default)]
pub struct Status {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// `None` until the first request; then whether it was answered, and
    /// the kind of the last failure.
    up: Option<Result<(), &'static str>>,
    requests: BTreeMap<(Endpoint, String), u64>,
}

impl Status {
    pub fn new() -> Status {
        Status::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn counted(&self, endpoint: Endpoint, code: &str) {
        *self
            .lock()
            .requests
            .entry((endpoint, code.to_string()))
            .or_default() += 1;
    }

    pub(super) fn answered(&self, addr: &Address) {
        let before = self.lock().up.replace(Ok(()));
        if matches!(before, Some(Err(_))) {
            crate::info!("Nomad's API answers again", nomad_addr = addr);
        }
    }

    pub(super) fn failed(&self, addr: &Address, endpoint: Endpoint, f: &Failure) {
        let kind = f.kind();
        let before = self.lock().up.replace(Err(kind));
        if before == Some(Err(kind)) {
            crate::debug!(
                "Nomad's API still fails",
                nomad_addr = addr,
                endpoint = endpoint.label(),
                err = f
            );
            return;
        }
        let fix = match f {
            Failure::Refused { .. } => format!(
                "the token (--nomad.token-file or NOMAD_TOKEN) needs {}: see \
                 /usr/share/prjquota/nomad/prjquota-exporter.policy.hcl",
                endpoint.needs()
            ),
            Failure::Tls(_) => "check the CA (--nomad.ca-cert), the client certificate and the server name (--nomad.tls-server-name)".into(),
            _ => "nothing on the node is changed while Nomad is away; the exporter tries again with a growing pause".into(),
        };
        crate::warn!(
            "Nomad's API does not answer as asked",
            nomad_addr = addr,
            state = kind,
            endpoint = endpoint.label(),
            err = f,
            fix = fix,
        );
    }

    /// `Some(true)` once the last request was answered, `Some(false)` when
    /// it failed, `None` before the first.
    pub fn up(&self) -> Option<bool> {
        self.lock().up.map(|u| u.is_ok())
    }

    /// This client's families: `nomad_up` (absent before the first
    /// request: nothing measured yet) and the request counts.
    pub fn families(&self) -> Vec<Family> {
        let inner = self.lock();
        let mut up = Family::gauge(
            "prjquota_exporter_nomad_up",
            "1 when the exporter's last request to Nomad's API was answered as asked, 0 when it failed (unreachable, refused, an error: the log says which, once per change); absent before the first request.",
        );
        if let Some(u) = inner.up {
            up.plain(if u.is_ok() { 1.0 } else { 0.0 });
        }
        let mut requests = Family::counter(
            "prjquota_exporter_nomad_requests_total",
            "Requests to Nomad's API by endpoint (client_metadata, allocation, volumes, volume) and outcome: the HTTP status, or unreachable, timeout, tls, protocol, decode.",
        );
        for ((endpoint, code), n) in &inner.requests {
            requests.labelled(
                vec![
                    ("endpoint", endpoint.label().to_string()),
                    ("code", code.clone()),
                ],
                *n as f64,
            );
        }
        vec![up, requests]
    }
}
