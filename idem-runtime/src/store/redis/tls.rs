//! A Redis client of a `rediss://` URL and a [`Tls`].

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::{ClientTlsConfig, TlsCertificates};

use super::exec::backend;
use crate::error::StoreError;
use crate::tls::{Tls, TlsError};

/// A client of one server.
pub(super) fn client(url: &str, tls: &Tls) -> Result<redis::Client, StoreError> {
    tls.warn_if_unverified("Redis");
    redis::Client::build_with_tls(tls_url(url, tls)?, certificates(tls)).map_err(backend)
}

/// A client builder of a cluster's nodes.
pub(super) fn cluster<I: AsRef<str>>(
    nodes: &[I],
    tls: &Tls,
) -> Result<ClusterClientBuilder, StoreError> {
    tls.warn_if_unverified("Redis Cluster");
    let nodes = nodes
        .iter()
        .map(|n| tls_url(n.as_ref(), tls))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ClusterClient::builder(nodes).certs(certificates(tls)))
}

/// The URL, which must be `rediss://`, marked `#insecure` when `tls` does
/// not verify (the only way redis-rs takes it).
fn tls_url(url: &str, tls: &Tls) -> Result<String, TlsError> {
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    if !scheme.eq_ignore_ascii_case("rediss") {
        return Err(TlsError::PlainScheme {
            scheme: scheme.to_owned(),
            tls_scheme: "rediss",
        });
    }
    let mut url = url.to_owned();
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
        let loose = Tls::new().danger_accept_invalid_certs();
        assert_eq!(
            tls_url("rediss://h:1/0", &loose).unwrap(),
            "rediss://h:1/0#insecure"
        );
    }
}
