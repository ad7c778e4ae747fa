//! A rustls client configuration of a [`Tls`], for the clients that take
//! one (NATS, and RabbitMQ's connection, which idem makes).

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::{Tls, TlsError};

impl Tls {
    /// The rustls configuration: the CA (or the system's roots), the client
    /// certificate, and no verification only when asked.
    pub(crate) fn rustls_client_config(&self) -> Result<ClientConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|_| TlsError::Unsupported {
                client: "rustls with ring",
                what: "offer TLS 1.2 or 1.3",
            })?;
        let builder = if self.verifies() {
            let mut roots = RootCertStore::empty();
            match &self.ca {
                Some(ca) => {
                    roots.add_parsable_certificates(ca.certificates());
                }
                None => {
                    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
                }
            }
            match &self.server_name {
                None => builder.with_root_certificates(roots),
                Some(name) => {
                    let webpki = WebPkiServerVerifier::builder_with_provider(
                        Arc::new(roots),
                        provider.clone(),
                    )
                    .build()
                    .map_err(|_| TlsError::Unsupported {
                        client: "rustls",
                        what: "verify against a CA bundle without a usable certificate",
                    })?;
                    let name = ServerName::try_from(name.clone())
                        .map_err(|_| TlsError::ServerName { name: name.clone() })?;
                    builder
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(Named { webpki, name }))
                }
            }
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        };
        match &self.identity {
            None => Ok(builder.with_no_client_auth()),
            Some(id) => {
                let key = id.key.private_key().ok_or_else(|| TlsError::NoPem {
                    what: "client key",
                    origin: id.key.origin().to_owned(),
                    expected: "PRIVATE KEY",
                })?;
                builder
                    .with_client_auth_cert(id.cert.certificates(), key)
                    .map_err(|_| TlsError::Unsupported {
                        client: "rustls",
                        what: "use this client key (not PKCS#8, PKCS#1 or SEC1, or not the certificate's)",
                    })
            }
        }
    }
}

/// Verifies as webpki does, for the server name of the [`Tls`] rather than
/// the one the client dialled.
#[derive(Debug)]
struct Named {
    webpki: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for Named {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.webpki
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// Accepts any certificate, checking only that the handshake's signatures
/// are made with the key it holds: `danger_accept_invalid_certs`.
#[derive(Debug)]
struct AcceptAny(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
