//! Settings read from the environment: one place that parses them and
//! says when a value is ignored, so a mistyped setting is never silently
//! dropped.

use std::collections::BTreeSet;
use std::sync::Mutex;

/// The count in variable `var` (a whole number of at least `min`): `None`
/// when unset, and when set to anything else, with a warning that names
/// the variable, its value and what it takes ([`ignored`]). Callers that
/// read a setting often keep the result.
pub fn count(var: &str, min: usize) -> Option<usize> {
    let v = std::env::var(var).ok()?;
    match v.trim().parse::<usize>() {
        Ok(n) if n >= min => Some(n),
        _ => {
            ignored(var, &v, &format!("a whole number of at least {min}"));
            None
        }
    }
}

/// The value that `var` names among `choices` (a name and its value each;
/// spaces around the name are allowed): `None` when unset, and when set to
/// anything else, with a warning that lists the names ([`ignored`]).
pub fn choice<T: Copy>(var: &str, choices: &[(&str, T)]) -> Option<T> {
    let v = std::env::var(var).ok()?;
    if let Some((_, t)) = choices.iter().find(|(name, _)| *name == v.trim()) {
        return Some(*t);
    }
    let names: Vec<String> = choices
        .iter()
        .map(|(name, _)| format!("{name:?}"))
        .collect();
    let expected = match names.as_slice() {
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
        [] => "nothing (it takes no value)".into(),
    };
    ignored(var, &v, &expected);
    None
}

/// Says that `var`'s value `value` is ignored and what it takes, once per
/// variable: as a `tracing` warning where the program has installed a
/// subscriber, else on standard error, since a program without one would
/// otherwise never hear of its mistyped setting.
pub fn ignored(var: &str, value: &str, expected: &str) {
    static SAID: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let first = SAID
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(var.to_string());
    if !first {
        return;
    }
    let text = format!("{var}={value:?} ignored: expected {expected}");
    if tracing::dispatcher::has_been_set() {
        tracing::warn!("{text}");
    } else {
        eprintln!("braid: {text}");
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

    /// A name among the choices gives its value (spaces around it too);
    /// any other value, and an unset variable, gives none.
    #[test]
    fn choices_and_what_is_ignored() {
        let var = "BRAID_ENV_CHOICE_TEST";
        let choices = [("park", 1), ("poll", 2)];
        for (value, want) in [
            ("park", Some(1)),
            (" poll\n", Some(2)),
            ("Park", None),
            ("spin", None),
            ("", None),
        ] {
            // SAFETY: as in `counts_and_what_is_ignored`.
            unsafe { std::env::set_var(var, value) };
            assert_eq!(choice(var, &choices), want, "{value:?}");
        }
        // SAFETY: as above.
        unsafe { std::env::remove_var(var) };
        assert_eq!(choice(var, &choices), None);
    }
}
