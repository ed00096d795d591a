//! Just enough generic netlink to hear the kernel's quota warnings.
//!
//! The kernel sends a `QUOTA_NL_C_WARNING` message to the multicast group
//! `events` of the generic netlink family `VFS_DQUOT` whenever a write or a
//! file creation crosses a quota limit (`quota_send_warning()` in
//! fs/quota/netlink.c; XFS calls it from `xfs_quota_warn()`). Family and
//! group IDs are looked up through the genetlink controller
//! (`CTRL_CMD_GETFAMILY`), never hard-coded.
//!
//! The wire format (building and parsing) is pure and unit-tested; the two
//! socket functions at the end use nix's safe socket API.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};

// include/uapi/linux/netlink.h
const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLA_HDRLEN: usize = 4;
/// `NLA_TYPE_MASK`: the type without `NLA_F_NESTED` / `NLA_F_NET_BYTEORDER`.
const NLA_TYPE_MASK: u16 = 0x3fff;

// include/uapi/linux/genetlink.h
const GENL_HDRLEN: usize = 4;
pub const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_NEWFAMILY: u8 = 1;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const CTRL_ATTR_MCAST_GROUPS: u16 = 7;
const CTRL_ATTR_MCAST_GRP_NAME: u16 = 1;
const CTRL_ATTR_MCAST_GRP_ID: u16 = 2;

// include/uapi/linux/quota.h
pub const QUOTA_FAMILY: &str = "VFS_DQUOT";
pub const QUOTA_GROUP: &str = "events";
pub const QUOTA_NL_C_WARNING: u8 = 1;
const QUOTA_NL_A_QTYPE: u16 = 1;
const QUOTA_NL_A_EXCESS_ID: u16 = 2;
const QUOTA_NL_A_WARNING: u16 = 3;
const QUOTA_NL_A_DEV_MAJOR: u16 = 4;
const QUOTA_NL_A_DEV_MINOR: u16 = 5;
const QUOTA_NL_A_CAUSED_ID: u16 = 6;
/// `PRJQUOTA` (include/uapi/linux/quota.h): the quota type of projects.
pub const PRJQUOTA: u32 = 2;
pub const QUOTA_NL_IHARDWARN: u32 = 1;
pub const QUOTA_NL_ISOFTLONGWARN: u32 = 2;
pub const QUOTA_NL_ISOFTWARN: u32 = 3;
pub const QUOTA_NL_BHARDWARN: u32 = 4;
pub const QUOTA_NL_BSOFTLONGWARN: u32 = 5;
pub const QUOTA_NL_BSOFTWARN: u32 = 6;
/// First of the `*BELOW` notices (7–10): usage went back under a limit.
pub const QUOTA_NL_IHARDBELOW: u32 = 7;
pub const QUOTA_NL_BHARDBELOW: u32 = 9;

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// One quota warning as the kernel sent it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Warning {
    /// USRQUOTA 0, GRPQUOTA 1, PRJQUOTA 2.
    pub qtype: u32,
    /// The ID over its limit: the project ID for PRJQUOTA.
    pub id: u64,
    /// `QUOTA_NL_*WARN` / `*BELOW`.
    pub warning: u32,
    pub dev_major: u32,
    pub dev_minor: u32,
    /// The uid whose write crossed the limit.
    pub caused_by: u64,
}

/// Which limit a warning reports, for the warnings that mean a limit was
/// reached; `None` for the `*BELOW` notices and unknown values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hit {
    BytesHard,
    BytesSoft,
    InodesHard,
    InodesSoft,
}

impl Warning {
    /// Soft-limit-reached and grace-expired both count as a soft hit.
    pub fn hit(&self) -> Option<Hit> {
        match self.warning {
            QUOTA_NL_IHARDWARN => Some(Hit::InodesHard),
            QUOTA_NL_ISOFTLONGWARN | QUOTA_NL_ISOFTWARN => Some(Hit::InodesSoft),
            QUOTA_NL_BHARDWARN => Some(Hit::BytesHard),
            QUOTA_NL_BSOFTLONGWARN | QUOTA_NL_BSOFTWARN => Some(Hit::BytesSoft),
            _ => None,
        }
    }

    pub fn dev(&self) -> u64 {
        libc::makedev(self.dev_major, self.dev_minor)
    }
}

fn put_header(buf: &mut Vec<u8>, msg_type: u16, flags: u16, seq: u32, cmd: u8, version: u8) {
    buf.extend_from_slice(&0u32.to_ne_bytes()); // length, patched by finish()
    buf.extend_from_slice(&msg_type.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes()); // port ID: the kernel fills it
    buf.extend_from_slice(&[cmd, version, 0, 0]);
}

fn put_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    buf.extend_from_slice(&((NLA_HDRLEN + payload.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(align4(buf.len()), 0);
}

fn finish(mut buf: Vec<u8>) -> Vec<u8> {
    let len = (buf.len() as u32).to_ne_bytes();
    buf[..4].copy_from_slice(&len);
    buf
}

/// `CTRL_CMD_GETFAMILY` for `name`.
pub fn getfamily_request(name: &str, seq: u32) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64);
    put_header(
        &mut buf,
        GENL_ID_CTRL,
        NLM_F_REQUEST,
        seq,
        CTRL_CMD_GETFAMILY,
        1,
    );
    let mut name0 = name.as_bytes().to_vec();
    name0.push(0);
    put_attr(&mut buf, CTRL_ATTR_FAMILY_NAME, &name0);
    finish(buf)
}

/// A quota warning message as the kernel builds it (for tests, and for
/// injecting a warning into a running exporter).
pub fn warning_message(family: u16, w: &Warning) -> Vec<u8> {
    let mut buf = Vec::with_capacity(96);
    put_header(&mut buf, family, 0, 0, QUOTA_NL_C_WARNING, 1);
    put_attr(&mut buf, QUOTA_NL_A_QTYPE, &w.qtype.to_ne_bytes());
    put_attr(&mut buf, QUOTA_NL_A_EXCESS_ID, &w.id.to_ne_bytes());
    put_attr(&mut buf, QUOTA_NL_A_WARNING, &w.warning.to_ne_bytes());
    put_attr(&mut buf, QUOTA_NL_A_DEV_MAJOR, &w.dev_major.to_ne_bytes());
    put_attr(&mut buf, QUOTA_NL_A_DEV_MINOR, &w.dev_minor.to_ne_bytes());
    put_attr(&mut buf, QUOTA_NL_A_CAUSED_ID, &w.caused_by.to_ne_bytes());
    finish(buf)
}

/// One netlink message: type, flags and the bytes after the netlink header.
struct Message<'a> {
    kind: u16,
    payload: &'a [u8],
}

/// The messages of one datagram; stops at the first malformed length.
fn messages(mut buf: &[u8]) -> impl Iterator<Item = Message<'_>> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes(buf[0..4].try_into().ok()?) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return None;
        }
        let kind = u16::from_ne_bytes(buf[4..6].try_into().ok()?);
        let payload = &buf[NLMSG_HDRLEN..len];
        buf = &buf[align4(len).min(buf.len())..];
        Some(Message { kind, payload })
    })
}

/// The attributes in `buf`: (type without flag bits, payload).
fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < NLA_HDRLEN {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        if len < NLA_HDRLEN || len > buf.len() {
            return None;
        }
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        let payload = &buf[NLA_HDRLEN..len];
        buf = &buf[align4(len).min(buf.len())..];
        Some((kind, payload))
    })
}

fn u16_of(p: &[u8]) -> Option<u16> {
    Some(u16::from_ne_bytes(p.get(..2)?.try_into().ok()?))
}

fn u32_of(p: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(p.get(..4)?.try_into().ok()?))
}

fn u64_of(p: &[u8]) -> Option<u64> {
    Some(u64::from_ne_bytes(p.get(..8)?.try_into().ok()?))
}

/// A generic netlink family as the controller describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Family {
    pub id: u16,
    pub groups: Vec<(String, u32)>,
}

impl Family {
    pub fn group(&self, name: &str) -> Option<u32> {
        self.groups
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, id)| *id)
    }
}

/// Reads the controller's answer to [`getfamily_request`]. `Ok(None)` means
/// the datagram held no answer (keep reading); a kernel error (ENOENT: no
/// such family) comes back as that errno.
pub fn parse_family_reply(buf: &[u8]) -> io::Result<Option<Family>> {
    for m in messages(buf) {
        match m.kind {
            NLMSG_ERROR => {
                let err = m
                    .payload
                    .get(..4)
                    .and_then(|b| b.try_into().ok())
                    .map(i32::from_ne_bytes);
                return match err {
                    Some(0) => Ok(None), // an ACK
                    Some(e) => Err(io::Error::from_raw_os_error(-e)),
                    None => Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "short netlink error",
                    )),
                };
            }
            NLMSG_DONE => return Ok(None),
            GENL_ID_CTRL => {
                if m.payload.len() < GENL_HDRLEN || m.payload[0] != CTRL_CMD_NEWFAMILY {
                    continue;
                }
                let mut family = Family {
                    id: 0,
                    groups: Vec::new(),
                };
                for (kind, p) in attrs(&m.payload[GENL_HDRLEN..]) {
                    match kind {
                        CTRL_ATTR_FAMILY_ID => family.id = u16_of(p).unwrap_or(0),
                        CTRL_ATTR_MCAST_GROUPS => {
                            for (_, group) in attrs(p) {
                                let (mut name, mut id) = (None, None);
                                for (k, v) in attrs(group) {
                                    match k {
                                        CTRL_ATTR_MCAST_GRP_NAME => {
                                            let v = v.split(|&b| b == 0).next().unwrap_or(&[]);
                                            name = Some(String::from_utf8_lossy(v).into_owned());
                                        }
                                        CTRL_ATTR_MCAST_GRP_ID => id = u32_of(v),
                                        _ => {}
                                    }
                                }
                                if let (Some(n), Some(i)) = (name, id) {
                                    family.groups.push((n, i));
                                }
                            }
                        }
                        _ => {}
                    }
                }
                if family.id != 0 {
                    return Ok(Some(family));
                }
            }
            _ => {}
        }
    }
    Ok(None)
}

/// Every quota warning in one datagram from family `family`.
pub fn parse_warnings(buf: &[u8], family: u16) -> Vec<Warning> {
    let mut out = Vec::new();
    for m in messages(buf) {
        if m.kind != family || m.payload.len() < GENL_HDRLEN || m.payload[0] != QUOTA_NL_C_WARNING {
            continue;
        }
        let mut w = Warning::default();
        let mut have = 0u8;
        for (kind, p) in attrs(&m.payload[GENL_HDRLEN..]) {
            match kind {
                QUOTA_NL_A_QTYPE => (w.qtype, have) = (u32_of(p).unwrap_or(u32::MAX), have | 1),
                QUOTA_NL_A_EXCESS_ID => (w.id, have) = (u64_of(p).unwrap_or(0), have | 2),
                QUOTA_NL_A_WARNING => (w.warning, have) = (u32_of(p).unwrap_or(0), have | 4),
                QUOTA_NL_A_DEV_MAJOR => (w.dev_major, have) = (u32_of(p).unwrap_or(0), have | 8),
                QUOTA_NL_A_DEV_MINOR => (w.dev_minor, have) = (u32_of(p).unwrap_or(0), have | 16),
                QUOTA_NL_A_CAUSED_ID => w.caused_by = u64_of(p).unwrap_or(0),
                _ => {}
            }
        }
        // Type, ID, warning and device are what a warning means; without
        // them it cannot be attributed.
        if have == 0b11111 {
            out.push(w);
        }
    }
    out
}

fn errno(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

fn genl_socket() -> io::Result<OwnedFd> {
    socket::socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkGeneric,
    )
    .map_err(errno)
}

/// Looks a generic netlink family up through the controller.
pub fn resolve(name: &str) -> io::Result<Family> {
    let fd = genl_socket()?;
    socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(errno)?;
    let two_s = nix::sys::time::TimeVal::new(2, 0);
    socket::setsockopt(&fd, socket::sockopt::ReceiveTimeout, &two_s).map_err(errno)?;
    socket::send(
        fd.as_raw_fd(),
        &getfamily_request(name, 1),
        MsgFlags::empty(),
    )
    .map_err(errno)?;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(errno)?;
        if let Some(f) = parse_family_reply(&buf[..n])? {
            return Ok(f);
        }
    }
}

/// `bind(2)` takes the legacy 32-bit group mask: group `id` is bit `id - 1`.
fn group_mask(id: u32) -> io::Result<u32> {
    if (1..=32).contains(&id) {
        Ok(1 << (id - 1))
    } else {
        // VFS_DQUOT's group ID is reserved by the kernel as 17
        // (GENL_ID_VFS_DQUOT), so this does not happen in practice.
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("multicast group ID {id} does not fit the bind(2) group mask"),
        ))
    }
}

/// A socket subscribed to the kernel's quota warnings.
#[derive(Debug)]
pub struct QuotaSocket {
    fd: OwnedFd,
    pub family: u16,
    pub group: u32,
}

impl QuotaSocket {
    /// Resolves `VFS_DQUOT`/`events` and joins the group.
    pub fn subscribe() -> io::Result<QuotaSocket> {
        let family = resolve(QUOTA_FAMILY)?;
        let group = family.group(QUOTA_GROUP).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("the {QUOTA_FAMILY} family has no {QUOTA_GROUP:?} multicast group"),
            )
        })?;
        let fd = genl_socket()?;
        // Bursts of warnings (a writer looping on ENOSPC) should not overflow
        // the default buffer; the kernel caps this at net.core.rmem_max.
        let _ = socket::setsockopt(&fd, socket::sockopt::RcvBuf, &(1 << 20));
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, group_mask(group)?)).map_err(errno)?;
        Ok(QuotaSocket {
            fd,
            family: family.id,
            group,
        })
    }

    /// Blocks for the next datagram. ENOBUFS means the kernel dropped
    /// messages because this socket fell behind.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        socket::recv(self.fd.as_raw_fd(), buf, MsgFlags::empty()).map_err(errno)
    }
}

/// Sends `msg` to multicast group `group` as the kernel would (needs
/// CAP_NET_ADMIN). For tests: it lets a host without quota-enabled
/// filesystems exercise the whole receive path.
pub fn send_to_group(group: u32, msg: &[u8]) -> io::Result<()> {
    let fd = genl_socket()?;
    socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(errno)?;
    socket::sendto(
        fd.as_raw_fd(),
        msg,
        &NetlinkAddr::new(0, group_mask(group)?),
        MsgFlags::empty(),
    )
    .map_err(errno)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CTRL_CMD_NEWFAMILY reply as the kernel sends it for VFS_DQUOT.
    fn family_reply() -> Vec<u8> {
        let mut buf = Vec::new();
        put_header(&mut buf, GENL_ID_CTRL, 0, 1, CTRL_CMD_NEWFAMILY, 2);
        put_attr(&mut buf, CTRL_ATTR_FAMILY_NAME, b"VFS_DQUOT\0");
        put_attr(&mut buf, CTRL_ATTR_FAMILY_ID, &17u16.to_ne_bytes());
        let mut grp = Vec::new();
        put_attr(&mut grp, CTRL_ATTR_MCAST_GRP_NAME, b"events\0");
        put_attr(&mut grp, CTRL_ATTR_MCAST_GRP_ID, &17u32.to_ne_bytes());
        let mut groups = Vec::new();
        put_attr(&mut groups, 1 | 0x8000, &grp); // NLA_F_NESTED set
        put_attr(&mut buf, CTRL_ATTR_MCAST_GROUPS | 0x8000, &groups);
        finish(buf)
    }

    #[test]
    fn request_layout_matches_the_uapi_structs() {
        let r = getfamily_request("VFS_DQUOT", 7);
        assert_eq!(r.len(), 16 + 4 + align4(4 + 10));
        assert_eq!(
            u32::from_ne_bytes(r[0..4].try_into().unwrap()) as usize,
            r.len()
        );
        assert_eq!(u16::from_ne_bytes([r[4], r[5]]), GENL_ID_CTRL);
        assert_eq!(u32::from_ne_bytes(r[8..12].try_into().unwrap()), 7);
        assert_eq!(r[16], CTRL_CMD_GETFAMILY);
        assert_eq!(&r[24..34], b"VFS_DQUOT\0");
    }

    #[test]
    fn family_reply_gives_id_and_groups() {
        let f = parse_family_reply(&family_reply()).unwrap().unwrap();
        assert_eq!(f.id, 17);
        assert_eq!(f.group("events"), Some(17));
        assert_eq!(group_mask(17).unwrap(), 1 << 16);
        assert!(group_mask(33).is_err() && group_mask(0).is_err());
    }

    #[test]
    fn a_missing_family_is_the_kernels_errno() {
        let mut buf = Vec::new();
        buf.extend_from_slice(&36u32.to_ne_bytes());
        buf.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        buf.extend_from_slice(&[0; 10]);
        buf.extend_from_slice(&(-libc::ENOENT).to_ne_bytes());
        buf.extend_from_slice(&[0; 16]);
        let err = parse_family_reply(&buf).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    }

    #[test]
    fn warnings_round_trip_and_classify() {
        let w = Warning {
            qtype: PRJQUOTA,
            id: 1042,
            warning: QUOTA_NL_BHARDWARN,
            dev_major: 8,
            dev_minor: 16,
            caused_by: 1000,
        };
        let mut two = warning_message(17, &w);
        let w2 = Warning {
            warning: QUOTA_NL_ISOFTLONGWARN,
            ..w
        };
        two.extend(warning_message(17, &w2));
        assert_eq!(parse_warnings(&two, 17), vec![w, w2]);
        assert!(
            parse_warnings(&two, 18).is_empty(),
            "other families are ignored"
        );
        assert_eq!(w.hit(), Some(Hit::BytesHard));
        assert_eq!(w2.hit(), Some(Hit::InodesSoft));
        assert_eq!(w.dev(), libc::makedev(8, 16));
        for below in QUOTA_NL_IHARDBELOW..=QUOTA_NL_IHARDBELOW + 3 {
            assert_eq!(
                Warning {
                    warning: below,
                    ..w
                }
                .hit(),
                None
            );
        }
    }

    #[test]
    fn truncated_or_incomplete_messages_are_ignored() {
        let w = Warning {
            qtype: PRJQUOTA,
            id: 1,
            warning: QUOTA_NL_BSOFTWARN,
            ..Warning::default()
        };
        let msg = warning_message(17, &w);
        for cut in 0..msg.len() {
            // No panic, and nothing half-parsed.
            let got = parse_warnings(&msg[..cut], 17);
            assert!(got.is_empty(), "cut at {cut}: {got:?}");
        }
        let mut buf = Vec::new();
        put_header(&mut buf, 17, 0, 0, QUOTA_NL_C_WARNING, 1);
        put_attr(&mut buf, QUOTA_NL_A_QTYPE, &PRJQUOTA.to_ne_bytes());
        assert!(parse_warnings(&finish(buf), 17).is_empty());
    }
}
