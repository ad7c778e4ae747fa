//! Why a TLS handshake failed, read out of an error chain.

use std::error::Error as StdError;
use std::fmt;

/// Why a certificate did not verify: what [`refusal`] finds in an error.
///
/// # Examples
///
/// ```
/// use idem_runtime::tls::Refusal;
///
/// assert_eq!(
///     Refusal::UnknownCa.to_string(),
///     "the server's certificate is not signed by a CA this client trusts (unknown CA): give the CA that signed it"
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The server's certificate does not chain to a trusted CA.
    UnknownCa,
    /// The server's certificate does not name the host connected to.
    WrongName,
    /// The server's certificate has expired.
    Expired,
    /// The server's certificate is not valid yet (or the clocks disagree).
    NotYetValid,
    /// The server's certificate was revoked.
    Revoked,
    /// The server asks for a client certificate and none was given.
    ClientCertificateRequired,
    /// The server refused the client certificate given.
    ClientCertificateRefused,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::UnknownCa => {
                "the server's certificate is not signed by a CA this client trusts (unknown CA): give the CA that signed it"
            }
            Refusal::WrongName => {
                "the server's certificate does not name the host in the URL (wrong host name): connect by a name or address the certificate holds"
            }
            Refusal::Expired => "the server's certificate has expired",
            Refusal::NotYetValid => {
                "the server's certificate is not valid yet (or this machine's clock is wrong)"
            }
            Refusal::Revoked => "the server's certificate was revoked",
            Refusal::ClientCertificateRequired => {
                "the server asks for a client certificate (mutual TLS) and none was given"
            }
            Refusal::ClientCertificateRefused => {
                "the server refused the client certificate (signed by a CA it does not trust, expired, or not the user's)"
            }
        })
    }
}

/// What each client says, lowercased: rustls's errors (sqlx, redis, lapin,
/// NATS) and OpenSSL's (librdkafka), in the order they are tried.
const SIGNS: &[(&str, Refusal)] = &[
    // the server's alerts about our certificate
    ("certificaterequired", Refusal::ClientCertificateRequired),
    (
        "alert certificate required",
        Refusal::ClientCertificateRequired,
    ),
    (
        "peer did not return a certificate",
        Refusal::ClientCertificateRequired,
    ),
    ("fatal alert: unknownca", Refusal::ClientCertificateRefused),
    (
        "fatal alert: badcertificate",
        Refusal::ClientCertificateRefused,
    ),
    (
        "fatal alert: certificateexpired",
        Refusal::ClientCertificateRefused,
    ),
    (
        "fatal alert: decrypterror",
        Refusal::ClientCertificateRefused,
    ),
    ("alert unknown ca", Refusal::ClientCertificateRefused),
    ("alert bad certificate", Refusal::ClientCertificateRefused),
    (
        "alert certificate expired",
        Refusal::ClientCertificateRefused,
    ),
    // ours about the server's
    ("unknownissuer", Refusal::UnknownCa),
    ("unable to get local issuer certificate", Refusal::UnknownCa),
    ("self-signed certificate", Refusal::UnknownCa),
    ("self signed certificate", Refusal::UnknownCa),
    ("unable to get issuer certificate", Refusal::UnknownCa),
    ("notvalidforname", Refusal::WrongName),
    ("certificate not valid for name", Refusal::WrongName),
    ("hostname mismatch", Refusal::WrongName),
    ("ip address mismatch", Refusal::WrongName),
    ("certificate expired", Refusal::Expired),
    ("certificate has expired", Refusal::Expired),
    ("invalid peer certificate: expired", Refusal::Expired),
    ("certificate not valid yet", Refusal::NotYetValid),
    ("certificate is not yet valid", Refusal::NotYetValid),
    (
        "invalid peer certificate: notvalidyet",
        Refusal::NotYetValid,
    ),
    ("invalid peer certificate: revoked", Refusal::Revoked),
    ("certificate revoked", Refusal::Revoked),
];

/// Why the certificate of a failed TLS handshake did not verify, if `err`
/// or an error it wraps says: the reason is read from the messages of the
/// whole chain, as each client words it (rustls's for sqlx, redis, lapin
/// and NATS; OpenSSL's for Kafka).
///
/// # Examples
///
/// ```
/// use idem_runtime::tls::{refusal, Refusal};
///
/// let io = std::io::Error::other("invalid peer certificate: UnknownIssuer");
/// assert_eq!(refusal(&io), Some(Refusal::UnknownCa));
/// let plain = std::io::Error::other("connection refused");
/// assert_eq!(refusal(&plain), None);
/// ```
pub fn refusal(err: &(dyn StdError + 'static)) -> Option<Refusal> {
    let mut text = String::new();
    let mut next = Some(err);
    while let Some(e) = next {
        text.push_str(&e.to_string().to_ascii_lowercase());
        text.push('\n');
        next = e.source();
    }
    refusal_in(&text)
}

/// [`refusal`] of a message already flattened to text (librdkafka's
/// errors reach idem as strings).
pub(crate) fn refusal_in(text: &str) -> Option<Refusal> {
    let text = text.to_ascii_lowercase();
    SIGNS
        .iter()
        .find(|(sign, _)| text.contains(sign))
        .map(|&(_, why)| why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_clients_wording() {
        let cases = [
            (
                "invalid peer certificate: UnknownIssuer",
                Refusal::UnknownCa,
            ),
            (
                "invalid peer certificate: certificate not valid for name \"127.0.0.2\"; certificate is only valid for IpAddress(127.0.0.1)",
                Refusal::WrongName,
            ),
            (
                "invalid peer certificate: certificate expired: verification time 1 (UNIX), but certificate is not valid after 0 (1 seconds ago)",
                Refusal::Expired,
            ),
            (
                "received fatal alert: CertificateRequired",
                Refusal::ClientCertificateRequired,
            ),
            (
                "received fatal alert: UnknownCA",
                Refusal::ClientCertificateRefused,
            ),
            (
                "ssl:// SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: unable to get local issuer certificate",
                Refusal::UnknownCa,
            ),
            (
                "certificate verify failed: Hostname mismatch",
                Refusal::WrongName,
            ),
            (
                "certificate verify failed: certificate has expired",
                Refusal::Expired,
            ),
        ];
        for (text, want) in cases {
            assert_eq!(refusal_in(text), Some(want), "{text}");
        }
        assert_eq!(refusal_in("connection reset by peer"), None);
    }

    #[test]
    fn reads_the_whole_chain() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("error communicating with the server")
            }
        }
        impl StdError for Outer {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::other(
            "invalid peer certificate: NotValidForName",
        ));
        assert_eq!(refusal(&e), Some(Refusal::WrongName));
    }
}
