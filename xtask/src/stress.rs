//! `cargo xtask stress [--secs N] [--seed S]`: the concurrency stress test
//! (tests/tests/stress.rs) for N seconds per filesystem instead of the few
//! rounds `cargo xtask test` runs; same VM, same checks after every round.

use anyhow::{bail, Context, Result};

pub fn main(args: &[String]) -> Result<u8> {
    let mut secs = "300".to_string();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--secs" => secs = it.next().context("--secs needs a number")?.clone(),
            "--seed" => {
                let seed = it.next().context("--seed needs a number")?;
                std::env::set_var("PRJQUOTA_STRESS_SEED", seed);
            }
            other => bail!("stress: unknown argument `{other}`"),
        }
    }
    secs.parse::<u64>()
        .context("--secs must be a whole number")?;
    std::env::set_var("PRJQUOTA_STRESS_SECS", &secs);
    crate::test::main(&[
        "--vm-only".into(),
        "--filter".into(),
        "binary(stress)".into(),
        // The rounds survived and the seed are the point of a long run:
        // show them for passing tests too.
        "--".into(),
        "--success-output".into(),
        "final".into(),
    ])
}
