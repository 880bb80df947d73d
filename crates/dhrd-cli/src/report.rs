//! How an error reaches the user: one line, the outermost context first and each cause
//! after it, every piece of text once.
//!
//! The library crates' error types print their cause inside their own message (`opening
//! backing X: <cause>`) and also name it as their `source`, so a plain walk of the chain
//! (anyhow's `{:#}`) printed such a cause twice. A cause whose text the line already holds
//! is left out here; one whose text is new is appended, so nothing is lost either way.
//!
//! Crash semantics: none.

/// The error and its causes on one line, each text once.
pub fn chain_text(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shaped like the library errors: the cause inside the message and as `source`.
    #[derive(Debug)]
    struct Embeds {
        name: &'static str,
        source: std::io::Error,
    }

    impl std::fmt::Display for Embeds {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "opening backing {}: {}", self.name, self.source)
        }
    }

    impl std::error::Error for Embeds {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_printed_inside_its_parents_message_appears_once() {
        let inner = std::io::Error::new(std::io::ErrorKind::ResourceBusy, "x is in use by pid 7");
        let e = anyhow::Error::new(Embeds {
            name: "x",
            source: inner,
        });
        assert_eq!(chain_text(&e), "opening backing x: x is in use by pid 7");
    }

    #[test]
    fn a_cause_not_in_the_message_is_appended_after_its_context() {
        let e = anyhow::Error::new(std::io::Error::from_raw_os_error(libc::ENOENT))
            .context("reading the config");
        assert_eq!(
            chain_text(&e),
            "reading the config: No such file or directory (os error 2)"
        );
    }
}
