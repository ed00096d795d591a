//! Where Nomad's HTTP API is and how to talk to it, with Nomad's own
//! conventions (`api/api.go`, `DefaultConfig`): `NOMAD_ADDR`,
//! `NOMAD_TOKEN`, `NOMAD_CACERT`, `NOMAD_CLIENT_CERT`, `NOMAD_CLIENT_KEY`,
//! `NOMAD_TLS_SERVER_NAME`, `NOMAD_REGION`, `NOMAD_NAMESPACE`, each
//! overridden by its `--nomad.*` flag, as the `nomad` CLI's flags override
//! its environment. The token is read from `--nomad.token-file` rather
//! than taken on the command line, where every user of the node would
//! read it in `ps`.
//!
//! Everything here is checked once, at start-up, and a mistake stops the
//! exporter with the setting, the value and the fix: a client that starts
//! with a bad CA file would only say so at its first request.

use std::path::{Path, PathBuf};
use std::time::Duration;

use prjquota_core::trusted_file;

/// Nomad's default address (`api.DefaultConfig`).
pub const DEFAULT_ADDR: &str = "http://127.0.0.1:4646";

/// What the command line says about Nomad's API (each `None` falls back to
/// the environment).
#[derive(Debug, Clone, Default)]
pub struct Flags {
    pub addr: Option<String>,
    pub token_file: Option<PathBuf>,
    pub ca_cert: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    pub tls_server_name: Option<String>,
    pub region: Option<String>,
    pub namespace: Option<String>,
    pub timeout: Duration,
}

/// Where the agent listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// `http://host:port` or `https://host:port`: `host` as written
    /// (a name, an IPv4 address or a bracketed IPv6 one).
    Tcp { tls: bool, host: String, port: u16 },
    /// `unix:///path`: an agent listening on a Unix socket.
    Unix(PathBuf),
}

impl Address {
    /// Parses `NOMAD_ADDR`'s forms: `http://`, `https://` or `unix://`,
    /// a port defaulting to 4646 as Nomad's does; no path, query or user.
    pub fn parse(text: &str) -> Result<Address, String> {
        let bad = |why: &str| {
            format!(
                "{text:?} is not a Nomad address ({why}); give one such as http://127.0.0.1:4646, \
                 https://nomad.example:4646 or unix:///run/nomad/api.sock"
            )
        };
        let (scheme, rest) = text.split_once("://").ok_or_else(|| bad("no scheme"))?;
        match scheme {
            "unix" => {
                if !rest.starts_with('/') {
                    return Err(bad("a unix:// address needs an absolute socket path"));
                }
                Ok(Address::Unix(PathBuf::from(rest)))
            }
            "http" | "https" => {
                let authority = rest.strip_suffix('/').unwrap_or(rest);
                if authority.is_empty() {
                    return Err(bad("no host"));
                }
                if authority.contains(['/', '?', '#', '@']) {
                    return Err(bad(
                        "only a host and a port are taken, no path, query or user",
                    ));
                }
                let (host, port) = split_host_port(authority).map_err(|e| bad(&e))?;
                Ok(Address::Tcp {
                    tls: scheme == "https",
                    host,
                    port,
                })
            }
            other => Err(bad(&format!("scheme {other:?}: use http, https or unix"))),
        }
    }

    /// The host for the `Host` header and the TLS server name: a bare IP
    /// without its brackets.
    pub fn host(&self) -> &str {
        match self {
            Address::Tcp { host, .. } => host.trim_start_matches('[').trim_end_matches(']'),
            Address::Unix(_) => "localhost",
        }
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Tcp { tls, host, port } => {
                write!(f, "{}://{host}:{port}", if *tls { "https" } else { "http" })
            }
            Address::Unix(p) => write!(f, "unix://{}", p.display()),
        }
    }
}

fn split_host_port(authority: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (ip, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address without its closing ]")?;
        if ip.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("[{ip}] is not an IPv6 address"));
        }
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("junk after the IPv6 address")?),
        };
        (format!("[{ip}]"), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => {
                return Err("an IPv6 address goes in brackets: [::1]:4646".into())
            }
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    let port = match port {
        None => 4646,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("port {p:?} is not a port number"))?,
    };
    Ok((host, port))
}

/// The API token, kept out of `Debug` and logs.
#[derive(Clone)]
pub struct Token(String);

impl Token {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

/// The PEM files of a TLS connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signed the agent's certificate; `None`: the system's.
    pub ca_cert: Option<PathBuf>,
    /// A client certificate and its key (Nomad's `verify_https_client`).
    pub client: Option<(PathBuf, PathBuf)>,
    /// The name to verify the agent's certificate for (Nomad's
    /// certificates name `client.<region>.nomad`, not the address).
    pub server_name: Option<String>,
}

/// Everything the client needs, checked.
#[derive(Clone, Debug)]
pub struct Settings {
    pub addr: Address,
    pub token: Option<Token>,
    /// Where the token came from (`--nomad.token-file FILE`, or
    /// `NOMAD_TOKEN`), for the start-up log; never the token.
    pub token_source: Option<String>,
    pub tls: TlsFiles,
    pub region: Option<String>,
    pub namespace: Option<String>,
    /// The longest one request may take, connection to last byte.
    pub timeout: Duration,
    /// Settings that were given and are not used, to say so once.
    pub ignored: Vec<String>,
}

/// Largest token file read: a Nomad token is a 36-byte UUID.
const MAX_TOKEN_BYTES: u64 = 4096;

impl Settings {
    /// The settings from `flags`, falling back to the environment `env`
    /// gives (`std::env::var` in the binary). Token and TLS files are
    /// read or checked here.
    pub fn resolve(
        flags: &Flags,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, String> {
        let env = |name: &str| env(name).filter(|v| !v.is_empty());
        let pick = |flag: &Option<String>, var: &str| flag.clone().or_else(|| env(var));
        let pick_path = |flag: &Option<PathBuf>, var: &str| {
            flag.clone().or_else(|| env(var).map(PathBuf::from))
        };
        let addr_text = pick(&flags.addr, "NOMAD_ADDR").unwrap_or_else(|| DEFAULT_ADDR.into());
        let addr =
            Address::parse(&addr_text).map_err(|e| format!("--nomad.addr/NOMAD_ADDR: {e}"))?;
        if env("NOMAD_SKIP_VERIFY").is_some() {
            return Err(
                "NOMAD_SKIP_VERIFY is set: prjquota-exporter never skips verifying Nomad's \
                 certificate (whoever answers in Nomad's place would be told what the node \
                 holds and could set its limits); give the CA with --nomad.ca-cert or \
                 NOMAD_CACERT and unset NOMAD_SKIP_VERIFY"
                    .into(),
            );
        }
        let (token, token_source) = match (&flags.token_file, env("NOMAD_TOKEN")) {
            (Some(file), _) => (
                Some(read_token_file(file)?),
                Some(format!("--nomad.token-file {}", file.display())),
            ),
            (None, Some(t)) => (
                Some(check_token(t.trim()).map_err(|e| format!("NOMAD_TOKEN: {e}"))?),
                Some("NOMAD_TOKEN".to_string()),
            ),
            (None, None) => (None, None),
        };
        let ca_cert = pick_path(&flags.ca_cert, "NOMAD_CACERT");
        let cert = pick_path(&flags.client_cert, "NOMAD_CLIENT_CERT");
        let key = pick_path(&flags.client_key, "NOMAD_CLIENT_KEY");
        let client =
            match (cert, key) {
                (Some(c), Some(k)) => Some((c, k)),
                (None, None) => None,
                (Some(_), None) => return Err(
                    "a client certificate (--nomad.client-cert/NOMAD_CLIENT_CERT) needs its key: \
                     give --nomad.client-key or NOMAD_CLIENT_KEY too"
                        .into(),
                ),
                (None, Some(_)) => return Err(
                    "a client key (--nomad.client-key/NOMAD_CLIENT_KEY) needs its certificate: \
                     give --nomad.client-cert or NOMAD_CLIENT_CERT too"
                        .into(),
                ),
            };
        let tls = TlsFiles {
            ca_cert,
            client,
            server_name: pick(&flags.tls_server_name, "NOMAD_TLS_SERVER_NAME"),
        };
        let mut ignored = Vec::new();
        if !matches!(addr, Address::Tcp { tls: true, .. }) && tls != TlsFiles::default() {
            ignored.push(format!(
                "the TLS settings (CA, client certificate, server name) are not used with {addr}: \
                 give an https:// address to use them"
            ));
        }
        for (what, v) in [
            (
                "--nomad.region/NOMAD_REGION",
                pick(&flags.region, "NOMAD_REGION"),
            ),
            (
                "--nomad.namespace/NOMAD_NAMESPACE",
                pick(&flags.namespace, "NOMAD_NAMESPACE"),
            ),
        ] {
            if let Some(v) = v {
                if !v
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.*".contains(&b))
                {
                    return Err(format!(
                        "{what}: {v:?} is not a Nomad region or namespace name (letters, digits, -, _)"
                    ));
                }
            }
        }
        Ok(Settings {
            addr,
            token,
            token_source,
            tls,
            region: pick(&flags.region, "NOMAD_REGION"),
            namespace: pick(&flags.namespace, "NOMAD_NAMESPACE"),
            timeout: flags.timeout,
            ignored,
        })
    }
}

/// A token as Nomad takes it in `X-Nomad-Token`: one line of visible
/// ASCII.
fn check_token(t: &str) -> Result<Token, String> {
    if t.is_empty() {
        return Err("the token is empty".into());
    }
    if !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(
            "the token holds a character no HTTP header takes (a space, a control \
             character or non-ASCII): give the token's secret ID alone"
                .into(),
        );
    }
    Ok(Token(t.to_string()))
}

/// The token in `file`: a regular root-owned file nobody else can write
/// or read (a secret in a file others can read is not a secret).
fn read_token_file(file: &Path) -> Result<Token, String> {
    use std::os::unix::fs::MetadataExt;
    let shown = file.display();
    let stakes = "holds the token prjquota-exporter acts in Nomad with";
    let bytes = match trusted_file::read(file, MAX_TOKEN_BYTES, stakes) {
        Ok(Some(b)) => b,
        Ok(None) => {
            return Err(format!(
                "--nomad.token-file {shown}: it does not exist; write the token's secret ID \
                 there (install -m 600 /dev/null {shown}, then edit it)"
            ))
        }
        Err(trusted_file::Refused::Read(e)) => {
            return Err(format!("--nomad.token-file {shown}: cannot read it: {e}"))
        }
        Err(trusted_file::Refused::Unsafe(why)) => {
            return Err(format!("--nomad.token-file {shown}: refused: {why}"))
        }
    };
    let mode = std::fs::symlink_metadata(file)
        .map_err(|e| format!("--nomad.token-file {shown}: cannot stat it: {e}"))?
        .mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "--nomad.token-file {shown}: group or others may read it (mode {:o}); the token is \
             a secret: chmod 600 {shown}",
            mode & 0o7777
        ));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("--nomad.token-file {shown}: it is not UTF-8 text"))?;
    check_token(text.trim()).map_err(|e| format!("--nomad.token-file {shown}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    fn flags() -> Flags {
        Flags {
            timeout: Duration::from_secs(10),
            ..Flags::default()
        }
    }

    #[test]
    fn addresses_take_nomads_forms_and_refuse_the_rest() {
        let tcp = |tls, host: &str, port| Address::Tcp {
            tls,
            host: host.into(),
            port,
        };
        for (text, want) in [
            ("http://127.0.0.1:4646", tcp(false, "127.0.0.1", 4646)),
            ("https://nomad.example", tcp(true, "nomad.example", 4646)),
            ("http://localhost:14646/", tcp(false, "localhost", 14646)),
            ("https://[::1]:4646", tcp(true, "[::1]", 4646)),
            ("http://[fe80::1]", tcp(false, "[fe80::1]", 4646)),
            (
                "unix:///run/nomad/api.sock",
                Address::Unix("/run/nomad/api.sock".into()),
            ),
        ] {
            assert_eq!(Address::parse(text), Ok(want.clone()), "{text}");
            // What is shown is an address that parses back the same.
            assert_eq!(Address::parse(&want.to_string()), Ok(want), "{text}");
        }
        assert_eq!(Address::parse("https://[::1]:4646").unwrap().host(), "::1");
        for (text, says) in [
            ("127.0.0.1:4646", "no scheme"),
            ("ftp://x", "scheme \"ftp\""),
            ("http://", "no host"),
            ("http://host:0", "not a port number"),
            ("http://host:99999", "not a port number"),
            ("http://host:46x", "not a port number"),
            ("http://::1:4646", "in brackets"),
            ("http://[::1", "closing ]"),
            ("http://[nope]:1", "not an IPv6 address"),
            ("http://host:4646/v1", "no path"),
            ("http://user@host", "no path, query or user"),
            ("unix://relative.sock", "absolute socket path"),
        ] {
            let e = Address::parse(text).unwrap_err();
            assert!(
                e.contains(says) && e.contains("http://127.0.0.1:4646"),
                "{text}: {e}"
            );
        }
    }

    /// Flags win over the environment, as the nomad CLI's do; without
    /// either, Nomad's own default address.
    #[test]
    fn flags_override_nomads_environment() {
        let s = Settings::resolve(&flags(), env(&[])).unwrap();
        assert_eq!(s.addr.to_string(), DEFAULT_ADDR);
        assert!(s.token.is_none() && s.region.is_none() && s.namespace.is_none());
        let vars = [
            ("NOMAD_ADDR", "https://nomad.service:4646"),
            ("NOMAD_TOKEN", "  0b1e3c4d-aaaa-bbbb-cccc-123456789abc\n"),
            ("NOMAD_CACERT", "/etc/nomad/ca.pem"),
            ("NOMAD_CLIENT_CERT", "/etc/nomad/cli.pem"),
            ("NOMAD_CLIENT_KEY", "/etc/nomad/cli-key.pem"),
            ("NOMAD_TLS_SERVER_NAME", "client.global.nomad"),
            ("NOMAD_REGION", "eu"),
            ("NOMAD_NAMESPACE", "prod"),
        ];
        let s = Settings::resolve(&flags(), env(&vars)).unwrap();
        assert_eq!(s.addr.to_string(), "https://nomad.service:4646");
        assert_eq!(
            s.token.unwrap().as_str(),
            "0b1e3c4d-aaaa-bbbb-cccc-123456789abc"
        );
        assert_eq!(s.token_source.as_deref(), Some("NOMAD_TOKEN"));
        assert_eq!(s.tls.ca_cert, Some("/etc/nomad/ca.pem".into()));
        assert_eq!(
            s.tls.client,
            Some(("/etc/nomad/cli.pem".into(), "/etc/nomad/cli-key.pem".into()))
        );
        assert_eq!(s.tls.server_name.as_deref(), Some("client.global.nomad"));
        assert_eq!(
            (s.region.as_deref(), s.namespace.as_deref()),
            (Some("eu"), Some("prod"))
        );
        assert!(s.ignored.is_empty(), "{:?}", s.ignored);
        let f = Flags {
            addr: Some("http://10.0.0.1:4646".into()),
            region: Some("us".into()),
            ..flags()
        };
        let s = Settings::resolve(&f, env(&vars)).unwrap();
        assert_eq!(s.addr.to_string(), "http://10.0.0.1:4646");
        assert_eq!(s.region.as_deref(), Some("us"));
        // TLS files with a plain-HTTP address are said to be unused.
        assert_eq!(s.ignored.len(), 1, "{:?}", s.ignored);
        assert!(s.ignored[0].contains("https://"), "{:?}", s.ignored);
        // An empty variable is no setting, as in Nomad.
        let s =
            Settings::resolve(&flags(), env(&[("NOMAD_ADDR", ""), ("NOMAD_TOKEN", "")])).unwrap();
        assert_eq!(s.addr.to_string(), DEFAULT_ADDR);
        assert!(s.token.is_none());
    }

    #[test]
    fn half_a_client_pair_skip_verify_and_bad_names_are_refused() {
        for (vars, says) in [
            (vec![("NOMAD_CLIENT_CERT", "/c.pem")], "needs its key"),
            (
                vec![("NOMAD_CLIENT_KEY", "/k.pem")],
                "needs its certificate",
            ),
            (vec![("NOMAD_SKIP_VERIFY", "true")], "never skips verifying"),
            (vec![("NOMAD_ADDR", "nomad:4646")], "NOMAD_ADDR"),
            (vec![("NOMAD_TOKEN", "a b")], "NOMAD_TOKEN"),
            (vec![("NOMAD_NAMESPACE", "a/b")], "NOMAD_NAMESPACE"),
            (vec![("NOMAD_REGION", "eu\nx")], "NOMAD_REGION"),
        ] {
            let e = Settings::resolve(&flags(), env(&vars)).unwrap_err();
            assert!(e.contains(says), "{vars:?}: {e}");
        }
    }

    /// The token file is a secret: a file others can read is refused with
    /// the chmod that fixes it, and the token never shows in Debug.
    #[test]
    fn a_token_file_must_be_private_and_one_line() {
        use std::os::unix::fs::PermissionsExt;
        let dir =
            prjquota_vmtests::temp::TempDir::new(&std::env::temp_dir(), "prjq-nomad-token", "t");
        let file = dir.path().join("token");
        std::fs::write(&file, "0b1e3c4d-aaaa-bbbb-cccc-123456789abc\n").unwrap();
        let with_file = |f: &Path| Flags {
            token_file: Some(f.to_path_buf()),
            ..flags()
        };
        let mode = |m| std::fs::set_permissions(&file, std::fs::Permissions::from_mode(m)).unwrap();
        mode(0o644);
        let e = Settings::resolve(&with_file(&file), env(&[])).unwrap_err();
        assert!(e.contains("chmod 600") && e.contains("644"), "{e}");
        mode(0o600);
        // Where the file is root's (the tests run as root) it is taken; the
        // file wins over NOMAD_TOKEN.
        let s = Settings::resolve(&with_file(&file), env(&[("NOMAD_TOKEN", "other")]));
        if nix::unistd::geteuid().is_root() {
            let s = s.unwrap();
            assert_eq!(
                s.token.as_ref().unwrap().as_str(),
                "0b1e3c4d-aaaa-bbbb-cccc-123456789abc"
            );
            assert!(s
                .token_source
                .as_deref()
                .unwrap()
                .contains("--nomad.token-file"));
            assert!(!format!("{s:?}").contains("0b1e3c4d"), "the token in Debug");
            std::fs::write(&file, "two\nlines\n").unwrap();
            mode(0o600);
            let e = Settings::resolve(&with_file(&file), env(&[])).unwrap_err();
            assert!(e.contains("no HTTP header takes"), "{e}");
        }
        let e = Settings::resolve(&with_file(&dir.path().join("none")), env(&[])).unwrap_err();
        assert!(
            e.contains("does not exist") && e.contains("install -m 600"),
            "{e}"
        );
    }
}
