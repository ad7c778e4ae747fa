//! A Redis client of a `rediss://` URL and a [`Tls`].

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::{ClientTlsConfig, TlsCertificates};

use super::exec::backend;
use crate::error::StoreError;
use crate::tls::{Tls, TlsError};

/// A client of one server.
pub(super) fn client(url: &str, tls: &Tls) -> Result<redis::Client, StoreError> {
    prepare(tls)?;
    tls.warn_if_unverified("Redis");
    redis::Client::build_with_tls(tls_url(url, tls)?, certificates(tls)).map_err(backend)
}

/// A client builder of a cluster's nodes.
pub(super) fn cluster<I: AsRef<str>>(
    nodes: &[I],
    tls: &Tls,
) -> Result<ClusterClientBuilder, StoreError> {
    prepare(tls)?;
    tls.warn_if_unverified("Redis Cluster");
    let nodes = nodes
        .iter()
        .map(|n| tls_url(n.as_ref(), tls))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ClusterClient::builder(nodes).certs(certificates(tls)))
}

/// What redis-rs needs before it makes a TLS client: no server name (it
/// verifies the host it dials), and a process-wide rustls provider (it
/// asks rustls for the default one, which is ambiguous when the
/// application's tree also links aws-lc-rs): *ring*, unless the
/// application installed one.
fn prepare(tls: &Tls) -> Result<(), TlsError> {
    tls.without_server_name("redis")?;
    default_provider();
    Ok(())
}

/// Installs *ring* as rustls' process-wide provider unless one is: a
/// `rediss://` URL makes redis-rs ask rustls for it.
pub(super) fn default_provider() {
    crate::tls::install_ring_default();
}

/// The URL, which must be `rediss://`, marked `#insecure` when `tls` does
/// not verify (the only way redis-rs takes it); an `#insecure` URL with a
/// `Tls` that verifies is refused rather than left unverified.
fn tls_url(url: &str, tls: &Tls) -> Result<String, TlsError> {
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    if !scheme.eq_ignore_ascii_case("rediss") {
        return Err(TlsError::PlainScheme {
            scheme: scheme.to_owned(),
            tls_scheme: "rediss",
        });
    }
    let mut url = url.to_owned();
    if tls.verifies() && url.contains('#') {
        return Err(TlsError::Unsupported {
            client: "redis",
            what: "verify a URL marked #insecure (or with another fragment): drop the fragment, or use danger_accept_invalid_certs",
        });
    }
    if !tls.verifies() && !url.ends_with("#insecure") {
        if url.contains('#') {
            return Err(TlsError::Unsupported {
                client: "redis",
                what: "combine danger_accept_invalid_certs with a URL fragment other than #insecure",
            });
        }
        url.push_str("#insecure");
    }
    Ok(url)
}

fn certificates(tls: &Tls) -> TlsCertificates {
    TlsCertificates {
        client_tls: tls.identity.as_ref().map(|id| ClientTlsConfig {
            client_cert: id.cert.bytes().to_vec(),
            client_key: id.key.bytes().to_vec(),
        }),
        root_cert: tls.ca.as_ref().map(|ca| ca.bytes().to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_for_rediss_and_marks_insecure() {
        let tls = Tls::new();
        assert!(matches!(
            tls_url("redis://127.0.0.1:6379", &tls),
            Err(TlsError::PlainScheme {
                tls_scheme: "rediss",
                ..
            })
        ));
        assert_eq!(tls_url("rediss://h:1/0", &tls).unwrap(), "rediss://h:1/0");
        assert!(matches!(
            tls_url("rediss://h:1/0#insecure", &tls),
            Err(TlsError::Unsupported { .. })
        ));
        let loose = Tls::new().danger_accept_invalid_certs();
        assert_eq!(
            tls_url("rediss://h:1/0", &loose).unwrap(),
            "rediss://h:1/0#insecure"
        );
    }
}
