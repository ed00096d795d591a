//! A systemd pass (`crate::systemd`) as a pass of the run: its boots'
//! libtest summaries counted.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::process::header;

use super::packages::TestRepos;
use super::results::{failed_in_boot, Counts, Pass};

/// What the systemd passes need from the build.
pub(super) struct SystemdJob {
    pub(super) test_bin: PathBuf,
    pub(super) deb: PathBuf,
    pub(super) rpm: PathBuf,
    /// The .rpm again as release 2, its binaries told apart
    /// ([`newer_rpm`]): what an upgrade installs.
    pub(super) newer_rpm: PathBuf,
    /// The signed repositories it installs and upgrades from.
    pub(super) repos: TestRepos,
    pub(super) attr_act: PathBuf,
    /// The boots of each pass (`crate::systemd::passes`).
    pub(super) passes: Vec<Vec<crate::systemd::Planned>>,
}

/// The boots of one systemd pass (xtask/src/systemd.rs) as a pass: the
/// libtest summaries of tests/tests/systemd.rs in the guest, every test of
/// every boot of `planned` passed.
pub(super) fn systemd_pass(planned: &[crate::systemd::Planned], job: &SystemdJob) -> Pass {
    let kernel = planned[0].0;
    header(&format!(
        "systemd pass on kernel {}: {}, on a Debian root booted with systemd as init",
        kernel.name(),
        crate::systemd::story_of(planned)
    ));
    let name = format!(
        "systemd {}",
        crate::systemd::kernels_of(planned).join(" > ")
    );
    let t = Instant::now();
    let in_guest = |p: &Path| {
        format!(
            "/prjquota-test/{}",
            p.file_name().unwrap_or_default().to_string_lossy()
        )
    };
    // The real Prometheus scrapes the packaged service with the shipped
    // rules and config: Prometheus 3 from `cargo xtask deps`, installed in
    // the root where its Debian package puts it.
    let prometheus = crate::deps::prometheus3_binary();
    let promtool = prometheus.with_file_name("promtool");
    let boots = if !crate::process::is_executable(&prometheus)
        || !crate::process::is_executable(&promtool)
    {
        Err(anyhow::anyhow!(
            "{} or {} is missing: run `cargo xtask deps` (the systemd pass runs Prometheus 3)",
            prometheus.display(),
            promtool.display()
        ))
    } else {
        crate::systemd::boots(
            planned,
            &job.test_bin,
            &[
                &job.deb,
                &job.rpm,
                &job.newer_rpm,
                &job.attr_act,
                &job.repos.apt,
                &job.repos.apt_newer,
                &job.repos.apt_forged,
                &job.repos.yum,
            ],
            &[
                (&prometheus, "/usr/bin/prometheus"),
                (&promtool, "/usr/bin/promtool"),
            ],
            &[
                ("PRJQUOTA_DEB", in_guest(&job.deb)),
                ("PRJQUOTA_RPM", in_guest(&job.rpm)),
                ("PRJQUOTA_NEWER_RPM", in_guest(&job.newer_rpm)),
                ("PRJQUOTA_APT", in_guest(&job.repos.apt)),
                ("PRJQUOTA_APT_NEWER", in_guest(&job.repos.apt_newer)),
                ("PRJQUOTA_APT_FORGED", in_guest(&job.repos.apt_forged)),
                ("PRJQUOTA_YUM", in_guest(&job.repos.yum)),
                ("PRJQUOTA_BIN_DIR", "/prjquota-test".into()),
                ("PRJQUOTA_PROMETHEUS3", "/usr/bin/prometheus".into()),
            ],
        )
    };
    let secs = t.elapsed().as_secs_f64();
    println!(
        "xtask: systemd pass on kernel {} took {secs:.0}s",
        kernel.name()
    );
    let boots = match boots {
        Ok(b) => b,
        Err(e) => {
            return Pass {
                name,
                summary: None,
                counts: Counts::default(),
                ok: false,
                secs,
                problems: vec![format!("systemd VM: {e:#}")],
                failures: Vec::new(),
            }
        }
    };
    // libtest: "test result: ok. 1 passed; 0 failed; …", one per test run.
    let count = |line: &str, word: &str| {
        line.split(';')
            .find(|p| p.trim_end().ends_with(word))
            .and_then(|p| p.split_whitespace().rev().nth(1))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let (mut passed, mut failed) = (0, 0);
    let mut problems = Vec::new();
    let mut summaries = Vec::new();
    let mut failures = Vec::new();
    for (n, b) in boots.iter().enumerate() {
        for l in b.lines.iter().filter(|l| l.starts_with("test result: ")) {
            passed += count(l, "passed");
            failed += count(l, "failed");
        }
        if b.status != Some(0) {
            let tests = planned.get(n).map_or(&[][..], |(_, t)| *t);
            if let Some(t) = failed_in_boot(tests, &b.lines) {
                failures.push(format!("boot {}: {t}", n + 1));
            }
        }
        summaries.push(format!("boot {} {:.0}s", n + 1, b.secs));
        if b.status != Some(0) {
            problems.push(format!(
                "boot {}: a test of the guest's test binary exited with {:?}",
                n + 1,
                b.status
            ));
        }
    }
    let expected: usize = planned.iter().map(|(_, tests)| tests.len()).sum();
    if boots.len() < planned.len() {
        problems.push(format!(
            "{} of {} boots ran: each starts from the state the one before left",
            boots.len(),
            planned.len()
        ));
    }
    if passed != expected as u64 {
        problems.push(format!("{passed} of {expected} tests passed"));
    }
    Pass {
        name,
        ok: problems.is_empty() && failed == 0,
        summary: Some(format!(
            "{passed} passed; {failed} failed ({})",
            summaries.join(", ")
        )),
        counts: Counts {
            run: passed + failed,
            passed,
            failed,
        },
        secs,
        problems,
        failures,
    }
}
