//! TLS and mutual TLS with certificates made by the test (rcgen): a TLS
//! server refuses plaintext clients and serves TLS ones; with a client CA
//! it refuses clients without a certificate, serves those with one, and a
//! real SDK agent over mutual TLS applies an operation.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use reconciled_client::agent::TypeSpec;
use reconciled_client::{Client, ClientTls, proto};
use reconciled_tests::agents::{Recorder, RunningAgent, TestTenant};
use reconciled_tests::api::item;
use reconciled_tests::proto::v1;
use reconciled_tests::{ServerOptions, ServerProcess};
use serde_json::json;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as
/// PEM files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: String,
    client_cert: String,
    client_key: String,
}

impl Pki {
    fn new() -> Self {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "reconciled test CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca_params, ca_key);

        let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose| {
            let key = KeyPair::generate().expect("key");
            let mut params = CertificateParams::new(names).expect("params");
            params.extended_key_usages = vec![usage];
            let cert = params.signed_by(&key, &issuer).expect("certificate");
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(
            vec!["localhost".into(), "127.0.0.1".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) =
            leaf(vec!["agent-1".into()], ExtendedKeyUsagePurpose::ClientAuth);

        let dir = tempfile::tempdir().expect("temp dir");
        for (name, pem) in [
            ("ca.pem", ca.pem()),
            ("server.pem", server_cert),
            ("server.key", server_key),
        ] {
            std::fs::write(dir.path().join(name), pem).expect("write PEM");
        }
        Self {
            dir,
            ca: ca.pem(),
            client_cert,
            client_key,
        }
    }

    fn path(&self, name: &str) -> String {
        let path: PathBuf = self.dir.path().join(name);
        path.to_string_lossy().into_owned()
    }

    /// Server options for TLS, and for mutual TLS when `mutual`; the
    /// harness talks TLS (with the client certificate when `mutual`).
    fn server_options(&self, mutual: bool) -> ServerOptions {
        let mut harness = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca));
        let mut options = ServerOptions::default()
            .arg("--tls-cert")
            .arg(self.path("server.pem"))
            .env("RECONCILED_TLS_KEY", self.path("server.key"));
        if mutual {
            harness = harness.identity(Identity::from_pem(&self.client_cert, &self.client_key));
            let file = self.dir.path().join("reconciled.toml");
            std::fs::write(
                &file,
                format!("tls_client_ca = {:?}\n", self.path("ca.pem")),
            )
            .expect("write config");
            options = options
                .arg("--config")
                .arg(file.to_string_lossy().into_owned());
        }
        options.client_tls(harness)
    }

    fn client_tls(&self, with_identity: bool) -> ClientTls {
        let tls = ClientTls::new().ca_certificate(self.ca.clone());
        if with_identity {
            tls.identity(self.client_cert.clone(), self.client_key.clone())
        } else {
            tls
        }
    }
}

async fn list_tenants(client: &Client) -> Result<proto::ListTenantsResponse, tonic::Status> {
    client
        .list_tenants(proto::ListTenantsRequest::default())
        .await
}

#[tokio::test]
async fn a_tls_server_refuses_plaintext_clients_and_serves_tls_ones() {
    let pki = Pki::new();
    // One connection slot: the limit must hold for TLS connections too.
    let server = ServerProcess::start(pki.server_options(false).arg("--max-connections").arg("1"))
        .await
        .expect("a TLS server starts");
    let admin = server.admin_token();

    let plaintext = async {
        let channel = Endpoint::from_shared(format!("http://{}", server.addr()))?
            .connect()
            .await?;
        let client = Client::from_channel(channel, &admin)?;
        Ok::<_, anyhow::Error>(list_tenants(&client).await?)
    };
    let refused = plaintext.await;
    assert!(
        refused.is_err(),
        "a plaintext call to a TLS server must fail: {refused:?}"
    );

    let client = Client::connect_with(server.endpoint(), &admin, Some(&pki.client_tls(false)))
        .await
        .expect("a TLS client connects");
    list_tenants(&client).await.expect("served over TLS");
    let second = Client::connect_with(server.endpoint(), &admin, Some(&pki.client_tls(false)))
        .await
        .expect("a second TLS client connects");
    let over = list_tenants(&second)
        .await
        .expect_err("the only connection slot is taken");
    assert_eq!(over.code(), tonic::Code::ResourceExhausted, "{over:?}");
}

#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_certificate_and_an_agent_with_one_works() {
    let pki = Pki::new();
    // Built before any connection is open (the build blocks this runtime,
    // and the server closes connections that miss its keepalive pings).
    let reconctl_binary = reconciled_tests::workspace_binary("reconctl");
    let tenant = TestTenant::start_with(pki.server_options(true), "acme").await;
    let admin = tenant.server.admin_token();

    let anonymous = async {
        let client = Client::connect_with(
            tenant.server.endpoint(),
            &admin,
            Some(&pki.client_tls(false)),
        )
        .await?;
        Ok::<_, anyhow::Error>(list_tenants(&client).await?)
    };
    let refused = anonymous.await;
    assert!(
        refused.is_err(),
        "a client without a certificate must be refused: {refused:?}"
    );

    let client = Client::connect_with(
        tenant.server.endpoint(),
        &admin,
        Some(&pki.client_tls(true)),
    )
    .await
    .expect("a client with a certificate connects");
    let tenants = list_tenants(&client).await.expect("served over mutual TLS");
    assert_eq!(tenants.tenants.len(), 1);

    let recorder = Recorder::new();
    let mut agent = RunningAgent::start(
        tenant
            .agent("agent-1")
            .tls(pki.client_tls(true))
            .item_type(TypeSpec::new("t"), recorder.clone()),
    );
    agent.connected().await;
    tenant.submit(vec![item("t", "a", json!({ "v": 1 }))]).await;
    tenant
        .wait_for_state("t", "a", v1::ItemState::Created)
        .await;
    assert_eq!(recorder.labels(), ["create t/a"]);

    // reconctl over mutual TLS: with the client certificate it lists the
    // tenant; without, it fails and says so.
    std::fs::write(pki.path("client.pem"), &pki.client_cert).expect("write PEM");
    std::fs::write(pki.path("client.key"), &pki.client_key).expect("write PEM");
    let reconctl = |with_identity: bool| {
        let mut command = std::process::Command::new(&reconctl_binary);
        command
            .args([
                "--addr",
                &tenant.server.addr().to_string(),
                "--token",
                &admin,
            ])
            .args(["--ca-cert", &pki.path("ca.pem")]);
        if with_identity {
            command.env("RECONCILED_CLIENT_CERT", pki.path("client.pem"));
            command.env("RECONCILED_CLIENT_KEY", pki.path("client.key"));
        }
        command
            .args(["tenant", "list"])
            .env_remove("RECONCILED_ADDR")
            .env_remove("RECONCILED_TOKEN")
            .output()
            .expect("reconctl runs")
    };
    let listed = reconciled_tests::successful_stdout(&reconctl(true));
    assert!(listed.contains("acme"), "{listed}");
    let refused = reconctl(false);
    assert!(!refused.status.success(), "no client certificate: refused");
}
