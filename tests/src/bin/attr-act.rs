//! One attribute change, made by a process of its own so that the guard
//! tests can run it as another user or without CAP_SYS_ADMIN, and tell its
//! events apart by pid. Exits 0 when the kernel allowed the change, else
//! with the errno (1 to 254); a usage error exits 255.
//!
//! - `attr-act chproj ID`: `FS_IOC_FSGETXATTR`, new project ID,
//!   `FS_IOC_FSSETXATTR` (what `xfs_io -c 'chproj ID'` does)
//! - `attr-act chproj-compat ID`: the same set through the 32-bit
//!   system call entry (`int $0x80`), the path of an i386 binary
//! - `attr-act chproj-compat-cold ID`: the same, the argument in a page
//!   the process never touched (a memfd mapping): the kernel faults it in,
//!   a reader that must not fault finds it absent
//! - `attr-act xflags-clear|xflags-set HEX` (`xflags-clear-compat` too): fsxattr
//!   flags, e.g. `xflags-clear 200` clears PROJINHERIT
//! - `attr-act flags-clear|flags-set HEX`: `FS_IOC_GETFLAGS`, change,
//!   `FS_IOC_SETFLAGS` (what e2fsprogs' `chattr` does)
//! - `attr-act setversion fs|ext4|fs-compat|ext4-compat GEN`: sets the
//!   inode's generation through `FS_IOC_SETVERSION`, `EXT4_IOC_SETVERSION`
//!   or their 32-bit twins through `int $0x80` (ext4 without
//!   `metadata_csum` applies them)
//! - `attr-act file-setattr PATH ID`: `file_getattr(2)`, new project ID,
//!   `file_setattr(2)` (6.17+)
//! - `attr-act loop ACTION ARG [MS]`: `ACTION ARG` (`chproj ID`,
//!   `xflags-clear HEX`) every MS (1) milliseconds until killed, one byte
//!   per attempt on standard
//!   output: `.` refused with EPERM, `!` went through, `e` another error
//!
//! All but `file-setattr` act on standard input: the test opens the file
//! (as root) and hands it over, as a workload holds an open file, so the
//! acting process needs no permission to reach it by path.

use std::os::fd::{AsFd, BorrowedFd};

use prjquota_core::sys::{self, FsXattr};

fn usage() -> ! {
    eprintln!("usage: attr-act ACTION ARG... (see the source's header)");
    std::process::exit(255)
}

fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(254).clamp(1, 254)
}

fn hex(s: &str) -> u32 {
    u32::from_str_radix(s, 16).unwrap_or_else(|_| usage())
}

fn number(s: &str) -> u32 {
    s.parse().unwrap_or_else(|_| usage())
}

fn xattr(fd: BorrowedFd<'_>, compat: bool, change: impl FnOnce(&mut FsXattr)) -> Result<(), i32> {
    let mut a = sys::get_fsxattr(fd).map_err(errno)?;
    change(&mut a);
    if compat {
        sys::set_fsxattr_compat(fd, &a).map_err(errno)
    } else {
        sys::set_fsxattr(fd, &a).map_err(errno)
    }
}

fn flags(fd: BorrowedFd<'_>, change: impl FnOnce(u32) -> u32) -> Result<(), i32> {
    let f = sys::get_inode_flags(fd).map_err(errno)?;
    sys::set_inode_flags(fd, change(f)).map_err(errno)
}

fn set_version(fd: BorrowedFd<'_>, encoding: &str, gen: u32) -> Result<(), i32> {
    let native = |cmd| sys::set_inode_generation(fd, cmd, gen).map_err(errno);
    let compat = |cmd: libc::c_ulong| {
        sys::ioctl_compat(fd, cmd as u32, &(gen as i32).to_ne_bytes()).map_err(errno)
    };
    match encoding {
        "fs" => native(sys::FS_IOC_SETVERSION),
        "ext4" => native(sys::EXT4_IOC_SETVERSION),
        "fs-compat" => compat(sys::FS_IOC32_SETVERSION),
        "ext4-compat" => compat(sys::EXT4_IOC32_SETVERSION),
        _ => usage(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [action, rest @ ..] = args.as_slice() else {
        usage()
    };
    let stdin = std::io::stdin();
    let fd = stdin.as_fd();
    let result = match (action.as_str(), rest) {
        ("file-setattr", [path, id]) => {
            let path = std::ffi::CString::new(path.as_bytes()).unwrap_or_else(|_| usage());
            sys::file_getattr(&path).map_err(errno).and_then(|mut a| {
                a.projid = number(id);
                sys::file_setattr(&path, &a).map_err(errno)
            })
        }
        ("chproj", [id]) => xattr(fd, false, |a| a.projid = number(id)),
        ("loop", [action, arg, every @ ..]) => {
            use std::io::Write;
            let every = match every {
                [] => 1,
                [ms] => number(ms),
                _ => usage(),
            };
            let mut out = std::io::stdout().lock();
            loop {
                let r = match action.as_str() {
                    "chproj" => xattr(fd, false, |a| a.projid = number(arg)),
                    "xflags-clear" => xattr(fd, false, |a| a.xflags &= !hex(arg)),
                    _ => usage(),
                };
                let b: &[u8] = match r {
                    Ok(()) => b"!",
                    Err(libc::EPERM) => b".",
                    Err(_) => b"e",
                };
                if out.write_all(b).and_then(|()| out.flush()).is_err() {
                    std::process::exit(0); // the test stopped reading
                }
                std::thread::sleep(std::time::Duration::from_millis(every.into()));
            }
        }
        ("setversion", [encoding, gen]) => set_version(fd, encoding, number(gen)),
        ("chproj-compat", [id]) => xattr(fd, true, |a| a.projid = number(id)),
        ("chproj-compat-cold", [id]) => sys::get_fsxattr(fd).map_err(errno).and_then(|mut a| {
            a.projid = number(id);
            sys::set_fsxattr_compat_cold(fd, &a).map_err(errno)
        }),
        ("xflags-clear", [x]) => xattr(fd, false, |a| a.xflags &= !hex(x)),
        ("xflags-clear-compat", [x]) => xattr(fd, true, |a| a.xflags &= !hex(x)),
        ("xflags-set", [x]) => xattr(fd, false, |a| a.xflags |= hex(x)),
        ("flags-clear", [x]) => flags(fd, |f| f & !hex(x)),
        ("flags-set", [x]) => flags(fd, |f| f | hex(x)),
        _ => usage(),
    };
    std::process::exit(match result {
        Ok(()) => 0,
        Err(e) => e,
    })
}
