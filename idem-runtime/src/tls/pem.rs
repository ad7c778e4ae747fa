//! PEM text read once, checked for what it must hold.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::TlsError;

/// PEM bytes and where they came from (for errors and `Debug`).
#[derive(Clone)]
pub(crate) struct Pem {
    bytes: Arc<[u8]>,
    origin: Arc<str>,
}

impl Pem {
    pub(crate) fn read(what: &'static str, path: &Path) -> Result<Pem, TlsError> {
        let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
            what,
            path: path.to_owned(),
            source,
        })?;
        Ok(Pem {
            bytes: bytes.into(),
            origin: format!("`{}`", path.display()).into(),
        })
    }

    pub(crate) fn given(bytes: &[u8]) -> Pem {
        Pem {
            bytes: bytes.into(),
            origin: "given as PEM".into(),
        }
    }

    pub(crate) fn origin(&self) -> &str {
        &self.origin
    }

    #[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The PEM as text; PEM is ASCII, and what is not was refused when it
    /// was checked (a certificate or key PEM parses only from ASCII armour).
    #[cfg(feature = "kafka")]
    pub(crate) fn text(&self) -> &str {
        std::str::from_utf8(&self.bytes).unwrap_or_default()
    }

    /// The certificates it holds, in order.
    pub(crate) fn certificates(&self) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(&self.bytes)
            .filter_map(Result::ok)
            .collect()
    }

    /// Its first private key.
    #[cfg(any(feature = "nats", feature = "rabbitmq"))]
    pub(crate) fn private_key(&self) -> Option<PrivateKeyDer<'static>> {
        PrivateKeyDer::from_pem_slice(&self.bytes).ok()
    }

    pub(crate) fn expect_certificate(&self, what: &'static str) -> Result<(), TlsError> {
        if std::str::from_utf8(&self.bytes).is_ok() && !self.certificates().is_empty() {
            Ok(())
        } else {
            Err(self.missing(what, "CERTIFICATE"))
        }
    }

    pub(crate) fn expect_private_key(&self, what: &'static str) -> Result<(), TlsError> {
        let text = std::str::from_utf8(&self.bytes).unwrap_or_default();
        if text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----") {
            // rustls reads no encrypted key: say so rather than "none"
            return Err(self.missing(
                what,
                "unencrypted PRIVATE KEY (this one is encrypted: decrypt it, e.g. `openssl pkcs8 -in key.pem -out plain-key.pem`)",
            ));
        }
        if !text.is_empty() && PrivateKeyDer::from_pem_slice(&self.bytes).is_ok() {
            Ok(())
        } else {
            Err(self.missing(what, "PRIVATE KEY"))
        }
    }

    fn missing(&self, what: &'static str, expected: &'static str) -> TlsError {
        TlsError::NoPem {
            what,
            origin: self.origin.to_string(),
            expected,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encrypted_key_is_named_as_such() {
        let pem = Pem::given(
            b"-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
        );
        let err = pem.expect_private_key("client key").unwrap_err();
        assert!(err.to_string().contains("this one is encrypted"), "{err}");
        let none = Pem::given(b"nothing")
            .expect_private_key("client key")
            .unwrap_err();
        assert!(
            none.to_string().ends_with("holds no PEM PRIVATE KEY"),
            "{none}"
        );
    }
}
