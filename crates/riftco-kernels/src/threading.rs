//! The one rayon pool every kernel runs on.
//!
//! Its size comes from `RIFTCO_NUM_THREADS` when set to a positive integer, otherwise from the
//! number of physical cores (`std::thread::available_parallelism` counts logical CPUs; we halve it
//! when the machine reports SMT siblings through `/sys`, and never go below 1).
//!
//! A requested count is honoured as given, also above the core count (oversubscribing is the
//! user's call), up to [`max_threads`] (4 threads per logical CPU, at least 64): more is capped
//! there. A value that is not a positive integer is ignored. Either case prints one warning line
//! on stderr naming the value and the count used, and so does a pool the OS refuses (fewer
//! threads are tried, down to one): never a silent change of the thread count.

use std::sync::OnceLock;

static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();

/// The number of worker threads kernels use (>= 1).
pub fn num_threads() -> usize {
    thread_pool().current_num_threads()
}

/// The shared kernel thread pool, built on first use.
pub fn thread_pool() -> &'static rayon::ThreadPool {
    POOL.get_or_init(|| {
        let (n, warning) = match requested_threads(std::env::var("RIFTCO_NUM_THREADS").ok()) {
            Requested::Unset => (physical_cores(), None),
            Requested::Count(n) => (n, None),
            Requested::Capped { asked, used } => (
                used,
                Some(format!(
                    "RIFTCO_NUM_THREADS={asked} is above the limit of {used} kernel threads (4 \
                     per logical CPU, at least 64): using {used}"
                )),
            ),
            Requested::Invalid(text) => {
                let n = physical_cores();
                (
                    n,
                    Some(format!(
                        "RIFTCO_NUM_THREADS={text:?} is not a positive integer: ignored, using \
                         {n} kernel threads (the physical cores)"
                    )),
                )
            }
        };
        if let Some(w) = warning {
            eprintln!("riftco: warning: {w}");
        }
        let mut tried = n.max(1);
        loop {
            match rayon::ThreadPoolBuilder::new()
                .num_threads(tried)
                .thread_name(|i| format!("riftco-kernel-{i}"))
                .build()
            {
                Ok(pool) => {
                    if tried != n.max(1) {
                        eprintln!(
                            "riftco: warning: the OS refused {n} kernel threads: using {tried}"
                        );
                    }
                    return pool;
                }
                // Building a pool only fails when the OS refuses threads: try fewer.
                Err(_) if tried > 1 => tried /= 2,
                Err(e) => panic!("a one-thread rayon pool cannot be built: {e}"),
            }
        }
    })
}

/// What `RIFTCO_NUM_THREADS` asks for.
#[derive(Debug, PartialEq, Eq)]
enum Requested {
    Unset,
    Count(usize),
    Capped { asked: String, used: usize },
    Invalid(String),
}

/// The most kernel threads a request gets: 4 per logical CPU, at least 64.
pub fn max_threads() -> usize {
    let logical = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    logical.saturating_mul(4).max(64)
}

fn requested_threads(value: Option<String>) -> Requested {
    let Some(text) = value else {
        return Requested::Unset;
    };
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Requested::Unset;
    }
    let digits = trimmed.bytes().all(|b| b.is_ascii_digit());
    match trimmed.parse::<usize>() {
        Ok(0) => Requested::Invalid(text),
        Ok(n) if n > max_threads() => Requested::Capped {
            asked: trimmed.to_string(),
            used: max_threads(),
        },
        Ok(n) => Requested::Count(n),
        // A count too large for usize is still a count: capped.
        Err(_) if digits => Requested::Capped {
            asked: trimmed.to_string(),
            used: max_threads(),
        },
        Err(_) => Requested::Invalid(text),
    }
}

fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let smt = std::fs::read_to_string("/sys/devices/system/cpu/smt/active")
        .map(|s| s.trim() == "1")
        .unwrap_or(false);
    if smt {
        (logical / 2).max(1)
    } else {
        logical
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_honoured_capped_or_reported() {
        assert_eq!(requested_threads(None), Requested::Unset);
        assert_eq!(requested_threads(Some("  ".into())), Requested::Unset);
        assert_eq!(requested_threads(Some("3".into())), Requested::Count(3));
        // Above the core count but within the limit: honoured as given.
        assert_eq!(requested_threads(Some("64".into())), Requested::Count(64));
        let max = max_threads();
        assert_eq!(
            requested_threads(Some((max + 1).to_string())),
            Requested::Capped {
                asked: (max + 1).to_string(),
                used: max
            }
        );
        assert_eq!(
            requested_threads(Some("99999999999999999999999".into())),
            Requested::Capped {
                asked: "99999999999999999999999".into(),
                used: max
            }
        );
        for bad in ["0", "-1", "abc", "2.5"] {
            assert_eq!(
                requested_threads(Some(bad.into())),
                Requested::Invalid(bad.into())
            );
        }
    }
}
