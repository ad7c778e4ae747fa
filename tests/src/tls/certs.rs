//! The certificates of the TLS tests, made fresh by each test.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The DNS name the server certificates hold besides 127.0.0.1 (no DNS
/// resolves it: a client dials 127.0.0.1 and verifies this name).
pub const SERVER_NAME: &str = "tls.idem.test";

/// The database user that must present a client certificate (its common
/// name) on the servers that ask for one.
pub const MTLS_USER: &str = "idem_mtls";

/// A test CA and what it signed, a second CA that signed nothing the
/// servers use, and what that one signed, as PEM files in a directory of
/// the test's own:
///
/// - `ca`: the CA the servers trust and the clients are given;
/// - `server`: for `127.0.0.1` and [`SERVER_NAME`] (not `127.0.0.2`: a
///   client that dials it reaches the server under a name its certificate
///   does not hold);
/// - `expired`: a server certificate of `ca` that expired in 2021;
/// - `client`: a client certificate of `ca` for [`MTLS_USER`];
/// - `other_ca`: the second CA;
/// - `other_client`: a client certificate for [`MTLS_USER`] from
///   `other_ca`, which the servers refuse.
#[derive(Debug)]
pub struct Certs {
    dir: tempfile::TempDir,
}

/// A certificate file and its key file.
#[derive(Debug, Clone)]
pub struct Pair {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, PKCS#8).
    pub key: PathBuf,
}

impl Certs {
    /// Makes them all (a few milliseconds).
    pub fn make() -> Certs {
        let dir = tempfile::Builder::new()
            .prefix("idem-tls-certs-")
            .tempdir()
            .expect("a temp dir for certificates");
        let (ca, ca_issuer) = authority("idem test CA");
        let (other_ca, other_issuer) = authority("idem other CA");
        write(dir.path(), "ca.pem", &ca);
        write(dir.path(), "other_ca.pem", &other_ca);
        leaf(
            dir.path(),
            "server",
            &ca_issuer,
            Leaf::Server { expired: false },
        );
        leaf(
            dir.path(),
            "expired",
            &ca_issuer,
            Leaf::Server { expired: true },
        );
        leaf(dir.path(), "client", &ca_issuer, Leaf::Client);
        leaf(dir.path(), "other_client", &other_issuer, Leaf::Client);
        // The servers that run as users of their own read them.
        let open = |path: &Path, mode| {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .expect("permissions of a certificate");
        };
        open(dir.path(), 0o755);
        for entry in std::fs::read_dir(dir.path()).expect("the certificates") {
            open(&entry.expect("a certificate").path(), 0o644);
        }
        Certs { dir }
    }

    /// The directory they are in (readable by every user: the servers
    /// that run as their own users read them).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The test CA's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The second CA's certificate.
    pub fn other_ca(&self) -> PathBuf {
        self.dir.path().join("other_ca.pem")
    }

    /// The server certificate for 127.0.0.1.
    pub fn server(&self) -> Pair {
        self.pair("server")
    }

    /// A server certificate that expired in 2021.
    pub fn expired(&self) -> Pair {
        self.pair("expired")
    }

    /// The client certificate for [`MTLS_USER`], from the test CA.
    pub fn client(&self) -> Pair {
        self.pair("client")
    }

    /// A client certificate for [`MTLS_USER`] from the second CA.
    pub fn other_client(&self) -> Pair {
        self.pair("other_client")
    }

    fn pair(&self, name: &str) -> Pair {
        Pair {
            cert: self.dir.path().join(format!("{name}.pem")),
            key: self.dir.path().join(format!("{name}.key")),
        }
    }
}

fn authority(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().expect("a CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).expect("a CA certificate");
    (cert.pem(), Issuer::new(params, key))
}

enum Leaf {
    Server { expired: bool },
    Client,
}

fn leaf(dir: &Path, name: &str, issuer: &Issuer<'static, KeyPair>, kind: Leaf) {
    let key = KeyPair::generate().expect("a key");
    let mut params = match kind {
        Leaf::Server { expired } => {
            let mut p =
                CertificateParams::new(vec!["127.0.0.1".to_owned(), SERVER_NAME.to_owned()])
                    .expect("the names");
            p.distinguished_name.push(DnType::CommonName, "127.0.0.1");
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            if expired {
                p.not_before = rcgen::date_time_ymd(2020, 1, 1);
                p.not_after = rcgen::date_time_ymd(2021, 1, 1);
            }
            p
        }
        Leaf::Client => {
            let mut p = CertificateParams::new(Vec::<String>::new()).expect("parameters");
            p.distinguished_name.push(DnType::CommonName, MTLS_USER);
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            p
        }
    };
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let cert = params
        .signed_by(&key, issuer)
        .expect("a signed certificate");
    write(dir, &format!("{name}.pem"), &cert.pem());
    write(dir, &format!("{name}.key"), &key.serialize_pem());
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).expect("a certificate file");
}
