//! Fault-injection points for the crash-consistency tests.
//!
//! With the `fault-injection` feature, `point(name)` aborts the process (as
//! abruptly as `kill -9`: no destructors, no output) when the environment
//! variable `PRJQUOTA_FAULT` equals `name`. Without the feature it compiles to
//! nothing, so release builds carry no switch that an environment could flip.

/// Marks a point between two steps of create or delete.
#[inline(always)]
pub fn point(name: &str) {
    #[cfg(feature = "fault-injection")]
    if std::env::var_os("PRJQUOTA_FAULT").is_some_and(|v| v == name) {
        std::process::abort();
    }
    #[cfg(not(feature = "fault-injection"))]
    let _ = name;
}
