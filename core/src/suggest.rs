//! "Did you mean": the nearest known flag to a mistyped one, for the
//! plugin's operator commands and the exporter alike, so that both answer a
//! typo the same way.

/// Edits (insertions, deletions, substitutions, swaps of two neighbours)
/// between `a` and `b`: a swap is one slip of the fingers, not two.
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // Three rows of the optimal-string-alignment table: a swap looks two
    // rows back.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                cur[j] = cur[j].min(before[j - 2] + 1);
            }
        }
        std::mem::swap(&mut before, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The known name closest to `typed`, if it is close enough to be what was
/// meant: one edit for a short name, up to three for a long one, so that
/// `--web.listen-adress` finds `--web.listen-address` but `--nope` finds
/// nothing. A tie goes to the first in `known`.
pub fn nearest<'a>(typed: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let typed_len = typed.trim_start_matches('-').chars().count();
    let limit = (typed_len / 6).clamp(1, 3);
    known
        .into_iter()
        .map(|k| (distance(typed, k), k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// "unknown flag --x", with "; did you mean --y?" when a known flag is
/// near. `typed` is the flag as given, without any `=value`.
pub fn unknown_flag<'a>(typed: &str, known: impl IntoIterator<Item = &'a str>) -> String {
    match nearest(typed, known) {
        Some(k) => format!("unknown flag {typed}; did you mean {k}?"),
        None => format!("unknown flag {typed}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_counts_slips() {
        assert_eq!(distance("", ""), 0);
        assert_eq!(distance("abc", ""), 3);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("json", "json"), 0);
        assert_eq!(distance("jsn", "json"), 1);
        assert_eq!(distance("josn", "json"), 1);
        assert_eq!(distance("jason", "json"), 1);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("ça", "ca"), 1);
    }

    const EXPORTER: [&str; 5] = [
        "--web.listen-address",
        "--web.config.file",
        "--web.telemetry-path",
        "--volumes-dir",
        "--log.level",
    ];

    #[test]
    fn a_near_typo_gets_a_suggestion_and_a_far_one_none() {
        assert_eq!(
            unknown_flag("--web.listen-adress", EXPORTER),
            "unknown flag --web.listen-adress; did you mean --web.listen-address?"
        );
        assert_eq!(nearest("--web.config", EXPORTER), None);
        assert_eq!(
            nearest("--web.config-file", EXPORTER),
            Some("--web.config.file")
        );
        assert_eq!(nearest("--volume-dir", EXPORTER), Some("--volumes-dir"));
        assert_eq!(nearest("--log.levle", EXPORTER), Some("--log.level"));
        assert_eq!(nearest("--jsno", ["--json", "--fix"]), Some("--json"));
        assert_eq!(nearest("--fx", ["--json", "--fix"]), Some("--fix"));
        assert_eq!(nearest("--nope", ["--json", "--fix"]), None);
        assert_eq!(nearest("--x", ["--json", "--fix"]), None);
        assert_eq!(unknown_flag("--nope", ["--json"]), "unknown flag --nope");
    }
}
