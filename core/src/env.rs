//! Settings read from the environment: one place that parses them and
//! says when a value is ignored, so a mistyped setting is never silently
//! dropped.

/// The count in variable `var` (a whole number of at least `min`): `None`
/// when unset, and when set to anything else, with a warning that names
/// the variable, its value and what it takes. Callers that read a setting
/// often keep the result (the warning then comes once).
pub fn count(var: &str, min: usize) -> Option<usize> {
    let v = std::env::var(var).ok()?;
    match v.trim().parse::<usize>() {
        Ok(n) if n >= min => Some(n),
        _ => {
            tracing::warn!("{var}={v:?} ignored: expected a whole number of at least {min}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts at or above the least are taken (spaces around them too);
    /// anything else, and an unset variable, gives none.
    #[test]
    fn counts_and_what_is_ignored() {
        // (A name no other test sets; tests of this crate run in threads of
        // one process.)
        let var = "BRAID_ENV_COUNT_TEST";
        for (value, min, want) in [
            ("3", 1, Some(3)),
            (" 8 ", 1, Some(8)),
            ("0", 1, None),
            ("0", 0, Some(0)),
            ("x", 1, None),
            ("-2", 1, None),
            ("2.5", 1, None),
        ] {
            // SAFETY: std's environment calls take one lock, so Rust code
            // in other test threads is safe; no C code in this crate's
            // tests reads the environment (getenv would not take it).
            unsafe { std::env::set_var(var, value) };
            assert_eq!(count(var, min), want, "{value:?}");
        }
        // SAFETY: as above.
        unsafe { std::env::remove_var(var) };
        assert_eq!(count(var, 1), None);
    }
}
