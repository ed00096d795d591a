//! The exporter's half of the plugin's announcements (`prjquota_core::announce`):
//! a create that made a new volume asks the exporter to register it with
//! the eBPF programs before Nomad hears the volume exists, so its first
//! write is counted and its project ID guarded. Without this the exporter
//! would learn of the volume at its next scrape.
//!
//! The same socket answers `prjquota reconcile --nomad`'s question, which
//! of the directory's volumes Nomad knows ([`crate::nomad::volumes`]),
//! when the exporter has a Nomad client.
//!
//! One listener per volumes directory, on the abstract socket the plugin
//! derives from that directory. Only root may ask (`SO_PEERCRED`): the
//! name is not a file and carries no permissions. Announcements that arrive
//! together share one registration, so a restore storm of a thousand
//! creates costs a few registry reads, not a thousand.

use std::os::linux::net::SocketAddrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prjquota_core::announce::{canonical, parse_request, socket_name, Request, MAX_LINE};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::collector::Exporter;

/// How long a connected client has to send its line.
const READ_DEADLINE: Duration = Duration::from_secs(5);

/// Announcements served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 64;

type Waiter = oneshot::Sender<Result<(), String>>;

/// Starts a listener for each volumes directory and the task that
/// registers what they announce. A directory whose socket cannot be bound
/// (another exporter of it runs, a squatter holds the name, or its path is
/// too long for a socket name) is logged, shown as not listening, and
/// tried again every [`REBIND_EVERY`]: a squatter that leaves, or an old
/// exporter that exits during an upgrade, frees the name for this one.
pub fn start(exporter: Arc<Exporter>, dirs: &[PathBuf]) {
    let (tx, rx) = mpsc::unbounded_channel::<Waiter>();
    tokio::spawn(register_loop(exporter.clone(), rx));
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    for (i, dir) in dirs.iter().enumerate() {
        // Bound before start() returns: a create that announces right after
        // the exporter started finds the socket (and waits for the warm-up).
        let first = bind(dir);
        tokio::spawn(listen(
            i,
            dir.clone(),
            first,
            exporter.clone(),
            tx.clone(),
            permits.clone(),
        ));
    }
}

/// How often a name that could not be bound is tried again.
const REBIND_EVERY: Duration = Duration::from_secs(5);

/// Binds the socket of directory `i`, trying again until it can, then
/// serves it.
async fn listen(
    i: usize,
    dir: PathBuf,
    first: std::io::Result<UnixListener>,
    exporter: Arc<Exporter>,
    tx: mpsc::UnboundedSender<Waiter>,
    permits: Arc<Semaphore>,
) {
    let mut logged = false;
    let mut attempt = Some(first);
    let listener = loop {
        match attempt.take().unwrap_or_else(|| bind(&dir)) {
            Ok(listener) => break listener,
            Err(e) => {
                if !logged {
                    crate::warn!(
                        "not listening for the plugin's announcements of new volumes: a new volume's writes are counted from the next registry sync; trying again every 5s",
                        volumes_dir = dir.display().to_string(),
                        err = e
                    );
                    logged = true;
                }
                tokio::time::sleep(REBIND_EVERY).await;
            }
        }
    };
    if logged {
        crate::info!(
            "bound the announcement socket: new volumes are counted from their create",
            volumes_dir = dir.display().to_string()
        );
    }
    exporter.announcements.set_listening(i);
    accept_loop(listener, dir, exporter, tx, permits).await;
}

fn bind(dir: &Path) -> std::io::Result<UnixListener> {
    let name = socket_name(dir).ok_or_else(|| {
        std::io::Error::other("the volumes directory's path is too long for a socket name")
    })?;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name)?;
    let std_listener = std::os::unix::net::UnixListener::bind_addr(&addr).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            std::io::Error::other(
                "another prjquota-exporter listens for this volumes directory already",
            )
        } else {
            e
        }
    })?;
    std_listener.set_nonblocking(true)?;
    UnixListener::from_std(std_listener)
}

/// Registers once per batch: every announcement waiting when a
/// registration starts is answered by it; those that arrive during it wait
/// for the next, which reads the registry after their volume was recorded.
async fn register_loop(exporter: Arc<Exporter>, mut rx: mpsc::UnboundedReceiver<Waiter>) {
    while let Some(first) = rx.recv().await {
        // Before the warm-up finishes, the programs are not loaded; the
        // registration after it sees every volume.
        exporter.wait_ready().await;
        let mut batch = vec![first];
        while let Ok(w) = rx.try_recv() {
            batch.push(w);
        }
        let result = exporter
            .register_volumes()
            .await
            .map_err(|e| format!("{e:#}"));
        let stats = &exporter.announcements;
        match &result {
            Ok(()) => stats.registered(batch.len()),
            Err(e) => {
                crate::warn!(
                    "registering announced volumes failed: they are retried at the next scrape",
                    announcements = batch.len(),
                    err = e
                );
                stats.failed(batch.len())
            }
        };
        crate::debug!("announced volumes registered", announcements = batch.len());
        for w in batch {
            let _ = w.send(result.clone());
        }
    }
}

async fn accept_loop(
    listener: UnixListener,
    dir: PathBuf,
    exporter: Arc<Exporter>,
    tx: mpsc::UnboundedSender<Waiter>,
    permits: Arc<Semaphore>,
) {
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                crate::warn!(
                    "accepting a plugin announcement failed",
                    volumes_dir = dir.display().to_string(),
                    err = e
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (dir, exporter, tx) = (dir.clone(), exporter.clone(), tx.clone());
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(why) = serve(stream, &dir, &exporter, &tx).await {
                exporter.announcements.refused();
                crate::warn!(
                    "refused a plugin announcement",
                    volumes_dir = dir.display().to_string(),
                    err = why
                );
            }
        });
    }
}

/// Serves one connection; `Err` when the request was refused.
async fn serve(
    mut stream: UnixStream,
    dir: &Path,
    exporter: &Exporter,
    tx: &mpsc::UnboundedSender<Waiter>,
) -> Result<(), String> {
    let cred = stream
        .peer_cred()
        .map_err(|e| format!("cannot tell who is asking: {e}"))?;
    if cred.uid() != 0 {
        // Say nothing to a process that is not root.
        return Err(format!(
            "the peer runs as uid {} (pid {:?}), not root",
            cred.uid(),
            cred.pid()
        ));
    }
    let mut line = String::new();
    let (read, mut write) = stream.split();
    let got = tokio::time::timeout(
        READ_DEADLINE,
        BufReader::new(read.take(MAX_LINE as u64)).read_line(&mut line),
    )
    .await;
    let asked = match got {
        Err(_) => Err("no request within 5s".to_string()),
        Ok(Err(e)) => Err(format!("reading the request: {e}")),
        Ok(Ok(_)) => match parse_request(&line) {
            Ok(asked) if canonical(asked.volumes_dir()) == canonical(dir) => Ok(asked),
            Ok(asked) => Err(format!(
                "asked about {}, but this socket is for {}",
                asked.volumes_dir().display(),
                dir.display()
            )),
            Err(e) => Err(e),
        },
    };
    let asked = match asked {
        Ok(a) => a,
        Err(why) => {
            let _ = write.write_all(format!("error {why}\n").as_bytes()).await;
            return Err(why);
        }
    };
    let reply = match asked {
        Request::Sync(_) => {
            let (done, wait) = oneshot::channel();
            tx.send(done)
                .map_err(|_| "the registration task has stopped".to_string())?;
            match wait.await {
                Ok(Ok(())) => "ok\n".to_string(),
                Ok(Err(e)) => format!("error {}\n", e.replace('\n', " ")),
                Err(_) => "error the registration task has stopped\n".to_string(),
            }
        }
        Request::NomadVolumes(_) => match nomad_volumes(exporter, dir).await {
            Ok(json) => json + "\n",
            Err(e) => format!("error {}\n", e.replace('\n', " ")),
        },
    };
    // The plugin may have given up waiting: nothing to do about it.
    let _ = write.write_all(reply.as_bytes()).await;
    Ok(())
}

/// Which of the Ready volumes of `dir` Nomad knows, as one JSON line.
async fn nomad_volumes(exporter: &Exporter, dir: &Path) -> Result<String, String> {
    let Some(nomad) = exporter.nomad() else {
        return Err(
            "this prjquota-exporter has no Nomad client: start it with --nomad.addr (or \
             NOMAD_ADDR) and a token that may read host volumes (docs/nomad.md)"
                .into(),
        );
    };
    let (inv, loaded) = exporter.inventory().await;
    loaded.map_err(|e| format!("{e:#}"))?;
    let Some(d) = inv
        .dirs
        .iter()
        .position(|d| canonical(&d.path) == canonical(dir))
    else {
        return Err(format!(
            "{} is not a volumes directory of this exporter",
            dir.display()
        ));
    };
    let volumes: Vec<_> = inv.volumes.iter().filter(|v| v.dir == d).cloned().collect();
    let answer = nomad.volumes(&volumes).await?;
    serde_json::to_string(&answer).map_err(|e| e.to_string())
}
