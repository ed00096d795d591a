//! A pass's result from nextest's output: its summary, the tests that
//! failed or never finished, and each binary's count against its floor.

use super::opts::VM_PACKAGE;

/// The committed minimum of tests per test binary (see the file).
pub(super) const FLOORS: &str = include_str!("../../test-floors.txt");

/// Counts from one nextest `Summary` line.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) run: u64,
    pub(super) passed: u64,
    pub(super) failed: u64,
}

pub(super) struct Pass {
    pub(super) name: String,
    pub(super) summary: Option<String>,
    pub(super) counts: Counts,
    pub(super) ok: bool,
    pub(super) secs: f64,
    /// Why the pass failed beyond its test results: binaries below their
    /// floor, a VM that did not boot or was killed.
    pub(super) problems: Vec<String>,
    /// The tests nextest reported failed, timed out or killed, by name.
    pub(super) failures: Vec<String>,
}

/// A pass's result from its output. `filtered`: the user chose the tests
/// (none may match); `floors`: hold each binary to its committed minimum.
pub(super) fn pass(
    name: String,
    lines: &[String],
    exit_ok: bool,
    filtered: bool,
    floors: Option<bool>,
    secs: f64,
) -> Pass {
    let summary = lines
        .iter()
        .rev()
        .find(|l| l.trim_start().starts_with("Summary [") && l.contains(" run: "))
        .cloned();
    let counts = summary
        .as_deref()
        .and_then(parse_summary)
        .unwrap_or_default();
    let ran_some = counts.run > 0 || filtered;
    let problems = match floors {
        Some(vm) => below_floor(&parse_floors(FLOORS), &tests_per_binary(lines), vm),
        None => Vec::new(),
    };
    Pass {
        name,
        ok: exit_ok && summary.is_some() && counts.failed == 0 && ran_some && problems.is_empty(),
        summary,
        counts,
        secs,
        problems,
        failures: failed_tests(lines),
    }
}

/// The tests of nextest's status lines that failed, timed out or died of a
/// signal (`FAIL [ 1.2s] prjquota-vmtests::guard xfs::name`), each once,
/// whatever prefix a lane gave the line.
pub(super) fn failed_tests(lines: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for l in lines {
        let words: Vec<&str> = l.split_whitespace().collect();
        let Some(i) = words
            .iter()
            .position(|w| *w == "FAIL" || *w == "TIMEOUT" || (w.starts_with("SIG") && w.len() > 3))
        else {
            continue;
        };
        let Some(close) = words[i + 1..].iter().position(|w| w.ends_with(']')) else {
            continue;
        };
        if !words.get(i + 1).is_some_and(|w| w.starts_with('[')) {
            continue;
        }
        let name = words[i + 2 + close..].join(" ");
        if name.starts_with(VM_PACKAGE) && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// The test of a failed systemd boot that failed: the boot runs `tests`
/// one by one and stops at the first that fails, the one after those whose
/// libtest summary said ok.
pub(super) fn failed_in_boot<'a>(tests: &[&'a str], lines: &[String]) -> Option<&'a str> {
    let ok = lines
        .iter()
        .filter(|l| l.starts_with("test result: ok."))
        .count();
    tests.get(ok).copied()
}

/// `filter` less the tests `finished`: what a boot resuming a pass runs.
pub(super) fn without_finished(
    filter: &str,
    finished: &std::collections::BTreeSet<(String, String)>,
) -> String {
    if finished.is_empty() {
        return filter.to_string();
    }
    let done = finished
        .iter()
        .map(|(bin, test)| format!("(binary_id(={bin}) & test(={test}))"))
        .collect::<Vec<_>>()
        .join(" | ");
    format!("({filter}) - ({done})")
}

/// The tests of a panicked boot's status lines that finished, as a
/// summary would count them: passed, or failed in any way.
pub(super) fn finished_counts(lines: &[String]) -> Counts {
    // The last word on each test: a retried test's last try decides.
    let mut last = std::collections::BTreeMap::new();
    for (status, bin, test) in lines.iter().filter_map(|l| status_line(l)) {
        let failed = matches!(status, "FAIL" | "TIMEOUT" | "ABORT") || status.starts_with("SIG");
        if status == "PASS" || failed {
            last.insert((bin, test), failed);
        }
    }
    let failed = last.values().filter(|f| **f).count() as u64;
    Counts {
        run: last.len() as u64,
        passed: last.len() as u64 - failed,
        failed,
    }
}

/// `binary-id minimum` lines of the floors file (`#` starts a comment).
pub(super) fn parse_floors(text: &str) -> Vec<(String, usize)> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .filter_map(|l| {
            let (bin, n) = l.split_once(char::is_whitespace)?;
            Some((bin.to_string(), n.trim().parse().ok()?))
        })
        .collect()
}

/// How many distinct tests of each binary finished, from nextest's status
/// lines (`PASS [   0.005s] (1/9) prjquota-vmtests::plugin xfs::a_test`).
pub(super) fn tests_per_binary(lines: &[String]) -> std::collections::BTreeMap<String, usize> {
    let mut per = std::collections::BTreeMap::new();
    for (bin, _) in tests_per_binary_names(lines) {
        *per.entry(bin).or_insert(0) += 1;
    }
    per
}

/// A nextest status line's status, binary and test
/// (`PASS [   0.005s] (1/9) prjquota-vmtests::plugin xfs::a_test`; a retry's
/// `TRY 2 PASS [...]` gives `PASS`).
pub(super) fn status_line(line: &str) -> Option<(&str, &str, &str)> {
    let l = line.trim_start();
    let l = l
        .strip_prefix("TRY ")
        .and_then(|r| r.split_once(' '))
        .map_or(l, |(_, r)| r);
    let (status, rest) = l.split_once(" [")?;
    if status.is_empty() || !status.chars().all(|c| c.is_ascii_uppercase() || c == '-') {
        return None;
    }
    let (_, rest) = rest.split_once("] ")?;
    let rest = match rest.strip_prefix('(') {
        Some(r) => r.split_once(") ").map_or("", |(_, r)| r),
        None => rest,
    };
    let mut words = rest.split_whitespace();
    Some((status, words.next()?, words.next()?))
}

/// Each `(binary, test)` that finished, from nextest's status lines.
pub(super) fn tests_per_binary_names(
    lines: &[String],
) -> std::collections::BTreeSet<(String, String)> {
    lines
        .iter()
        .filter_map(|l| status_line(l))
        .filter(|(status, _, _)| {
            !matches!(
                *status,
                "SLOW" | "START" | "RETRY" | "SETUP" | "CANCEL" | "TERMINATING"
            )
        })
        .map(|(_, bin, test)| (bin.to_string(), test.to_string()))
        .collect()
}

/// The tests nextest called slow (`SLOW [> 60.000s] bin test`) that never
/// finished: what a VM killed at its limit was running.
pub(super) fn unfinished(lines: &[String]) -> Vec<String> {
    let finished = tests_per_binary_names(lines);
    let mut slow: Vec<(String, String)> = Vec::new();
    for (status, bin, test) in lines.iter().filter_map(|l| status_line(l)) {
        let key = (bin.to_string(), test.to_string());
        if status == "SLOW" && !finished.contains(&key) && !slow.contains(&key) {
            slow.push(key);
        }
    }
    slow.into_iter().map(|(b, t)| format!("{b} {t}")).collect()
}

/// The floors this pass's binaries missed: the real-kernel test binaries
/// for a VM pass (`vm`), every other binary for the host pass. A binary
/// missing from the output ran 0 tests.
pub(super) fn below_floor(
    floors: &[(String, usize)],
    ran: &std::collections::BTreeMap<String, usize>,
    vm: bool,
) -> Vec<String> {
    let is_vm = |bin: &str| bin.split("::").next() == Some(VM_PACKAGE);
    floors
        .iter()
        .filter(|(bin, _)| is_vm(bin) == vm)
        .filter_map(|(bin, min)| {
            let n = ran.get(bin).copied().unwrap_or(0);
            (n < *min).then(|| {
                format!(
                    "{bin} ran {n} tests, fewer than its floor of {min} (xtask/test-floors.txt)"
                )
            })
        })
        .collect()
}

/// Parses nextest's closing line, e.g.
/// `Summary [   1.234s] 5 tests run: 4 passed (1 slow), 1 failed, 2 skipped`
/// (or `3/5 tests run: ...` when cancelled).
pub(super) fn parse_summary(line: &str) -> Option<Counts> {
    let after = line.split_once("] ")?.1;
    let (run_part, results) = after.split_once(" run: ")?;
    let run_count = run_part.split_whitespace().next()?;
    let run: u64 = run_count.split('/').next()?.parse().ok()?;
    let mut counts = Counts {
        run,
        ..Counts::default()
    };
    for item in results.split(", ") {
        let (n, what) = item.trim().split_once(' ')?;
        let n: u64 = n.parse().ok()?;
        let what = what.split(" (").next()?.trim();
        match what {
            "passed" => counts.passed += n,
            "skipped" | "leaky" | "flaky" | "slow" => {}
            // failed, timed out, exec fail, ...
            _ => counts.failed += n,
        }
    }
    Some(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_pass_names_its_failed_tests_once() {
        let lines: Vec<String> = [
            "        PASS [   1.0s] prjquota-vmtests::crash xfs::ok",
            "[6.12]         FAIL [  38.3s] prjquota-vmtests::guard xfs::broken",
            "     TIMEOUT [ 120.0s] prjquota-vmtests::guard ext4::slow",
            "     SIGSEGV [   0.1s] prjquota-vmtests::ebpf crashed",
            "        FAIL [  38.3s] prjquota-vmtests::guard xfs::broken",
            "thread 'x' panicked: FAIL [not a status line]",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            failed_tests(&lines),
            [
                "prjquota-vmtests::guard xfs::broken",
                "prjquota-vmtests::guard ext4::slow",
                "prjquota-vmtests::ebpf crashed"
            ]
        );
    }

    #[test]
    fn a_failed_systemd_boot_names_the_test_after_those_that_passed() {
        let lines: Vec<String> = [
            "test result: ok. 1 passed; 0 failed; 0 ignored",
            "thread 'b' panicked at tests/tests/systemd.rs:1:1:",
            "FAILED",
            "test result: FAILED. 0 passed; 1 failed; 0 ignored",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(failed_in_boot(&["a", "b", "c"], &lines), Some("b"));
        assert_eq!(failed_in_boot(&["a"], &lines[..1]), None);
    }

    #[test]
    fn a_boot_after_a_panic_runs_only_what_no_boot_finished() {
        let lines: Vec<String> = [
            "        PASS [   4.7s] (1/9) prjquota-vmtests::guard xfs::a",
            "        FAIL [   2.1s] (2/9) prjquota-vmtests::plugin ext4::b",
            "        SLOW [> 60.0s] prjquota-vmtests::ebpf xfs::c",
            "[  528.6] Kernel panic - not syncing: softlockup: hung tasks",
        ]
        .iter()
        .map(|l| l.to_string())
        .collect();
        let finished = tests_per_binary_names(&lines);
        assert_eq!(
            without_finished("(all()) - binary(systemd)", &finished),
            "((all()) - binary(systemd)) - ((binary_id(=prjquota-vmtests::guard) & \
             test(=xfs::a)) | (binary_id(=prjquota-vmtests::plugin) & test(=ext4::b)))"
        );
        assert_eq!(
            without_finished("all()", &std::collections::BTreeSet::new()),
            "all()"
        );
        // The slow test was interrupted: it runs again, and counts once.
        assert_eq!(
            finished_counts(&lines),
            Counts {
                run: 2,
                passed: 1,
                failed: 1
            }
        );
    }

    #[test]
    fn summaries() {
        let c = |run, passed, failed| Counts {
            run,
            passed,
            failed,
        };
        assert_eq!(
            parse_summary("     Summary [   0.012s] 3 tests run: 3 passed, 0 skipped"),
            Some(c(3, 3, 0))
        );
        assert_eq!(
            parse_summary("Summary [   1.2s] 1 test run: 0 passed, 1 failed, 0 skipped"),
            Some(c(1, 0, 1))
        );
        assert_eq!(
            parse_summary("Summary [ 9.0s] 3/5 tests run: 1 passed (1 slow), 1 failed, 1 timed out, 2 skipped"),
            Some(c(3, 1, 2))
        );
        assert_eq!(parse_summary("Summary [ 0.0s] nonsense"), None);
    }

    #[test]
    fn tests_are_counted_per_binary_once() {
        let lines: Vec<String> = [
            "        PASS [   0.005s] (1/9) prjquota mountinfo::tests::a",
            "        SLOW [> 60.000s] (2/9) prjquota-vmtests::plugin xfs::b",
            "        FAIL [  61.000s] (2/9) prjquota-vmtests::plugin xfs::b",
            "  TRY 2 PASS [   1.000s] (3/9) prjquota-vmtests::plugin xfs::c",
            "        PASS [   0.100s] prjquota-vmtests::crash xfs::d",
            // nextest repeats failures at the end
            "        FAIL [  61.000s] (2/9) prjquota-vmtests::plugin xfs::b",
            "     Summary [   0.029s] 4 tests run: 3 passed, 1 failed",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let per = tests_per_binary(&lines);
        assert_eq!(per.get("prjquota"), Some(&1));
        assert_eq!(per.get("prjquota-vmtests::plugin"), Some(&2));
        assert_eq!(per.get("prjquota-vmtests::crash"), Some(&1));
        assert_eq!(per.len(), 3);
    }

    #[test]
    fn a_killed_pass_names_the_slow_tests_that_never_finished() {
        let lines: Vec<String> = [
            "        SLOW [> 60.000s] prjquota-vmtests::plugin xfs::b",
            "        PASS [  61.000s] prjquota-vmtests::plugin xfs::b",
            "        SLOW [> 60.000s] (3/9) prjquota-vmtests::guard ext4::hangs",
            "        SLOW [>120.000s] (3/9) prjquota-vmtests::guard ext4::hangs",
            "        SLOW [> 60.000s] prjquota-vmtests::crash xfs::d",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            unfinished(&lines),
            [
                "prjquota-vmtests::guard ext4::hangs",
                "prjquota-vmtests::crash xfs::d"
            ]
        );
    }

    #[test]
    fn a_binary_below_its_floor_fails_its_own_pass_only() {
        let floors = parse_floors(
            "# c\nprjquota  2 # host\nprjquota-vmtests::plugin 2\nprjquota-vmtests::crash 1\n",
        );
        assert_eq!(floors.len(), 3);
        let ran: std::collections::BTreeMap<String, usize> =
            [("prjquota-vmtests::plugin".to_string(), 1)].into();
        let short = below_floor(&floors, &ran, true);
        assert_eq!(short.len(), 2, "{short:?}");
        assert!(short[0].contains("plugin ran 1 tests"));
        assert!(short[1].contains("crash ran 0 tests"));
        assert_eq!(below_floor(&floors, &ran, false).len(), 1);
        // The committed file parses, one floor per line.
        assert!(parse_floors(FLOORS).len() >= 20);
    }
}
