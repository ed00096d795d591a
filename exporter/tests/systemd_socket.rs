//! `--web.systemd-socket`: the exporter serves on the sockets systemd's
//! socket activation passes (through `systemd-socket-activate`, systemd's
//! own tool for it), ignoring `--web.listen-address`, and refuses to start,
//! naming the cause, when what it was passed is not a listening TCP socket.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use prjquota_core::record::State;

const A: &str = "5b1f7e3c-1111-4aaa-8bbb-000000000001";

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_prjquota-exporter"))
}

/// A port free a moment ago on 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn serves_on_the_socket_systemd_passes_and_ignores_listen_address() {
    let dir = fresh_dir(&std::env::temp_dir(), "systemd-socket");
    add_volume(&dir, record(A, "default", 4545, State::Ready));
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let _child = KillOnDrop(
        Command::new("systemd-socket-activate")
            .arg("--listen")
            .arg(addr.to_string())
            .arg(exe())
            .arg("--web.systemd-socket")
            // Ignored: nothing listens on port 1 afterwards.
            .args(["--web.listen-address", "127.0.0.1:1"])
            .arg("--volumes-dir")
            .arg(&dir)
            .args(["--ebpf=off", "--guard=off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run systemd-socket-activate (the systemd package; `cargo xtask deps`)"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    // The first connection makes systemd-socket-activate exec the exporter
    // on the socket that queued it.
    let health = loop {
        match prjquota_vmtests::http::http_get(addr, "/healthz", Duration::from_secs(10)) {
            Ok(r) if r.status == 200 => break r,
            r if Instant::now() > deadline => panic!("never ready on {addr}: {r:?}"),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert_eq!(health.status, 200);
    let m = get(addr, "/metrics");
    assert_eq!(m.status, 200, "{}", m.body);
    assert!(
        value(&m.body, "nomad_host_volume_provisioned_bytes{").is_some(),
        "{}",
        m.body
    );
    assert!(
        m.body.contains(&format!("volume_id=\"{A}\"")),
        "the volume is served: {}",
        m.body
    );
    assert!(
        std::net::TcpStream::connect("127.0.0.1:1").is_err(),
        "--web.listen-address was not ignored"
    );
}

/// The exporter (exec'd by systemd-socket-activate), ended with the test
/// even when an assertion fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the exporter with `--web.systemd-socket` through `sh -c script`
/// (which ends in `exec "$0" "$@"`), and returns its exit status and stderr.
fn refused(script: &str) -> (std::process::ExitStatus, String) {
    let dir = fresh_dir(&std::env::temp_dir(), "systemd-socket-refused");
    let out = Command::new("sh")
        .args(["-c", script])
        .arg(exe())
        .arg("--web.systemd-socket")
        .arg("--volumes-dir")
        .arg(&dir)
        .args(["--ebpf=off", "--guard=off"])
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDS")
        .stdin(Stdio::null())
        .output()
        .expect("run sh");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn refuses_to_start_without_a_listening_tcp_socket_from_systemd() {
    for (script, says) in [
        (
            "exec \"$0\" \"$@\"",
            "systemd passed no socket ($LISTEN_PID and $LISTEN_FDS are unset)",
        ),
        (
            "LISTEN_PID=1 LISTEN_FDS=1 exec \"$0\" \"$@\"",
            "$LISTEN_PID is 1, not this process",
        ),
        (
            "LISTEN_PID=$$ LISTEN_FDS=0 exec \"$0\" \"$@\"",
            "$LISTEN_FDS=0",
        ),
        (
            "LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" \"$@\" 3</dev/null",
            "fd 3 from systemd is another kind of socket",
        ),
        (
            "LISTEN_PID=$$ LISTEN_FDS=many exec \"$0\" \"$@\"",
            "many\\\", not a count",
        ),
    ] {
        let (status, stderr) = refused(script);
        assert!(!status.success(), "{script}: started");
        assert!(stderr.contains(says), "{script}: {says:?} not in {stderr}");
        assert!(stderr.contains("--web.systemd-socket"), "{stderr}");
    }
}
