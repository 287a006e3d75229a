//! The statement retry loop, written once.
//!
//! A statement (DML, an index change, a rewrite, an ALTER) reads the latest version, does
//! its work and commits. When a concurrent writer committed something the statement cannot
//! be rebased over, the commit fails with a *retryable* error and the statement runs again
//! from a fresh read, at most `retries` more times. Anything else ends the loop at once.
//!
//! Errors of every layer say whether they are retryable through [`Retryable`]; the engine
//! implements it for `DataFusionError` by finding the root [`FormatError`].

use std::future::Future;

use super::super::error::FormatError;

/// An error that may say "a concurrent commit won; run the statement again".
pub trait Retryable {
    /// Whether running the statement again from a fresh read may succeed (a concurrent
    /// commit won).
    fn is_retryable(&self) -> bool;
}

impl Retryable for FormatError {
    fn is_retryable(&self) -> bool {
        FormatError::is_retryable(self)
    }
}

/// Runs `attempt(n)` for n = 0, 1, ... until it succeeds, fails with an error that is not
/// retryable, or has been retried `retries` times (the last error is returned).
pub async fn with_retries<T, E, F, Fut>(retries: usize, mut attempt: F) -> Result<T, E>
where
    E: Retryable,
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut n = 0;
    loop {
        match attempt(n).await {
            Err(e) if e.is_retryable() && n < retries => n += 1,
            done => return done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct E(bool);
    impl Retryable for E {
        fn is_retryable(&self) -> bool {
            self.0
        }
    }

    fn run(retries: usize, outcomes: Vec<Result<u32, E>>) -> (Result<u32, E>, usize) {
        let mut outcomes = outcomes.into_iter();
        let mut calls = 0;
        let got = futures::executor::block_on(with_retries(retries, |_| {
            calls += 1;
            let next = outcomes.next().expect("an outcome per attempt");
            async move { next }
        }));
        (got, calls)
    }

    #[test]
    fn retryable_errors_run_the_statement_again() {
        assert_eq!(run(5, vec![Err(E(true)), Err(E(true)), Ok(7)]), (Ok(7), 3));
    }

    #[test]
    fn other_errors_end_the_loop_at_once() {
        assert_eq!(run(5, vec![Err(E(false)), Ok(7)]), (Err(E(false)), 1));
    }

    #[test]
    fn the_last_error_is_returned_after_the_retries() {
        assert_eq!(run(1, vec![Err(E(true)), Err(E(true))]), (Err(E(true)), 2));
        assert_eq!(run(0, vec![Err(E(true))]), (Err(E(true)), 1));
    }
}
