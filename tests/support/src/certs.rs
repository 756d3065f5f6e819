//! Certificates made for the test: a CA, a server certificate for localhost/127.0.0.1, and a
//! client certificate, written as PEM files.

use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

pub struct Pki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub other_ca: PathBuf,
    /// localhost, signed by the CA, expired in 2021.
    pub expired_cert: PathBuf,
    pub expired_key: PathBuf,
    /// Signed by the CA for `other.example` only.
    pub wrong_name_cert: PathBuf,
    pub wrong_name_key: PathBuf,
    /// A client certificate signed by the CA, expired in 2021.
    pub expired_client_cert: PathBuf,
    pub expired_client_key: PathBuf,
    /// A client certificate signed by the other CA.
    pub stranger_cert: PathBuf,
    pub stranger_key: PathBuf,
}

fn ca(name: &str) -> (rcgen::Certificate, KeyPair, CertificateParams) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.clone().self_signed(&key).unwrap();
    (cert, key, params)
}

pub fn make(dir: &std::path::Path) -> Pki {
    let (ca_cert, ca_key, ca_params) = ca("xdstap test CA");
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let client = CertificateParams::new(vec!["envoy-client".into()])
        .unwrap()
        .signed_by(&client_key, &issuer)
        .unwrap();
    let (other, other_key, other_params) = ca("some other CA");
    let other_issuer = Issuer::new(other_params, other_key);
    let expired = |names: Vec<String>| {
        let mut p = CertificateParams::new(names).unwrap();
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &issuer).unwrap();
        (cert, key)
    };
    let (expired_server, expired_server_key) = expired(vec!["localhost".into()]);
    let (expired_client, expired_client_key) = expired(vec!["envoy-client".into()]);
    let wrong_name_key = KeyPair::generate().unwrap();
    let wrong_name = CertificateParams::new(vec!["other.example".into()])
        .unwrap()
        .signed_by(&wrong_name_key, &issuer)
        .unwrap();
    let stranger_key = KeyPair::generate().unwrap();
    let stranger = CertificateParams::new(vec!["envoy-client".into()])
        .unwrap()
        .signed_by(&stranger_key, &other_issuer)
        .unwrap();
    let write = |name: &str, pem: String| {
        let p = dir.join(name);
        std::fs::write(&p, pem).unwrap();
        p
    };
    Pki {
        ca: write("ca.pem", ca_cert.pem()),
        server_cert: write("server.pem", server.pem()),
        server_key: write("server.key", server_key.serialize_pem()),
        client_cert: write("client.pem", client.pem()),
        client_key: write("client.key", client_key.serialize_pem()),
        other_ca: write("other-ca.pem", other.pem()),
        expired_cert: write("expired.pem", expired_server.pem()),
        expired_key: write("expired.key", expired_server_key.serialize_pem()),
        wrong_name_cert: write("wrong-name.pem", wrong_name.pem()),
        wrong_name_key: write("wrong-name.key", wrong_name_key.serialize_pem()),
        expired_client_cert: write("expired-client.pem", expired_client.pem()),
        expired_client_key: write("expired-client.key", expired_client_key.serialize_pem()),
        stranger_cert: write("stranger.pem", stranger.pem()),
        stranger_key: write("stranger.key", stranger_key.serialize_pem()),
    }
}
