//! Which of a volumes directory's volumes Nomad knows, for `prjquota
//! reconcile --nomad` (asked over the announcement socket: the plugin's
//! binary has no HTTP client, and the token is the exporter's).
//!
//! A volume is [`Verdict::Unknown`] only when three answers agree: Nomad's
//! list of the node's host volumes (`/v1/volumes?type=host&namespace=*&
//! node_id=<its node>`, every page) lacks it, its own endpoint
//! (`/v1/volume/host/<id>?namespace=<its namespace>`) answers 404, and a
//! list of every node and namespace by its ID (`prefix=<id>`) has no such
//! volume. A refusal or a failure on the way is an error for the whole
//! question: a volume is never called unknown because Nomad could not be
//! asked.

use std::collections::{BTreeMap, BTreeSet};

use prjquota_core::announce::{NomadVolume, Verdict};

use super::api::{Endpoint, HostVolume, HostVolumeStub};
use super::client::{Client, Failure};
use crate::inventory::Volume;

/// Nomad's answer for each of `volumes`.
pub async fn verdicts(
    client: &Client,
    volumes: &[std::sync::Arc<Volume>],
) -> Result<Vec<NomadVolume>, Failure> {
    let nodes: BTreeSet<&str> = volumes.iter().map(|v| v.node_id.as_str()).collect();
    // Volume ID to the node Nomad lists it on.
    let mut listed: BTreeMap<String, String> = BTreeMap::new();
    for node in nodes {
        for v in list(client, &format!("node_id={}", encode(node))).await? {
            listed.insert(v.id, v.node_id);
        }
    }
    let mut out = Vec::with_capacity(volumes.len());
    for v in volumes {
        let (verdict, detail) = match listed.get(&v.volume_id) {
            Some(node) if *node == v.node_id => (Verdict::Listed, format!("listed on node {node}")),
            Some(node) => (
                Verdict::Elsewhere,
                format!("Nomad lists it on node {node}, not {}", v.node_id),
            ),
            None => confirm(client, v).await?,
        };
        out.push(NomadVolume {
            volume_id: v.volume_id.clone(),
            namespace: v.namespace.clone(),
            verdict,
            detail,
        });
    }
    Ok(out)
}

/// A volume the node's list lacks: its own endpoint, then every node and
/// namespace by its ID.
async fn confirm(client: &Client, v: &Volume) -> Result<(Verdict, String), Failure> {
    let path = format!(
        "/v1/volume/host/{}?namespace={}",
        encode(&v.volume_id),
        encode(&v.namespace)
    );
    let answer = client.get(Endpoint::Volume, &path, &[200, 404]).await?;
    if answer.status == 200 {
        let hv: HostVolume = answer.json()?;
        if hv.id != v.volume_id {
            return Err(Failure::Decode(format!(
                "asked for volume {}, Nomad answered with {}",
                v.volume_id, hv.id
            )));
        }
        return Ok(if hv.node_id == v.node_id {
            (
                Verdict::Listed,
                format!("known on node {} (not yet in its list)", hv.node_id),
            )
        } else {
            (
                Verdict::Elsewhere,
                format!("Nomad has it on node {}, not {}", hv.node_id, v.node_id),
            )
        });
    }
    let anywhere = list(client, &format!("prefix={}", encode(&v.volume_id))).await?;
    if let Some(other) = anywhere.iter().find(|o| o.id == v.volume_id) {
        return Ok((
            Verdict::Elsewhere,
            format!(
                "Nomad has it in namespace {:?} on node {}, not in {:?}",
                other.namespace, other.node_id, v.namespace
            ),
        ));
    }
    Ok((
        Verdict::Unknown,
        format!(
            "not in Nomad's list of node {}'s host volumes, and /v1/volume/host/{} answers 404 in namespace {:?}",
            v.node_id, v.volume_id, v.namespace
        ),
    ))
}

/// Every page of `/v1/volumes?type=host&namespace=*&<filter>`.
async fn list(client: &Client, filter: &str) -> Result<Vec<HostVolumeStub>, Failure> {
    let mut out = Vec::new();
    let mut next: Option<String> = None;
    // A page token that never ends the list is Nomad's bug, not a reason
    // to ask forever.
    for _ in 0..10_000 {
        let mut path = format!("/v1/volumes?type=host&namespace=*&{filter}");
        if let Some(t) = &next {
            path.push_str(&format!("&next_token={}", encode(t)));
        }
        let answer = client.get(Endpoint::Volumes, &path, &[200]).await?;
        let page: Vec<HostVolumeStub> = answer.json()?;
        out.extend(page);
        match answer.next_token {
            Some(t) => next = Some(t),
            None => return Ok(out),
        }
    }
    Err(Failure::Decode(
        "Nomad's host volume list went on for 10000 pages".into(),
    ))
}

/// Percent-encodes `s` for a path segment or a query value: everything but
/// RFC 3986's unreserved characters.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::tests::volume;
    use prjquota_vmtests::nomad_api::{Agent, Mode};
    use std::sync::Arc;

    use crate::nomad::client::client_of as client;

    fn verdict_of(out: &[NomadVolume], id: &str) -> Verdict {
        out.iter().find(|v| v.volume_id == id).unwrap().verdict
    }

    /// Listed on its node (across pages), on another node, in another
    /// namespace, and unknown: only the last is called unknown, and only
    /// after its own endpoint answered 404 and no node or namespace has it.
    #[tokio::test]
    async fn only_a_volume_every_answer_lacks_is_unknown() {
        let agent = Agent::start("node-1");
        agent.state().page_size = Some(2);
        let vols: Vec<Arc<Volume>> = (1..=6)
            .map(|i| Arc::new(volume(if i == 5 { "prod" } else { "default" }, "p", i)))
            .collect();
        for v in &vols[..3] {
            agent.add_volume(&v.volume_id, &v.namespace, "node-1");
        }
        // On another node under the same ID (a volume moved by hand).
        agent.add_volume(&vols[3].volume_id, "default", "node-2");
        // Known in another namespace than the record's.
        agent.add_volume(&vols[4].volume_id, "other", "node-9");
        // vols[5]: forgotten (nomad volume delete -force).
        let c = client(&agent);
        let out = verdicts(&c, &vols).await.unwrap();
        for v in &vols[..3] {
            assert_eq!(verdict_of(&out, &v.volume_id), Verdict::Listed);
        }
        assert_eq!(verdict_of(&out, &vols[3].volume_id), Verdict::Elsewhere);
        assert_eq!(verdict_of(&out, &vols[4].volume_id), Verdict::Elsewhere);
        assert_eq!(verdict_of(&out, &vols[5].volume_id), Verdict::Unknown);
        let seen = agent.requests();
        // Every list asks every namespace; the node's list came in pages.
        let lists: Vec<_> = seen.iter().filter(|r| r.path() == "/v1/volumes").collect();
        assert!(lists
            .iter()
            .all(|r| r.query("namespace").as_deref() == Some("*")
                && r.query("type").as_deref() == Some("host")));
        assert!(
            lists.iter().any(|r| r.query("next_token").is_some()),
            "{lists:#?}"
        );
        let own: Vec<_> = seen
            .iter()
            .filter(|r| r.path().starts_with("/v1/volume/host/"))
            .collect();
        assert_eq!(own.len(), 3, "only the volumes the list lacks: {own:#?}");
        let unknown = &vols[5];
        assert!(own.iter().any(
            |r| r.path() == format!("/v1/volume/host/{}", unknown.volume_id)
                && r.query("namespace").as_deref() == Some("default")
        ));
    }

    /// Refused or failing, Nomad decides nothing: the question fails.
    #[tokio::test]
    async fn a_refusal_is_no_verdict() {
        let agent = Agent::start("node-1");
        let vols = vec![Arc::new(volume("default", "p", 1))];
        for mode in [
            Mode::Status(403, "Permission denied".into()),
            Mode::Status(500, "rpc error: No cluster leader".into()),
        ] {
            agent.set_mode(mode);
            assert!(verdicts(&client(&agent), &vols).await.is_err());
        }
        // ACLs on and no token: every answer a refusal, none a verdict.
        agent.set_mode(Mode::Normal);
        agent.state().token = Some("s3cret".into());
        assert!(verdicts(&client(&agent), &vols).await.is_err());
    }

    #[test]
    fn only_unreserved_characters_go_unencoded() {
        assert_eq!(encode("c0ffee00-1234_a.b~"), "c0ffee00-1234_a.b~");
        assert_eq!(encode("a b/c?d&e=f*"), "a%20b%2Fc%3Fd%26e%3Df%2A");
        assert_eq!(encode("é"), "%C3%A9");
    }
}
