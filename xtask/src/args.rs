//! Hand-parsed options: what clap does not parse yet.

use anyhow::{bail, Result};

/// Takes the value of option `name` at `args[*i]` (`--name VALUE` or
/// `--name=VALUE`), advancing `i`; `None` if `args[*i]` is another option.
pub fn take_value(args: &[String], i: &mut usize, name: &str) -> Result<Option<String>> {
    let arg = &args[*i];
    if let Some(v) = arg.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
        return Ok(Some(v.to_string()));
    }
    if arg != name {
        return Ok(None);
    }
    *i += 1;
    match args.get(*i) {
        Some(v) => Ok(Some(v.clone())),
        None => bail!("{name} needs a value"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let args: Vec<String> = ["--fs", "ext4", "--memory=3G", "x"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut i = 0;
        assert_eq!(
            take_value(&args, &mut i, "--fs").unwrap().as_deref(),
            Some("ext4")
        );
        assert_eq!(i, 1);
        i = 2;
        assert_eq!(
            take_value(&args, &mut i, "--memory").unwrap().as_deref(),
            Some("3G")
        );
        i = 3;
        assert_eq!(take_value(&args, &mut i, "--fs").unwrap(), None);
    }
}
