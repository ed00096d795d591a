//! Pinning a loaded guard's maps and links in its pin directory (the
//! directories themselves: [`super::pins`]), and pinning them again when
//! someone removed them.

use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use aya::maps::MapData;
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::{FExit, Lsm};

use super::maps::MAP_EVENTS;
use super::{pins, Guard};
use crate::error::chain;
use prjquota_core::guard_contract::link_pin;

/// How the guard came to be pinned ([`Guard::load_pinned`]).
#[derive(Debug)]
pub struct Pinned {
    /// The pin directory (`<pin root>/@guard-<unique>`).
    pub dir: PathBuf,
    /// Programs whose links are pinned there.
    pub links: Vec<&'static str>,
    /// The pin directories of earlier starts removed, with their pin count.
    pub removed: pins::Removed,
}

/// An attached program: `(program name, link)` before its link is pinned.
pub(super) type Attached = Vec<(&'static str, LinkId)>;

pub(super) enum LinkId {
    FExit(aya::programs::fexit::FExitLinkId),
    Lsm(aya::programs::lsm::LsmLinkId),
}

impl Guard {
    pub(super) fn pin_maps(&self, dir: &Path) -> Result<(), String> {
        for (map, name) in pins::MAP_PINS {
            let path = dir.join(name);
            if map == MAP_EVENTS {
                if !path.exists() {
                    return Err(format!(
                        "cannot pin the guard's map {map} at {}",
                        path.display()
                    ));
                }
                continue;
            }
            let m = self.map(map).map_err(|e| e.to_string())?;
            m.pin(&path).map_err(|e| {
                format!(
                    "cannot pin the guard's map {map} at {}: {}",
                    path.display(),
                    chain(&e)
                )
            })?;
        }
        Ok(())
    }

    pub(super) fn pin_links(
        &mut self,
        dir: &Path,
        attached: Attached,
    ) -> Result<Vec<&'static str>, String> {
        let mut pinned = Vec::new();
        for (prog, id) in attached {
            let path = dir.join(link_pin(prog));
            let p = self
                .ebpf
                .program_mut(prog)
                .ok_or_else(|| format!("no program {prog}"))?;
            let link: FdLink = match id {
                LinkId::FExit(id) => <&mut FExit>::try_from(p)
                    .and_then(|p| p.take_link(id))
                    .map_err(|e| format!("{prog}: {}", chain(&e)))?
                    .into(),
                LinkId::Lsm(id) => <&mut Lsm>::try_from(p)
                    .and_then(|p| p.take_link(id))
                    .map_err(|e| format!("{prog}: {}", chain(&e)))?
                    .into(),
            };
            // Dropping the returned handle closes this process's file
            // descriptor; the pin keeps the program attached.
            let link = link.pin(&path).map_err(|e| {
                format!(
                    "cannot pin the guard's link {prog} at {}: {}",
                    path.display(),
                    chain(&e)
                )
            })?;
            let spare = PinnedLink::from_pin(&path).ok().map(FdLink::from);
            self.held.push((prog, FdLink::from(link), spare));
            pinned.push(prog);
        }
        Ok(pinned)
    }

    /// Pins again, in `dir` (made when missing), whatever of this guard's
    /// maps and links is missing there: someone removed its pins while it
    /// runs. Returns the names pinned.
    pub fn repin(&mut self, dir: &Path) -> Result<Vec<String>, String> {
        match fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
        }
        let mut done = Vec::new();
        for (map, name) in pins::MAP_PINS {
            let path = dir.join(name);
            if path.exists() {
                continue;
            }
            let r = if map == MAP_EVENTS {
                self.events
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|e| e.to_string())
                    .and_then(|fd| MapData::from_fd(fd).map_err(|e| chain(&e)))
                    .and_then(|m| m.pin(&path).map_err(|e| chain(&e)))
            } else {
                self.map(map)
                    .map_err(|e| e.to_string())
                    .and_then(|m| m.pin(&path).map_err(|e| chain(&e)))
            };
            r.map_err(|e| {
                format!(
                    "cannot pin the guard's map {map} again at {}: {e}",
                    path.display()
                )
            })?;
            done.push(name.to_string());
        }
        for (prog, _, spare) in &mut self.held {
            let path = dir.join(link_pin(prog));
            if path.exists() {
                continue;
            }
            let Some(link) = spare.take() else {
                return Err(format!(
                    "cannot pin the guard's link {prog} again at {}: a pin failed before; restart \
                     the exporter to pin a new guard",
                    path.display()
                ));
            };
            let link = link.pin(&path).map_err(|e| {
                format!(
                    "cannot pin the guard's link {prog} again at {}: {}",
                    path.display(),
                    chain(&e)
                )
            })?;
            *spare = Some(FdLink::from(link));
            done.push(link_pin(prog));
        }
        Ok(done)
    }
}

/// The pin name of one of the object's maps.
pub(super) fn pin_name(map: &str) -> &'static str {
    pins::MAP_PINS
        .iter()
        .find(|(m, _)| *m == map)
        .map(|(_, p)| *p)
        .expect("every pinned map is listed")
}
