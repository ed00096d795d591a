//! The runbooks' mitigation steps as the tests run them: the fenced
//! blocks of an alert's section of docs/runbooks.md from its
//! `**Mitigation.**` paragraph on, in order.

use crate::readme::{blocks_of_section, Block};

/// The runbooks, as this build of the tests was compiled with.
const RUNBOOKS: &str = include_str!("../../docs/runbooks.md");

/// The fenced blocks of `alert`'s mitigation, in order; panics when the
/// section or its `**Mitigation.**` paragraph is missing.
pub fn mitigation(alert: &str) -> Vec<Block> {
    let heading = format!("## {alert}");
    let section: Vec<&str> = RUNBOOKS
        .lines()
        .skip_while(|l| l.trim_end() != heading)
        .collect();
    assert!(!section.is_empty(), "docs/runbooks.md has no {heading}");
    let from = section
        .iter()
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .position(|l| l.starts_with("**Mitigation.**"))
        .unwrap_or_else(|| panic!("{heading} has no **Mitigation.** paragraph"));
    let rest = format!("## mitigation\n{}", section[from + 1..].join("\n"));
    blocks_of_section(&rest, "## mitigation")
}
