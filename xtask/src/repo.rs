//! The package repositories `cargo xtask dist` makes beside the packages,
//! signed with the release's key: an apt repository (`target/dist/apt`)
//! and a yum/dnf repository (`target/dist/yum`), each with the files a
//! node needs to trust it, and `SHA256SUMS.asc`.
//!
//! The key: `PRJQUOTA_SIGNING_KEY`, an armored secret key file, when set
//! (the release job's secret, `deploy/release/publish.sh`); without it a
//! throwaway key is made for this build alone, and every file says so
//! (its user ID, and the line dist prints): such repositories are for
//! tests, never to publish. The reference implementations build them:
//! apt's own `apt-ftparchive`, Debian's `createrepo_c`, GnuPG.
//!
//! Layout (what the release publishes at [`BASE_URL`]):
//!
//! ```text
//! apt/pool/main/p/prjquota/prjquota_<v>-1_amd64.deb
//! apt/dists/stable/{Release,Release.gpg,InRelease}
//! apt/dists/stable/main/binary-amd64/{Packages,Packages.gz}
//! apt/prjquota-archive-keyring.gpg   (for /usr/share/keyrings, signed-by)
//! apt/prjquota.sources               (for /etc/apt/sources.list.d)
//! yum/prjquota-<v>-1.x86_64.rpm
//! yum/repodata/{repomd.xml,repomd.xml.asc,...}
//! yum/RPM-GPG-KEY-prjquota
//! yum/prjquota.repo                  (for /etc/yum.repos.d)
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::process::{quiet, run};

/// Where the release job publishes the repositories (GitHub Pages of the
/// project's repository).
pub const BASE_URL: &str = "https://prjquota.github.io/prjquota";

/// The apt suite and component.
pub const SUITE: &str = "stable";
pub const COMPONENT: &str = "main";

/// Where the keyring goes on a node, as the sources file names it.
pub const KEYRING_PATH: &str = "/usr/share/keyrings/prjquota-archive-keyring.gpg";

/// The user ID of a throwaway key: what `gpg --show-keys` prints of it.
const THROWAWAY_UID: &str = "prjquota test repository (throwaway key, never published)";

/// The key repositories are signed with, in a GnuPG home of its own.
pub struct SigningKey {
    home: PathBuf,
    pub fingerprint: String,
    /// Made for this build alone (no PRJQUOTA_SIGNING_KEY).
    pub throwaway: bool,
}

impl SigningKey {
    /// The release's key from PRJQUOTA_SIGNING_KEY, or a throwaway one,
    /// in a fresh GnuPG home at `home`.
    pub fn for_build(home: &Path) -> Result<SigningKey> {
        let _ = std::fs::remove_dir_all(home);
        std::fs::create_dir_all(home)?;
        set_private(home)?;
        let given = std::env::var_os("PRJQUOTA_SIGNING_KEY").filter(|v| !v.is_empty());
        let throwaway = given.is_none();
        match &given {
            Some(file) => {
                quiet(gpg(home).arg("--import").arg(file)).with_context(|| {
                    format!(
                        "cannot import PRJQUOTA_SIGNING_KEY={}: give an armored secret key \
                         without a passphrase",
                        Path::new(file).display()
                    )
                })?;
            }
            None => {
                quiet(gpg(home).args([
                    "--passphrase",
                    "",
                    "--quick-generate-key",
                    THROWAWAY_UID,
                    "ed25519",
                    "sign",
                    "1d",
                ]))
                .context("cannot make a throwaway signing key with gpg")?;
            }
        }
        let out = gpg(home)
            .args(["--list-secret-keys", "--with-colons"])
            .output()
            .context("run gpg --list-secret-keys")?;
        let fingerprint = fingerprints(&String::from_utf8_lossy(&out.stdout));
        let [fingerprint] = fingerprint.as_slice() else {
            bail!(
                "the signing key's GnuPG home holds {} secret keys, not one: give \
                 PRJQUOTA_SIGNING_KEY a file of exactly the release's key",
                fingerprint.len()
            );
        };
        Ok(SigningKey {
            home: home.to_path_buf(),
            fingerprint: fingerprint.clone(),
            throwaway,
        })
    }

    /// gpg with this key's home and as its signer.
    fn gpg(&self) -> Command {
        let mut c = gpg(&self.home);
        c.args(["--local-user", &self.fingerprint]);
        c
    }

    /// `file.asc` (armored, detached) or `file.gpg` (binary, detached).
    pub fn detach_sign(&self, file: &Path, to: &Path, armor: bool) -> Result<()> {
        let mut c = self.gpg();
        if armor {
            c.arg("--armor");
        }
        quiet(c.arg("--output").arg(to).arg("--detach-sign").arg(file))
    }

    /// The public key, binary (a keyring for apt's signed-by) or armored.
    pub fn export(&self, to: &Path, armor: bool) -> Result<()> {
        let mut c = gpg(&self.home);
        if armor {
            c.arg("--armor");
        }
        quiet(
            c.arg("--output")
                .arg(to)
                .args(["--export", &self.fingerprint]),
        )
    }
}

fn gpg(home: &Path) -> Command {
    let mut c = Command::new("gpg");
    c.env("GNUPGHOME", home).args([
        "--batch",
        "--yes",
        "--no-tty",
        "--pinentry-mode",
        "loopback",
    ]);
    c
}

fn set_private(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("chmod 700 {}", dir.display()))
}

/// The primary keys' fingerprints of `gpg --with-colons` output.
fn fingerprints(colons: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut primary = false;
    for l in colons.lines() {
        let f: Vec<&str> = l.split(':').collect();
        match f.first() {
            Some(&"sec") | Some(&"pub") => primary = true,
            Some(&"ssb") | Some(&"sub") => primary = false,
            Some(&"fpr") if primary => {
                if let Some(fpr) = f.get(9).filter(|s| !s.is_empty()) {
                    out.push(fpr.to_string());
                }
                primary = false;
            }
            _ => {}
        }
    }
    out
}

/// The deb822 sources file of the repository at `url`.
pub fn sources_file(url: &str) -> String {
    format!(
        "Types: deb\nURIs: {url}\nSuites: {SUITE}\nComponents: {COMPONENT}\n\
         Architectures: amd64\nSigned-By: {KEYRING_PATH}\n"
    )
}

/// The yum/dnf repository file of the repository at `url`: the metadata's
/// signature checked (repomd.xml.asc), the packages by its checksums.
pub fn repo_file(url: &str) -> String {
    format!(
        "[prjquota]\nname=prjquota\nbaseurl={url}\nenabled=1\nrepo_gpgcheck=1\n\
         gpgcheck=0\ngpgkey={url}/RPM-GPG-KEY-prjquota\n"
    )
}

/// An apt repository of `debs` in `dir` (made afresh), signed by `key`,
/// its sources file pointing at `url`.
pub fn apt(dir: &Path, debs: &[&Path], key: &SigningKey, url: &str) -> Result<()> {
    fresh(dir)?;
    let pool = dir.join(format!("pool/{COMPONENT}/p/prjquota"));
    std::fs::create_dir_all(&pool)?;
    for deb in debs {
        let name = deb.file_name().context("a .deb's name")?;
        std::fs::copy(deb, pool.join(name))
            .with_context(|| format!("copy {} into the apt repository", deb.display()))?;
    }
    let dist = dir.join(format!("dists/{SUITE}"));
    let bin = dist.join(format!("{COMPONENT}/binary-amd64"));
    std::fs::create_dir_all(&bin)?;
    let packages = Command::new("apt-ftparchive")
        .current_dir(dir)
        .args(["packages", "pool"])
        .output()
        .context("run apt-ftparchive (apt-utils; `cargo xtask deps` installs it)")?;
    if !packages.status.success() || packages.stdout.is_empty() {
        bail!(
            "apt-ftparchive packages pool failed: {}",
            String::from_utf8_lossy(&packages.stderr)
        );
    }
    std::fs::write(bin.join("Packages"), &packages.stdout)?;
    run(Command::new("gzip")
        .args(["-n", "-9", "-k"])
        .arg(bin.join("Packages")))?;
    let release = Command::new("apt-ftparchive")
        .current_dir(&dist)
        .args([
            "-o",
            "APT::FTPArchive::Release::Origin=prjquota",
            "-o",
            "APT::FTPArchive::Release::Label=prjquota",
            "-o",
            &format!("APT::FTPArchive::Release::Suite={SUITE}"),
            "-o",
            &format!("APT::FTPArchive::Release::Codename={SUITE}"),
            "-o",
            "APT::FTPArchive::Release::Architectures=amd64",
            "-o",
            &format!("APT::FTPArchive::Release::Components={COMPONENT}"),
            "release",
            ".",
        ])
        .output()
        .context("run apt-ftparchive release")?;
    if !release.status.success() {
        bail!(
            "apt-ftparchive release failed: {}",
            String::from_utf8_lossy(&release.stderr)
        );
    }
    std::fs::write(dist.join("Release"), &release.stdout)?;
    key.detach_sign(&dist.join("Release"), &dist.join("Release.gpg"), true)?;
    quiet(
        key.gpg()
            .arg("--output")
            .arg(dist.join("InRelease"))
            .arg("--clearsign")
            .arg(dist.join("Release")),
    )?;
    key.export(&dir.join("prjquota-archive-keyring.gpg"), false)?;
    std::fs::write(dir.join("prjquota.sources"), sources_file(url))?;
    Ok(())
}

/// A yum/dnf repository of `rpms` in `dir` (made afresh): createrepo_c's
/// metadata, repomd.xml signed by `key`, its public key and repo file.
pub fn yum(dir: &Path, rpms: &[&Path], key: &SigningKey, url: &str) -> Result<()> {
    fresh(dir)?;
    for rpm in rpms {
        let name = rpm.file_name().context("an .rpm's name")?;
        std::fs::copy(rpm, dir.join(name))
            .with_context(|| format!("copy {} into the yum repository", rpm.display()))?;
    }
    quiet(
        Command::new("createrepo_c")
            .args(["--quiet", "--no-database", "--simple-md-filenames"])
            .arg(dir),
    )
    .context("createrepo_c (Debian's createrepo-c; `cargo xtask deps` installs it)")?;
    let repomd = dir.join("repodata/repomd.xml");
    key.detach_sign(&repomd, &repomd.with_extension("xml.asc"), true)?;
    key.export(&dir.join("RPM-GPG-KEY-prjquota"), true)?;
    std::fs::write(dir.join("prjquota.repo"), repo_file(url))?;
    Ok(())
}

fn fresh(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clear {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir)?;
    Ok(())
}

/// Checks the apt repository as apt would: InRelease's and Release.gpg's
/// signatures by the exported keyring alone (gpgv), Packages' hash in
/// Release, the .deb's in Packages.
pub fn verify_apt(dir: &Path) -> Result<()> {
    let keyring = dir.join("prjquota-archive-keyring.gpg");
    let dist = dir.join(format!("dists/{SUITE}"));
    quiet(
        Command::new("gpgv")
            .arg("--keyring")
            .arg(&keyring)
            .arg(dist.join("InRelease")),
    )
    .context("InRelease is not signed by the repository's keyring")?;
    quiet(
        Command::new("gpgv")
            .arg("--keyring")
            .arg(&keyring)
            .arg(dist.join("Release.gpg"))
            .arg(dist.join("Release")),
    )
    .context("Release.gpg does not sign Release with the repository's keyring")?;
    let release = std::fs::read_to_string(dist.join("Release"))?;
    let packages_path = format!("{COMPONENT}/binary-amd64/Packages");
    let packages = std::fs::read(dist.join(&packages_path))?;
    let want = sha256(&packages)?;
    if !release
        .lines()
        .any(|l| l.trim_start().starts_with(&want) && l.trim_end().ends_with(&packages_path))
    {
        bail!("Release lists another SHA256 for {packages_path} than {want}");
    }
    for stanza in String::from_utf8_lossy(&packages).split("\n\n") {
        let field = |k: &str| {
            stanza
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{k}: ")))
                .map(str::to_string)
        };
        let (Some(file), Some(sum)) = (field("Filename"), field("SHA256")) else {
            continue;
        };
        if sha256(&std::fs::read(dir.join(&file))?)? != sum {
            bail!("{file} is not the .deb Packages lists");
        }
    }
    Ok(())
}

fn sha256(data: &[u8]) -> Result<String> {
    use std::io::Write;
    let mut child = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("run sha256sum")?;
    child.stdin.take().context("stdin")?.write_all(data)?;
    let out = child.wait_with_output()?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// A throwaway key's line for dist's output: loud, since such
/// repositories must never be published.
pub fn describe(key: &SigningKey) -> String {
    if key.throwaway {
        format!(
            "signed with a THROWAWAY key {} made for this build (PRJQUOTA_SIGNING_KEY is not \
             set): for tests, never to publish",
            key.fingerprint
        )
    } else {
        format!(
            "signed with the key {} of PRJQUOTA_SIGNING_KEY",
            key.fingerprint
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primary_fingerprints_are_read_not_subkeys() {
        let colons = "sec:u:255:22:AAAA:1:::u:::scESC:::+:::ed25519:::0:\n\
                      fpr:::::::::0123456789ABCDEF0123456789ABCDEF01234567:\n\
                      uid:u::::1::X::a b::::::::::0:\n\
                      ssb:u:255:18:BBBB:1::::::e:::+:::cv25519::\n\
                      fpr:::::::::FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF:\n";
        assert_eq!(
            fingerprints(colons),
            ["0123456789ABCDEF0123456789ABCDEF01234567"]
        );
    }

    #[test]
    fn the_node_files_name_the_keyring_and_the_url() {
        let s = sources_file("https://example.org/apt");
        assert!(s.contains("URIs: https://example.org/apt\n"), "{s}");
        assert!(s.contains(&format!("Signed-By: {KEYRING_PATH}\n")), "{s}");
        let r = repo_file("https://example.org/yum");
        assert!(r.contains("repo_gpgcheck=1"), "{r}");
        assert!(
            r.contains("gpgkey=https://example.org/yum/RPM-GPG-KEY-prjquota"),
            "{r}"
        );
    }

    /// The real tools on a real .deb: the repository verifies with its
    /// keyring alone, and fails to once a byte of what it signs changes.
    #[test]
    fn an_apt_repository_verifies_and_a_changed_package_does_not() {
        let tmp = std::env::temp_dir().join(format!("xtask-repo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(tmp.join("pkg/DEBIAN")).unwrap();
        std::fs::write(
            tmp.join("pkg/DEBIAN/control"),
            "Package: prjquota\nVersion: 0.0.1-1\nArchitecture: amd64\n\
             Maintainer: t <t@example.org>\nDescription: t\n t\n",
        )
        .unwrap();
        let deb = tmp.join("prjquota_0.0.1-1_amd64.deb");
        quiet(
            Command::new("dpkg-deb")
                .args(["--root-owner-group", "--build"])
                .arg(tmp.join("pkg"))
                .arg(&deb),
        )
        .unwrap();
        std::env::remove_var("PRJQUOTA_SIGNING_KEY");
        let key = SigningKey::for_build(&tmp.join("gnupg")).unwrap();
        assert!(key.throwaway);
        assert_eq!(key.fingerprint.len(), 40);
        let repo = tmp.join("apt");
        apt(&repo, &[&deb], &key, "file:/x").unwrap();
        verify_apt(&repo).unwrap();
        let pooled = repo.join("pool/main/p/prjquota/prjquota_0.0.1-1_amd64.deb");
        let mut bytes = std::fs::read(&pooled).unwrap();
        bytes.push(0);
        std::fs::write(&pooled, bytes).unwrap();
        let e = verify_apt(&repo).unwrap_err().to_string();
        assert!(e.contains("is not the .deb Packages lists"), "{e}");
        std::fs::write(
            repo.join("dists/stable/Release"),
            std::fs::read_to_string(repo.join("dists/stable/Release")).unwrap() + "X: y\n",
        )
        .unwrap();
        let e = format!("{:#}", verify_apt(&repo).unwrap_err());
        assert!(e.contains("Release.gpg"), "{e}");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
