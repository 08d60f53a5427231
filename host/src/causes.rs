//! The chain of causes behind an error, for the few places that look past
//! an error's own words: the innermost cause for a message, or a cause of
//! one type (a refused certificate, a body over its limit). Walks only;
//! never words anything.

use std::error::Error;

/// `error`, then each cause under it, innermost last. An `io::Error`'s own
/// `source` skips the error it wraps (hyper-rustls wraps rustls' twice on
/// the way through): the walk steps into the wrapped error instead, whose
/// words are the same.
pub(crate) fn causes<'a>(
    error: &'a (dyn Error + 'static),
) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(error), |&e: &&'a (dyn Error + 'static)| {
        match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(wrapped) => Some(wrapped as &(dyn Error + 'static)),
            None => e.source(),
        }
    })
}

/// Clients' own words ("error sending request for url …") hide the
/// reason; the innermost cause ("Connection refused") is what people need.
pub(crate) fn innermost(e: &(dyn Error + 'static)) -> String {
    causes(e).last().unwrap_or(e).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("wrapped")]
    struct Wrapped;

    #[test]
    fn the_walk_goes_through_an_io_error_into_what_it_wraps() {
        let error = Outer(std::io::Error::other(Wrapped));
        let words: Vec<String> = causes(&error).map(|e| e.to_string()).collect();
        // The io::Error words itself as what it wraps.
        assert_eq!(words, ["outer", "wrapped", "wrapped"]);
        assert!(causes(&error).any(|e| e.is::<Wrapped>()));
        let plain = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(causes(&plain).count(), 1);
    }
}
