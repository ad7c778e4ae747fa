//! librdkafka settings as the consumer and the dead letters keep them:
//! in order (a later one wins), and never shown with their secrets.

/// `(name, value)` pairs; `Debug` hides the value of a key, a password or
/// a secret (`ssl.key.pem`, `sasl.password`, ...).
#[derive(Clone, Default)]
pub(crate) struct Settings(pub(crate) Vec<(String, String)>);

/// Whether a setting's value is a secret.
fn secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name == "ssl.key.pem"
        || name.contains("password")
        || name.contains("secret")
        || name.ends_with(".key")
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, v)| {
                if secret(k) {
                    (k.as_str(), "***")
                } else {
                    (k.as_str(), v.as_str())
                }
            }))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_not_shown() {
        let s = Settings(vec![
            ("ssl.key.pem".into(), "-----BEGIN PRIVATE KEY-----".into()),
            ("sasl.password".into(), "hunter2".into()),
            ("client.id".into(), "stock-1".into()),
        ]);
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("PRIVATE") && !shown.contains("hunter2"),
            "{shown}"
        );
        assert!(shown.contains("stock-1"), "{shown}");
    }
}
