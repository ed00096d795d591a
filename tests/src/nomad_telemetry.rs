//! A Nomad agent's telemetry endpoint for the dashboards test: what
//! `GET /v1/metrics?format=prometheus` answers on an agent with
//! `telemetry { prometheus_metrics = true, publish_allocation_metrics =
//! true }`, for the allocations the test names. The series are those
//! client/allocrunner/taskrunner's emitStats sets, as go-metrics'
//! Prometheus sink writes them (a gauge per series, its name as its help,
//! labels `alloc_id`, `host`, `job`, `namespace`, `task`, `task_group`).
//! No Nomad binary is on the test machine; the rules under test read
//! nothing else of Nomad.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One running task of an allocation, as Nomad labels it.
pub struct Task<'a> {
    pub alloc_id: &'a str,
    pub job: &'a str,
    pub namespace: &'a str,
    pub task_group: &'a str,
    pub task: &'a str,
}

/// The exposition an agent on `host` gives for `tasks`.
pub fn exposition(host: &str, tasks: &[Task]) -> String {
    let mut out = String::new();
    for (name, value) in [
        ("nomad_client_allocs_cpu_total_ticks", 1234.0),
        ("nomad_client_allocs_memory_usage", 8_388_608.0),
    ] {
        out += &format!("# HELP {name} {name}\n# TYPE {name} gauge\n");
        for t in tasks {
            out += &format!(
                "{name}{{alloc_id=\"{}\",host=\"{host}\",job=\"{}\",namespace=\"{}\",task=\"{}\",task_group=\"{}\"}} {value}\n",
                t.alloc_id, t.job, t.namespace, t.task, t.task_group
            );
        }
    }
    out
}

/// The endpoint, serving one exposition until dropped.
pub struct Agent {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Nomad's path and query for the Prometheus format.
pub const METRICS_PATH: &str = "/v1/metrics";

impl Agent {
    pub fn serve(body: String) -> Agent {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the Nomad agent's port");
        let addr = listener.local_addr().expect("its address");
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(c) = conn {
                    answer(c, &body);
                }
            }
        });
        Agent {
            addr,
            stop,
            thread: Some(thread),
        }
    }

    /// The scrape config of a job for this agent, with its targets'
    /// labels, as Nomad's own Prometheus guide writes it (no
    /// `honor_labels`: Nomad's `job` label is kept as `exported_job`).
    pub fn scrape_config(&self, job: &str, labels: &[(&str, &str)]) -> String {
        let mut y = format!(
            "  - job_name: {job}\n    metrics_path: {METRICS_PATH}\n    params:\n      format: [prometheus]\n    static_configs:\n      - targets: [\"{}\"]\n",
            self.addr
        );
        if !labels.is_empty() {
            y += "        labels:\n";
            for (k, v) in labels {
                y += &format!("          {k}: {v}\n");
            }
        }
        y
    }
}

/// One request: the exposition for Nomad's path and query, 404 otherwise.
fn answer(mut c: TcpStream, body: &str) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
    let mut reader = BufReader::new(match c.try_clone() {
        Ok(r) => r,
        Err(_) => return,
    });
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    // The rest of the head.
    loop {
        let mut h = String::new();
        match reader.read_line(&mut h) {
            Ok(0) | Err(_) => break,
            Ok(_) if h == "\r\n" || h == "\n" => break,
            Ok(_) => {}
        }
    }
    let target = line.split_whitespace().nth(1).unwrap_or("");
    let ok = target == format!("{METRICS_PATH}?format=prometheus");
    let (status, body) = if ok {
        ("200 OK", body)
    } else {
        ("404 Not Found", "")
    };
    let _ = write!(
        c,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
