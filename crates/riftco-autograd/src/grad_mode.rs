//! Thread-local gradient recording switch.
//!
//! Inside [`no_grad`] (or while a [`NoGradGuard`] lives) ops compute values without recording a
//! graph: their results are constants. Incremental decoding runs this way.

use std::cell::Cell;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Whether ops on this thread record graph nodes.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Sets whether ops on this thread record graph nodes and returns the previous setting (for
/// bindings whose scopes are not Rust scopes, such as Python context managers, which restore
/// the returned value on exit).
pub fn set_grad_enabled(enabled: bool) -> bool {
    GRAD_ENABLED.with(|g| g.replace(enabled))
}

/// Disables graph recording on this thread until dropped, restoring the previous state.
#[must_use = "recording resumes when the guard is dropped"]
pub struct NoGradGuard {
    previous: bool,
}

impl NoGradGuard {
    /// Disables recording.
    pub fn new() -> Self {
        let previous = GRAD_ENABLED.with(|g| g.replace(false));
        Self { previous }
    }
}

impl Default for NoGradGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.previous));
    }
}

/// Runs `f` without recording a graph.
pub fn no_grad<T>(f: impl FnOnce() -> T) -> T {
    let _guard = NoGradGuard::new();
    f()
}

/// Runs `f` with recording enabled, also inside [`no_grad`] (PyTorch's `torch.enable_grad`;
/// used by checkpoint replay and by measurements that need a graph).
pub fn enable_grad<T>(f: impl FnOnce() -> T) -> T {
    let previous = GRAD_ENABLED.with(|g| g.replace(true));
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GRAD_ENABLED.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(previous);
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_grad_enabled_returns_the_previous_setting_and_guards_nest_over_it() {
        assert!(is_grad_enabled());
        assert!(set_grad_enabled(false));
        assert!(!is_grad_enabled());
        enable_grad(|| assert!(is_grad_enabled()));
        assert!(!is_grad_enabled());
        assert!(!set_grad_enabled(true));
        {
            let _g = NoGradGuard::new();
            assert!(!is_grad_enabled());
        }
        assert!(is_grad_enabled());
    }
}
