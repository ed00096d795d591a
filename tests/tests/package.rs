//! The `.deb` that `cargo xtask dist` makes, installed with `dpkg -i` into
//! the guest as an operator installs it (README, "Install on a Nomad
//! client"), checked, then purged.
//!
//! Where it installs: the guest's root is the host's, shared read-only over
//! 9p, and virtme-ng lays tmpfs-backed overlays over /etc, /usr, /var and a
//! few more (`virtme_rw_overlay*=` on the guest's kernel command line), so
//! a plain `dpkg -i` may well work in the guest (not tried). It would also
//! change the root
//! that every other test of the boot runs on, in parallel, and leave no
//! record to check "the purge left nothing" against; and `dpkg --root` into
//! an empty directory would install against an empty package database,
//! with no systemd to verify the unit. So the test mounts an overlay of its
//! own: the lower layer is the guest's root file system alone (a bind of
//! `/`), the upper a tmpfs; it binds /proc, /sys, /dev and /run into it and
//! runs dpkg, systemctl and systemd-analyze chrooted there. The install is
//! real (Debian's own package database and systemd, the host's), its writes
//! stay in memory, and the upper layer is the exact record of what dpkg
//! wrote: after the purge, only dpkg's own bookkeeping may be there.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use prjquota_vmtests::nomad::run_plugin;
use prjquota_vmtests::{in_vm, scratch_dir, vm_env, xfs_mount};

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The package's man pages trigger man-db, whose `mandb` over the whole
/// guest root (the host's) runs for many minutes under emulation; turned
/// off in the overlay as `man-db/auto-update false` does. A Debian root of
/// the systemd pass has no man-db.
const MAN_DB_AUTO_UPDATE: &str = "var/lib/man-db/auto-update";
const UNIT: &str = "usr/lib/systemd/system/prjquota-exporter.service";
const EXPORTER: &str = "usr/bin/prjquota-exporter";
/// The dashboards' renderer, apart from the plugin Nomad runs.
const RENDERER: &str = "usr/bin/prjquota-dashboards";
const PLUGIN: &str = "usr/lib/prjquota/prjquota";
const ADMIN: &str = "usr/bin/prjquota";
const GENERATOR: &str = "usr/lib/systemd/system-generators/prjquota-exporter-generator";
const CONFFILE: &str = "etc/default/prjquota";
/// The .rpm's settings, where the RPM family keeps them.
const CONFFILE_RPM: &str = "etc/sysconfig/prjquota";
/// The nomad.service drop-in the package ships, not active.
const NOMAD_DROP_IN: &str = "usr/share/doc/prjquota/nomad-requires-prjquota.conf";
/// Nomad's default host_volume_plugin_dir, PLUGIN_DIR's default.
const PLUGIN_DIR: &str = "opt/nomad/data/host_volume_plugins";
const DASHBOARD: &str = "usr/share/prjquota/dashboards/prjquota.json";
const RULES: &str = "usr/share/prjquota/rules/prjquota-alerts.yaml";
/// The dashboards' default config, which `prjquota-dashboards render`
/// reads when given no --config (`prjquota_dashboards::cli::DEFAULT_CONFIG`).
const DASHBOARDS_CONFIG: &str = "usr/share/prjquota/dashboards/config.toml";
/// Where Debian's zsh (zsh-common) and Fedora's look for packaged
/// completions.
const ZSH_DEB: &str = "usr/share/zsh/vendor-completions";
const ZSH_RPM: &str = "usr/share/zsh/site-functions";

/// The commands the package puts on PATH, each with its man page and
/// completions.
const COMMANDS: [&str; 3] = ["prjquota", "prjquota-exporter", "prjquota-dashboards"];

/// Each command's bash, zsh and fish completions, zsh's in `zsh_dir`.
fn completions(zsh_dir: &str) -> Vec<String> {
    COMMANDS
        .iter()
        .flat_map(|c| {
            [
                format!("usr/share/bash-completion/completions/{c}"),
                format!("{zsh_dir}/_{c}"),
                format!("usr/share/fish/vendor_completions.d/{c}.fish"),
            ]
        })
        .collect()
}

/// The guest's root under an overlay of its own, writable, its writes in a
/// tmpfs; unmounted on drop.
struct ScratchRoot {
    base: PathBuf,
    /// The guest's root file system alone (a non-recursive bind: no /tmp,
    /// /proc… submounts), the overlay's lower layer.
    lower: PathBuf,
    /// What the overlay wrote.
    upper: PathBuf,
    /// The overlay: where the chrooted commands run.
    root: PathBuf,
}

impl ScratchRoot {
    fn new() -> ScratchRoot {
        let base = PathBuf::from(format!("/tmp/prjquota-pkgroot-{}", std::process::id()));
        let (lower, rw, root) = (base.join("lower"), base.join("rw"), base.join("root"));
        for d in [&lower, &rw, &root] {
            std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
        }
        let r = ScratchRoot {
            upper: rw.join("upper"),
            lower,
            root,
            base,
        };
        prjquota_vmtests::sh(&format!(
            "set -e; mount --bind -o ro / {lower}; mount -t tmpfs -o size=512m tmpfs {rw}; \
             mkdir {rw}/upper {rw}/work; \
             mount -t overlay overlay -o lowerdir={lower},upperdir={rw}/upper,workdir={rw}/work {root}; \
             for d in proc sys dev run; do mount --rbind /$d {root}/$d; done; \
             rm -f {root}/{MAN_DB_AUTO_UPDATE}",
            lower = r.lower.display(),
            rw = rw.display(),
            root = r.root.display(),
        ));
        r
    }

    /// `path` (relative to /) inside the overlay.
    fn at(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// Runs `argv` chrooted into the overlay.
    fn chroot(&self, argv: &[&str]) -> Output {
        Command::new("chroot")
            .arg(&self.root)
            .args(argv)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .unwrap_or_else(|e| panic!("chroot {} {argv:?}: {e}", self.root.display()))
    }

    /// As [`Self::chroot`], and panics with its output unless it succeeds;
    /// returns stdout and stderr together.
    fn chroot_ok(&self, argv: &[&str]) -> String {
        let out = self.chroot(argv);
        let text = text(&out);
        assert!(
            out.status.success(),
            "{argv:?} failed ({}):\n{text}",
            out.status
        );
        text
    }

    /// Files (and symlinks, devices) the overlay's upper layer holds,
    /// relative to /, and directories it holds that the root did not have.
    fn written(&self) -> (Vec<String>, Vec<String>) {
        let (mut files, mut new_dirs) = (Vec::new(), Vec::new());
        let mut stack = vec![self.upper.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir)
                .expect("read the upper layer")
                .flatten()
            {
                let p = e.path();
                let rel = p
                    .strip_prefix(&self.upper)
                    .expect("under the upper layer")
                    .to_string_lossy()
                    .into_owned();
                if e.file_type().expect("file type").is_dir() {
                    if !self.lower.join(&rel).is_dir() {
                        new_dirs.push(rel);
                    }
                    stack.push(p);
                } else {
                    files.push(rel);
                }
            }
        }
        files.sort();
        new_dirs.sort();
        (files, new_dirs)
    }
}

impl Drop for ScratchRoot {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-R").arg(&self.root).status();
        let _ = Command::new("umount").arg(self.base.join("rw")).status();
        let _ = Command::new("umount").arg(&self.lower).status();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The .deb of this run's `cargo xtask dist`.
fn deb() -> PathBuf {
    let deb = PathBuf::from(vm_env("PRJQUOTA_DEB"));
    assert!(
        deb.is_file(),
        "PRJQUOTA_DEB={} is not a file: `cargo xtask test` builds one \
         when binary(package) is selected",
        deb.display()
    );
    assert_eq!(
        deb.file_name().unwrap().to_string_lossy(),
        format!("prjquota_{VERSION}-1_amd64.deb"),
        "the .deb's name is the one the README tells operators to install"
    );
    deb
}

fn assert_mode(path: &Path, mode: u32) {
    let m = std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{} is not installed: {e}", path.display()));
    assert!(
        m.file_type().is_file(),
        "{} is not a regular file ({:?}): Nomad 2.0.1+ refuses a symlinked plugin, and an \
         operator copies these files",
        path.display(),
        m.file_type()
    );
    assert_eq!(
        m.permissions().mode() & 0o7777,
        mode,
        "{} has mode {:o}, not {mode:o}",
        path.display(),
        m.permissions().mode() & 0o7777
    );
}

fn assert_static(path: &Path) {
    let out = Command::new("ldd").arg(path).output().expect("run ldd");
    let t = text(&out);
    assert!(
        t.contains("not a dynamic executable") || t.contains("statically linked"),
        "{} is dynamically linked (ldd: {}): the release binaries must need no libc of \
         the client's (`cargo xtask dist` links glibc statically)",
        path.display(),
        t.trim()
    );
}

#[test]
fn the_deb_installs_its_unit_verifies_and_a_purge_leaves_nothing() {
    assert!(
        in_vm(),
        "the package test runs in the VM: `cargo xtask test`"
    );
    let deb = deb();
    let t = std::time::Instant::now();
    let lap = |what: &str| {
        eprintln!(
            "MEASURE package_{what}_at_seconds {:.1}",
            t.elapsed().as_secs_f64()
        )
    };
    let root = ScratchRoot::new();

    // The root the package goes into has none of it yet.
    let before = root.chroot(&["dpkg-query", "-W", "prjquota"]);
    assert!(
        !before.status.success(),
        "prjquota is already in the guest's package database: {}",
        text(&before)
    );
    for p in [EXPORTER, PLUGIN, UNIT] {
        assert!(
            std::fs::symlink_metadata(root.at(p)).is_err(),
            "/{p} exists before the install (installed on the host by hand?)"
        );
    }

    // A Nomad client's plugin directory: the package puts the plugin there.
    std::fs::create_dir_all(root.at(PLUGIN_DIR)).expect("mkdir the plugin directory");

    // Install.
    let deb_in_root = deb.to_string_lossy().into_owned();
    lap("before_install");
    let out = root.chroot_ok(&["dpkg", "-i", &deb_in_root]);
    eprintln!("dpkg -i:\n{out}");
    lap("installed");
    let status = root.chroot_ok(&["dpkg-query", "-W", "-f", "${Status} ${Version}", "prjquota"]);
    assert_eq!(status, format!("install ok installed {VERSION}-1"));

    // The files land where docs/install.md says.
    let install_md = include_str!("../../docs/install.md");
    for p in [
        EXPORTER,
        PLUGIN,
        ADMIN,
        RENDERER,
        CONFFILE,
        "usr/share/prjquota/",
    ] {
        assert!(
            install_md.contains(&format!("/{p}")),
            "docs/install.md does not say that the .deb installs /{p}"
        );
    }
    assert_mode(&root.at(EXPORTER), 0o755);
    assert_mode(&root.at(PLUGIN), 0o755);
    assert_mode(&root.at(ADMIN), 0o755);
    assert_mode(&root.at(RENDERER), 0o755);
    assert_mode(&root.at(GENERATOR), 0o755);
    assert_mode(&root.at(CONFFILE), 0o644);
    // The plugin Nomad runs: the package's, a regular file.
    let nomads = format!("{PLUGIN_DIR}/prjquota");
    assert_mode(&root.at(&nomads), 0o755);
    assert!(
        std::fs::read(root.at(&nomads)).unwrap() == std::fs::read(root.at(PLUGIN)).unwrap(),
        "/{nomads} is not the package's plugin"
    );
    assert!(
        out.contains(&format!("installed the plugin as /{nomads}")),
        "dpkg -i did not say where it put the plugin:\n{out}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(root.at(PLUGIN_DIR))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != "prjquota")
        .collect();
    assert!(
        leftovers.is_empty(),
        "the install left files in the plugin directory, which Nomad would fingerprint as \
         plugins: {leftovers:?}"
    );
    // dpkg's own records: every file's checksum matches, and the
    // settings are a conffile (kept across upgrades).
    let verify = root.chroot_ok(&["dpkg", "--verify", "prjquota"]);
    assert_eq!(verify.trim(), "", "dpkg --verify prjquota");
    let conffiles = root.chroot_ok(&["dpkg-query", "-W", "-f", "${Conffiles}", "prjquota"]);
    assert!(
        conffiles.contains(&format!("/{CONFFILE} ")),
        "/{CONFFILE} is not a conffile: {conffiles}"
    );
    assert!(
        std::fs::symlink_metadata(root.at("usr/share/doc/prjquota/changelog.Debian.gz")).is_ok(),
        "no Debian changelog"
    );
    // Every page the README links, where its links find them, and the
    // bill of materials of what the executables link.
    let readme = include_str!("../../README.md");
    for link in readme.split("](").skip(1) {
        let target = link.split(')').next().unwrap().split('#').next().unwrap();
        if target.is_empty() || target.contains("://") || target == "LICENSE" {
            continue;
        }
        assert_mode(&root.at(&format!("usr/share/doc/prjquota/{target}")), 0o644);
    }
    let sbom: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.at("usr/share/doc/prjquota/prjquota.cdx.json")).unwrap(),
    )
    .expect("the packaged SBOM is JSON");
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(
        sbom["dependencies"].as_array().map(Vec::len),
        Some(COMMANDS.len()),
        "the SBOM lists what each executable links"
    );
    // The drop-in that makes nomad.service require the exporter ships as
    // an example and is not active: no nomad.service.d holds it.
    assert_mode(&root.at(NOMAD_DROP_IN), 0o644);
    let drop_in = std::fs::read_to_string(root.at(NOMAD_DROP_IN)).unwrap();
    for needle in [
        "Requires=prjquota-exporter.service",
        "After=prjquota-exporter.service",
    ] {
        assert!(
            drop_in.lines().any(|l| l == needle),
            "/{NOMAD_DROP_IN} lacks {needle}:\n{drop_in}"
        );
    }
    for dir in [
        "etc/systemd/system/nomad.service.d",
        "usr/lib/systemd/system/nomad.service.d",
        "run/systemd/system/nomad.service.d",
    ] {
        assert!(
            std::fs::symlink_metadata(root.at(dir)).is_err(),
            "the install made /{dir}: the nomad.service drop-in is opt-in"
        );
    }
    for page in COMMANDS {
        let p = format!("usr/share/man/man1/{page}.1.gz");
        assert_mode(&root.at(&p), 0o644);
    }
    // Shell completions where each shell looks, and bash (as
    // bash-completion would) loads them and completes both commands.
    for p in completions(ZSH_DEB) {
        assert_mode(&root.at(&p), 0o644);
    }
    for c in COMMANDS {
        let loaded = root.chroot_ok(&[
            "bash",
            "-c",
            &format!(". /usr/share/bash-completion/completions/{c} && complete -p {c}"),
        ]);
        assert!(
            loaded.contains(&format!(" {c}")),
            "bash loaded no completion for {c}: {loaded}"
        );
    }
    let fish = std::fs::read_to_string(
        root.at("usr/share/fish/vendor_completions.d/prjquota-exporter.fish"),
    )
    .unwrap();
    assert!(
        fish.contains("-l web.listen-address"),
        "the exporter's fish completions lack its flags:\n{fish}"
    );
    assert_mode(&root.at(UNIT), 0o644);
    assert_mode(&root.at(DASHBOARD), 0o644);
    assert_mode(&root.at(RULES), 0o644);
    assert_mode(&root.at(DASHBOARDS_CONFIG), 0o644);
    assert_eq!(
        format!("/{DASHBOARDS_CONFIG}"),
        prjquota_dashboards::cli::DEFAULT_CONFIG,
        "the package ships the dashboards config where the command looks"
    );
    // dpkg installed exactly the binaries the .deb was built from: by
    // default (a test .deb, see `cargo xtask test`) the static release
    // plugin and this run's debug exporter; with --release-deb both static
    // release binaries, whose static linking `cargo xtask dist` checks.
    let built_from = PathBuf::from(vm_env("PRJQUOTA_DEB_BINS"));
    for (installed, name) in [
        (PLUGIN, "prjquota"),
        (EXPORTER, "prjquota-exporter"),
        (RENDERER, "prjquota-dashboards"),
    ] {
        assert!(
            std::fs::read(root.at(installed)).unwrap()
                == std::fs::read(built_from.join(name)).unwrap(),
            "/{installed} is not the {name} the .deb was built from ({})",
            built_from.display()
        );
    }
    assert_static(&root.at(PLUGIN));
    let dashboard: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.at(DASHBOARD)).unwrap())
            .expect("the packaged dashboard is JSON");
    assert!(dashboard["panels"].is_array(), "the dashboard has panels");
    let rules = std::fs::read_to_string(root.at(RULES)).unwrap();
    assert!(
        rules.contains("groups:") && rules.contains("alert: "),
        "the packaged rules hold alert groups"
    );
    let unit = std::fs::read_to_string(root.at(UNIT)).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/prjquota-exporter "),
        "the packaged unit runs the packaged exporter, /usr/bin/prjquota-exporter"
    );

    // Installed, not enabled: the operator sets --volumes-dir first.
    let enabled = root.chroot(&["systemctl", "is-enabled", "prjquota-exporter.service"]);
    assert_eq!(
        String::from_utf8_lossy(&enabled.stdout).trim(),
        "disabled",
        "systemctl is-enabled: {}",
        text(&enabled)
    );
    let wants = Command::new("find")
        .arg(root.at("etc/systemd/system"))
        .args(["-name", "*prjquota*"])
        .output()
        .expect("find");
    assert_eq!(text(&wants).trim(), "", "the install enabled the unit");

    // systemd's own check of the installed unit (it also checks that
    // ExecStart's binary exists and is executable).
    lap("files_checked");
    let verify = root.chroot(&["systemd-analyze", "verify", &format!("/{UNIT}")]);
    lap("verified");
    let said = text(&verify);
    eprintln!("systemd-analyze verify /{UNIT}: {}\n{said}", verify.status);
    assert!(
        verify.status.success(),
        "systemd-analyze verify /{UNIT} failed ({}):\n{said}",
        verify.status
    );
    let about_unit: Vec<&str> = said.lines().filter(|l| l.contains("prjquota")).collect();
    assert!(
        about_unit.is_empty(),
        "systemd-analyze verify warns about the packaged unit \
         (deploy/systemd/prjquota-exporter.service, staged by xtask/src/dist.rs):\n{}",
        about_unit.join("\n")
    );

    // The installed binaries run.
    let v = root.chroot_ok(&["/usr/bin/prjquota-exporter", "--version"]);
    assert!(
        v.starts_with(&format!("prjquota-exporter {VERSION} (revision ")),
        "{v}"
    );
    let v = root.chroot_ok(&["/usr/bin/prjquota", "--version"]);
    assert_eq!(v.trim(), format!("prjquota {VERSION}"));
    // From the installed default config, the installed command renders
    // exactly the dashboard and rules the package ships.
    root.chroot_ok(&[
        "/usr/bin/prjquota-dashboards",
        "render",
        "--out",
        "/tmp/prjquota-dashboards",
    ]);
    for (shipped, name) in [(DASHBOARD, "prjquota.json"), (RULES, "alerts.yaml")] {
        assert!(
            std::fs::read(root.at(shipped)).unwrap()
                == std::fs::read(root.at("tmp/prjquota-dashboards").join(name)).unwrap(),
            "prjquota-dashboards render gave another {name} than /{shipped}"
        );
    }
    // The render is the test's, not the package's: the purge's check below
    // counts what is left outside dpkg's records.
    std::fs::remove_dir_all(root.at("tmp/prjquota-dashboards")).unwrap();
    // The plugin, installed into a plugin directory by the one-liner of
    // docs/install.md, answers Nomad's fingerprint with its version.
    let plugin_dir = scratch_dir(&xfs_mount(), "pkg-plugins");
    let installed = plugin_dir.join("prjquota");
    let one_liner = hand_install_line()
        .replace(
            "/opt/nomad/data/host_volume_plugins",
            &plugin_dir.to_string_lossy(),
        )
        .replace(
            "/usr/lib/prjquota/prjquota",
            &root.at(PLUGIN).to_string_lossy(),
        );
    prjquota_vmtests::sh(&one_liner);
    assert_mode(&installed, 0o755);
    let fp = run_plugin(
        &installed,
        "fingerprint",
        &[("DHV_OPERATION", "fingerprint".into())],
        prjquota_vmtests::nomad::TEST_DEADLINE,
    );
    fp.ok();
    assert_eq!(fp.json()["version"], VERSION, "fingerprint: {}", fp.stdout);

    lap("ran");
    // Remove, then purge: nothing of the package is left.
    let files = root.chroot_ok(&["dpkg", "-L", "prjquota"]);
    let removed = root.chroot_ok(&["dpkg", "-r", "prjquota"]);
    assert!(
        removed.contains(&format!("left /{nomads} in place")),
        "dpkg -r did not say that it leaves Nomad's plugin:\n{removed}"
    );
    assert_mode(&root.at(&nomads), 0o755);
    assert!(
        std::fs::symlink_metadata(root.at(CONFFILE)).is_ok(),
        "dpkg -r removed the settings (only a purge does)"
    );
    for p in [
        EXPORTER,
        PLUGIN,
        ADMIN,
        RENDERER,
        GENERATOR,
        UNIT,
        DASHBOARD,
        RULES,
        DASHBOARDS_CONFIG,
    ] {
        assert!(
            std::fs::symlink_metadata(root.at(p)).is_err(),
            "/{p} is still there after dpkg -r"
        );
    }
    lap("removed");
    root.chroot_ok(&["dpkg", "-P", "prjquota"]);
    lap("purged");
    assert!(
        std::fs::symlink_metadata(root.at(CONFFILE)).is_err(),
        "/{CONFFILE} is left after the purge"
    );
    // Nomad's copy stays: volumes made with it need it to be deleted.
    assert_mode(&root.at(&nomads), 0o755);
    let after = root.chroot(&["dpkg-query", "-W", "prjquota"]);
    assert!(
        !after.status.success(),
        "prjquota is still in the package database after the purge: {}",
        text(&after)
    );
    for f in files.lines().filter(|l| l.starts_with('/')) {
        let p = root.at(f);
        let left = std::fs::symlink_metadata(&p).is_ok()
            && !root.lower.join(f.trim_start_matches('/')).exists();
        assert!(!left, "{f}, a path of the package, is left after the purge");
    }
    let (written, new_dirs) = root.written();
    let stray: Vec<&String> = written
        .iter()
        .filter(|f| {
            !f.starts_with("var/lib/dpkg/")
                && f.as_str() != "var/log/dpkg.log"
                && *f != &nomads
                // The test's own: man-db's trigger turned off, and the page
                // `systemd-analyze verify` formatted for Documentation=man:.
                && f.as_str() != MAN_DB_AUTO_UPDATE
                && !f.starts_with("var/cache/man/")
        })
        .collect();
    assert!(
        stray.is_empty(),
        "after the purge the install left files outside dpkg's own records: {stray:?}"
    );
    // The plugin directory is the test's (made before the install).
    let new_dirs: Vec<&String> = new_dirs
        .iter()
        .filter(|d| !PLUGIN_DIR.starts_with(d.as_str()))
        .collect();
    assert!(
        new_dirs.is_empty(),
        "after the purge the install left directories it made: {new_dirs:?}"
    );
    eprintln!("after the purge the overlay holds only dpkg's records: {written:?}");
}

/// docs/install.md's hand install of the plugin: `prjquota install`, which
/// renames the new plugin over the old one (never `install` onto the
/// target, which unlinks it first: a create in between fails).
fn hand_install_line() -> String {
    let doc = include_str!("../../docs/install.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with("/usr/lib/prjquota/prjquota install --plugin-dir "))
        .expect("docs/install.md has the plugin's hand install one-liner");
    line.to_string()
}

/// The .rpm of the same binaries: the same files, the settings as a
/// config file, the scripts that install the plugin into Nomad's directory,
/// restart on upgrade and stop on erase (checked with `rpm -qp`; no RHEL
/// system is served to install it on).
#[test]
fn the_rpm_holds_the_debs_files_and_scripts() {
    assert!(
        in_vm(),
        "the package test runs in the VM: `cargo xtask test`"
    );
    let rpm = PathBuf::from(vm_env("PRJQUOTA_RPM"));
    assert_eq!(
        rpm.file_name().unwrap().to_string_lossy(),
        format!("prjquota-{VERSION}-1.x86_64.rpm")
    );
    let q = |args: &[&str]| {
        let out = Command::new("rpm")
            .args(["-qp", "--nosignature"])
            .args(args)
            .arg(&rpm)
            .output()
            .expect("run rpm (cargo xtask deps installs it)");
        assert!(out.status.success(), "rpm -qp {args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let rpm_files: Vec<String> = q(&["-l"]).lines().map(str::to_string).collect();
    let deb_files = Command::new("dpkg-deb")
        .arg("-c")
        .arg(deb())
        .output()
        .expect("dpkg-deb -c");
    let deb_files: Vec<String> = String::from_utf8_lossy(&deb_files.stdout)
        .lines()
        .filter(|l| !l.starts_with('d'))
        .filter_map(|l| l.split_whitespace().last())
        .map(|p| p.trim_start_matches('.').to_string())
        // zsh's completions, the settings and the licence notice have other
        // homes on Fedora; Debian's copyright, changelog and lintian
        // overrides have none.
        .map(|p| p.replace(&format!("/{ZSH_DEB}/"), &format!("/{ZSH_RPM}/")))
        .map(|p| p.replace(&format!("/{CONFFILE}"), &format!("/{CONFFILE_RPM}")))
        .map(|p| {
            p.replace(
                "/usr/share/doc/prjquota/THIRD-PARTY-LICENSES",
                "/usr/share/licenses/prjquota/THIRD-PARTY-LICENSES",
            )
        })
        .filter(|p| {
            ![
                "/usr/share/doc/prjquota/copyright",
                "/usr/share/doc/prjquota/changelog.Debian.gz",
                "/usr/share/lintian/overrides/prjquota",
            ]
            .contains(&p.as_str())
        })
        .collect();
    for licence in ["LICENSE", "THIRD-PARTY-LICENSES"] {
        let f = format!("/usr/share/licenses/prjquota/{licence}");
        assert!(rpm_files.contains(&f), "no {f} in the .rpm: {rpm_files:?}");
    }
    for p in completions(ZSH_RPM) {
        assert!(
            deb_files.contains(&format!("/{p}")),
            "no /{p} among {deb_files:?}"
        );
    }
    for f in &deb_files {
        assert!(
            rpm_files.contains(f),
            "the .deb installs {f}, the .rpm does not: {rpm_files:?}"
        );
    }
    assert_eq!(
        q(&["-c"]).trim(),
        format!("/{CONFFILE_RPM}"),
        "the .rpm's config files"
    );
    let perms = q(&["--qf", "[%{FILEMODES:perms} %{FILENAMES}\n]"]);
    for p in [EXPORTER, PLUGIN, ADMIN, RENDERER, GENERATOR] {
        assert!(
            perms.contains(&format!("-rwxr-xr-x /{p}\n")),
            "/{p} is not 0755 in the .rpm:\n{perms}"
        );
    }
    let scripts = q(&["--scripts"]);
    for (what, needle) in [
        (
            "the plugin into Nomad's directory",
            "prjquota_install_plugin\n",
        ),
        (
            "the atomic rename",
            "/usr/lib/prjquota/prjquota install --plugin-dir \"$PLUGIN_DIR\"",
        ),
        (
            "a restart on upgrade",
            "systemctl try-restart prjquota-exporter.service",
        ),
        ("a stop on erase", "disable --now prjquota-exporter.service"),
        ("the plugin left for deletes", "prjquota_plugin_notice\n"),
    ] {
        assert!(
            scripts.contains(needle),
            "the .rpm's scripts lack {what} ({needle:?}):\n{scripts}"
        );
    }
    for section in ["postinstall", "preuninstall", "postuninstall"] {
        assert!(
            scripts.contains(&format!("{section} scriptlet (using /bin/sh)")),
            "the .rpm has no {section} script:\n{scripts}"
        );
    }
}
