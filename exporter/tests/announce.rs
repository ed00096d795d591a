//! The exporter's end of the plugin's announcements, on the host (no eBPF
//! here: registration is the registry read and nothing else): the plugin's
//! own client gets `ok` once the exporter is ready, a request for another
//! directory and a client that is not root are refused and counted, and a
//! second exporter of the same directory says it is not listening.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use prjquota_core::announce::{announce, socket_name, Announced};
use prjquota_core::record::State;
use prjquota_exporter::Exporter;

fn exporter(dir: &Path) -> Arc<Exporter> {
    let config = host_config(dir);
    let e = Arc::new(Exporter::new(&config));
    prjquota_exporter::announce::start(e.clone(), &config.volumes_dirs);
    e
}

async fn text(e: &Exporter) -> String {
    e.scrape().await.to_text()
}

/// `request` sent by a process running as `nobody`, through Python's
/// socket module (no unsafe fork here); returns what it read back (a
/// reset connection reads as nothing).
fn as_nobody(dir: &Path, request: &str) -> String {
    let name = String::from_utf8(socket_name(dir).unwrap()).unwrap();
    let script = format!(
        "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect('\\0{name}')\ns.settimeout(5)\ntry:\n  s.sendall({request:?}.encode())\n  sys.stdout.write(s.recv(100).decode())\nexcept (ConnectionResetError, BrokenPipeError):\n  pass\n"
    );
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            &script,
        ])
        .output()
        .expect("run setpriv (util-linux) and /usr/bin/python3");
    assert!(
        out.status.success(),
        "the unprivileged client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announcements_are_answered_once_ready_and_refused_otherwise() {
    let dir = fresh_dir(&std::env::temp_dir(), "announce");
    add_volume(
        &dir,
        record(
            "aaaaaaaa-0000-4000-8000-000000000001",
            "default",
            10_001,
            State::Ready,
        ),
    );
    let e = exporter(&dir);

    // Before the warm-up the exporter holds the answer back (the programs
    // are not loaded yet); the plugin's client waits, then gets `ok`.
    let d = dir.to_path_buf();
    let asked = tokio::task::spawn_blocking(move || announce(&d, Duration::from_secs(10)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !asked.is_finished(),
        "answered before the exporter was ready"
    );
    e.warm_up().await;
    assert_eq!(asked.await.unwrap().unwrap(), Announced::Registered);

    // Ready: answered at once, however the directory is spelled.
    let spelled = format!("{}/", dir.display());
    let d = spelled.clone();
    let got = tokio::task::spawn_blocking(move || announce(Path::new(&d), Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(got.unwrap(), Announced::Registered);

    let t = text(&e).await;
    assert_eq!(
        value(
            &t,
            "prjquota_exporter_announcements_total{result=\"registered\"}"
        ),
        Some(2.0),
        "{t}"
    );
    assert_eq!(
        value(
            &t,
            &format!(
                "prjquota_exporter_announce_listening{{volumes_dir=\"{}\"}}",
                dir.display()
            )
        ),
        Some(1.0),
        "{t}"
    );

    // Not root: the connection is closed without an answer, and counted.
    let d = dir.to_path_buf();
    let request = format!("sync {}\n", dir.display());
    let reply = tokio::task::spawn_blocking(move || as_nobody(&d, &request))
        .await
        .unwrap();
    assert_eq!(reply, "", "a client that is not root got an answer");

    // Root asking about another directory on this directory's socket.
    let d = dir.to_path_buf();
    let reply = tokio::task::spawn_blocking(move || {
        use std::io::{BufRead, BufReader, Write};
        use std::os::linux::net::SocketAddrExt;
        let addr =
            std::os::unix::net::SocketAddr::from_abstract_name(socket_name(&d).unwrap()).unwrap();
        let mut s = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
        s.write_all(b"sync /somewhere/else\n").unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    assert!(
        reply.starts_with("error asked about /somewhere/else"),
        "{reply:?}"
    );
    // The refusals are counted once their tasks finish.
    let deadline = Instant::now() + Duration::from_secs(5);
    let t = loop {
        let t = text(&e).await;
        if value(
            &t,
            "prjquota_exporter_announcements_total{result=\"refused\"}",
        ) == Some(2.0)
            || Instant::now() > deadline
        {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        value(
            &t,
            "prjquota_exporter_announcements_total{result=\"refused\"}"
        ),
        Some(2.0),
        "{t}"
    );

    // A second exporter of the same directory cannot listen, and says so.
    let second = exporter(&dir);
    let t = text(&second).await;
    assert_eq!(
        value(
            &t,
            &format!(
                "prjquota_exporter_announce_listening{{volumes_dir=\"{}\"}}",
                dir.display()
            )
        ),
        Some(0.0),
        "{t}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
