//! The sockets `--web.listen-address` names: `HOST:PORT`, `[IPV6]:PORT`, or
//! `:PORT` for every address, IPv4 and IPv6 alike (one dual-stack socket, as
//! node_exporter's `:9100`), or IPv4 alone on a host without IPv6. With
//! `--web.systemd-socket`, the sockets systemd's socket activation passed.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::OwnedFd;

use nix::sys::socket::{
    self, sockopt, AddressFamily, Backlog, SockFlag, SockType, SockaddrIn6, SockaddrLike,
};

/// Connections waiting to be accepted, as Go's listener asks for.
const BACKLOG: i32 = 1024;

/// A bound, listening, non-blocking socket for `addr`.
pub fn bind(addr: &str) -> io::Result<TcpListener> {
    let Some(port) = addr.strip_prefix(':') else {
        let l = TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        return Ok(l);
    };
    let port: u16 = port.parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{port:?} is not a port"),
        )
    })?;
    match dual_stack(port) {
        Ok(l) => Ok(l),
        // No IPv6 on this host (ipv6.disable=1): every IPv4 address.
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            let l = TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port)))?;
            l.set_nonblocking(true)?;
            Ok(l)
        }
        Err(e) => Err(e),
    }
}

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: i32 = 3;

/// The listening TCP sockets systemd passed this process (socket
/// activation: `$LISTEN_PID` is this process, `$LISTEN_FDS` counts them
/// from fd 3), each checked to be a listening stream socket of IPv4 or
/// IPv6.
pub fn systemd_sockets() -> io::Result<Vec<TcpListener>> {
    let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    let (Ok(pid), Ok(count)) = (std::env::var("LISTEN_PID"), std::env::var("LISTEN_FDS")) else {
        return Err(invalid(
            "systemd passed no socket ($LISTEN_PID and $LISTEN_FDS are unset): start the \
             exporter from a .socket unit (docs/configuration.md), or drop \
             --web.systemd-socket"
                .into(),
        ));
    };
    if pid.trim() != std::process::id().to_string() {
        return Err(invalid(format!(
            "$LISTEN_PID is {pid}, not this process ({}): the sockets were meant for another \
             process (a wrapper between systemd and the exporter must exec it)",
            std::process::id()
        )));
    }
    let count: usize = count
        .trim()
        .parse()
        .map_err(|_| invalid(format!("$LISTEN_FDS is {count:?}, not a count")))?;
    if count == 0 {
        return Err(invalid(
            "systemd passed no socket ($LISTEN_FDS=0): its .socket unit has no ListenStream="
                .into(),
        ));
    }
    let fds = prjquota_core::sys::take_inherited_fds(LISTEN_FDS_START, count)
        .map_err(|e| io::Error::new(e.kind(), format!("the sockets systemd passed: {e}")))?;
    fds.into_iter()
        .enumerate()
        .map(|(i, fd)| {
            let n = LISTEN_FDS_START + i as i32;
            let what = |m: &str| invalid(format!("fd {n} from systemd is {m}, not a listening TCP socket: use ListenStream= with an address or a port in the .socket unit"));
            let stream = socket::getsockopt(&fd, sockopt::SockType) == Ok(SockType::Stream);
            let family = socket::getsockname::<socket::SockaddrStorage>(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
            )
            .ok()
            .and_then(|a| a.family());
            if !stream || !matches!(family, Some(AddressFamily::Inet | AddressFamily::Inet6)) {
                return Err(what("another kind of socket (or none)"));
            }
            if !socket::getsockopt(&fd, sockopt::AcceptConn).unwrap_or(false) {
                return Err(what("a socket that does not listen"));
            }
            let l = TcpListener::from(fd);
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .collect()
}

/// `[::]:port` with IPV6_V6ONLY off, whatever net.ipv6.bindv6only says:
/// IPv4 clients arrive as v4-mapped addresses.
fn dual_stack(port: u16) -> io::Result<TcpListener> {
    let fd: OwnedFd = socket::socket(
        AddressFamily::Inet6,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    socket::setsockopt(&fd, sockopt::Ipv6V6Only, &false)?;
    socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    let any = SockaddrIn6::from(std::net::SocketAddrV6::new(
        std::net::Ipv6Addr::UNSPECIFIED,
        port,
        0,
        0,
    ));
    socket::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &any)?;
    socket::listen(&fd, Backlog::new(BACKLOG).map_err(io::Error::from)?)?;
    Ok(TcpListener::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// `:PORT` takes IPv4 and IPv6 clients on one socket.
    #[test]
    fn a_bare_port_listens_on_ipv4_and_ipv6() {
        let l = bind(":0").expect("bind :0");
        let port = l.local_addr().unwrap().port();
        l.set_nonblocking(false).unwrap();
        for client in [format!("127.0.0.1:{port}"), format!("[::1]:{port}")] {
            let mut c = std::net::TcpStream::connect(&client)
                .unwrap_or_else(|e| panic!("connect {client}: {e}"));
            let (mut s, _) = l.accept().unwrap();
            c.write_all(b"x").unwrap();
            let mut b = [0u8; 1];
            s.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"x");
        }
    }

    #[test]
    fn host_and_port_bind_that_address_only() {
        let l = bind("127.0.0.1:0").unwrap();
        assert!(l.local_addr().unwrap().is_ipv4());
        assert!(bind(":notaport").is_err());
    }
}
