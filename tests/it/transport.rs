//! Transport security against parts denorm did not write: tansu with SASL
//! (SCRAM-SHA-256/512) and noida-db, each behind a TLS endpoint
//! (`common/tls.rs`, rustls); denorm's Kafka clients are librdkafka with
//! its OpenSSL, its Elasticsearch client the `elasticsearch` crate with
//! rustls; the SCRAM user is made by librdkafka's own Python client.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command as Proc;

use crate::common::tls::{Certs, Endpoint};
use crate::common::*;
use denorm::command::Command;
use denorm::kafka::KafkaConfig;

const PASSWORD: &str = "scram-s3cret-never-logged";

/// librdkafka's Python client (confluent-kafka), from the interop tools.
fn python() -> Proc {
    let root = std::env::var("DENORM_INTEROP").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/denorm/interop"));
    assert!(root.join("py/bin/python").exists(), "no interop tools in {}: run scripts/install-interop.sh", root.display());
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut p = Proc::new(root.join("py/bin/python"));
    p.arg(repo.join("tests/interop/python/denorm_interop.py")).current_dir(repo);
    p
}

/// The options of a client of the SASL_SSL broker, but its password.
fn sasl_ssl(ca: &Path, mechanism: &str) -> Vec<(String, String)> {
    [("security.protocol", "SASL_SSL".to_string()), ("sasl.mechanism", mechanism.to_string()), ("sasl.username", "denorm".to_string()), ("ssl.ca.location", ca.display().to_string())]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// The same as `-X` flags.
fn flags(options: &[(String, String)]) -> Vec<String> {
    options.iter().flat_map(|(k, v)| ["-X".to_string(), format!("{k}={v}")]).collect()
}

fn files(prefix: &str, n: usize) -> Vec<Command> {
    let mut c: Vec<Command> =
        (0..n).map(|i| Command::UpsertFile { id: format!("{prefix}{i}"), path: format!("/{prefix}/d{}/f{i}.txt", i % 3), contents: format!("over tls {i}"), previous_path: None }).collect();
    c.push(Command::RenamePath { from: format!("/{prefix}/d1"), to: format!("/{prefix}/moved") });
    c
}

/// A tansu requiring SCRAM behind a TLS endpoint, with user `denorm`.
fn scram_broker(certs: &Certs) -> Broker {
    let make_user = |brokers: &str, ca: &Path| {
        let made = python().args(["scram-user", brokers]).arg(ca).args(["denorm", PASSWORD]).output().expect("run the Python client");
        assert!(made.status.success(), "creating the SCRAM user failed:\n{}", String::from_utf8_lossy(&made.stderr));
    };
    Broker::private_tls(certs, Some(&make_user))
}

/// The whole pipeline over TLS with SCRAM-SHA-512, as the chart's
/// documented values configure it: topics created, commands produced, a
/// worker applying them (its password from an options file), lag read,
/// and the password in no log. A wrong password is refused.
#[test]
fn the_pipeline_runs_over_tls_with_scram_sha_512() {
    let certs = Certs::new();
    let broker = scram_broker(&certs);
    let front = broker.front.as_ref().unwrap();
    let options = sasl_ssl(&certs.ca(), "SCRAM-SHA-512");
    let mut cfg = KafkaConfig::new(broker.brokers.clone(), unique("tls"));
    cfg.partitions = 3;
    cfg.options = options.clone();
    cfg.options.push(("sasl.password".into(), PASSWORD.into()));
    rt().block_on(cfg.ensure_topic()).expect("create the topic over SASL_SSL");
    let log = produce(&cfg, files("t", 30));
    let dir = tempfile::tempdir().unwrap();
    let secrets = dir.path().join("kafka.options");
    std::fs::write(&secrets, format!("sasl.password={PASSWORD}\n")).unwrap();
    let group = unique("g");
    let index = dir.path().join("index");
    let mut args = flags(&options);
    args.extend(["--kafka-options-file".to_string(), secrets.display().to_string(), "--log".into(), "info,librdkafka=debug".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let w = Worker::start(&cfg, &group, &index, &args);
    wait_applied_by(&cfg, &group, log.len(), &[&w]);
    assert_matches_model(&index, &log);
    assert!(front.saw(b"SCRAM-SHA-512"), "no SCRAM-SHA-512 handshake went through the TLS endpoint");
    assert_eq!(front.refused.load(std::sync::atomic::Ordering::SeqCst), 0, "a handshake failed");
    let (status, log_text) = w.terminate_with_log();
    assert!(status.success(), "{status:?}\n{log_text}");
    assert!(!log_text.contains(PASSWORD), "the worker logged the password");
    // A wrong password is refused: the CLI exits non-zero and says why.
    let mut wrong = flags(&options);
    wrong.extend(["-X".to_string(), "sasl.password=not-the-password".to_string()]);
    let (code, _, err) = output(cli(&cfg, &group, &index).args(&wrong).arg("lag"));
    assert_ne!(code, 0, "a wrong SCRAM password was accepted:\n{err}");
    assert!(err.to_lowercase().contains("authentication"), "no word of authentication in:\n{err}");
}

/// SCRAM-SHA-256 over TLS: commands produced with it are read back by
/// `denorm lag` (the group's view of the topic). (tansu 0.6 does not offer
/// PLAIN.)
#[test]
fn scram_sha_256_over_tls_reaches_the_broker() {
    let certs = Certs::new();
    let broker = scram_broker(&certs);
    let mut cfg = KafkaConfig::new(broker.brokers.clone(), unique("tls"));
    cfg.partitions = 1;
    cfg.options = sasl_ssl(&certs.ca(), "SCRAM-SHA-256");
    cfg.options.push(("sasl.password".into(), PASSWORD.into()));
    rt().block_on(cfg.ensure_topic()).expect("create the topic over SASL_SSL with SCRAM-SHA-256");
    let log = produce(&cfg, files("m", 2));
    let (code, out, err) = output(cli(&cfg, "g", Path::new("unused")).args(flags(&cfg.options)).args(["lag", "--json"]));
    assert_eq!(code, 0, "{err}");
    let lag: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(lag["total"].as_i64(), Some(log.len() as i64), "{lag}");
    assert!(broker.front.as_ref().unwrap().saw(b"SCRAM-SHA-256"));
}

/// Certificate verification is on by default: a broker whose certificate
/// another CA signed is refused, and the error says so; the same command
/// with the right CA goes through.
#[test]
fn a_broker_certificate_of_another_ca_is_refused_with_a_clear_error() {
    let (certs, other) = (Certs::new(), Certs::new());
    let broker = Broker::private_tls(&certs, None);
    let mut cfg = KafkaConfig::new(broker.brokers.clone(), unique("tls"));
    cfg.partitions = 1;
    cfg.options = vec![("security.protocol".into(), "SSL".into()), ("ssl.ca.location".into(), certs.ca().display().to_string())];
    rt().block_on(cfg.ensure_topic()).expect("create the topic over SSL");
    let lag = |ca: &Path| output(cli(&cfg, "g", Path::new("unused")).args(["-X", "security.protocol=SSL", "-X"]).arg(format!("ssl.ca.location={}", ca.display())).arg("lag"));
    let (code, _, err) = lag(&other.ca());
    assert_ne!(code, 0, "a certificate of another CA was accepted:\n{err}");
    assert!(err.contains("certificate verify failed"), "the error does not say the certificate was refused:\n{err}");
    assert!(broker.front.as_ref().unwrap().refused.load(std::sync::atomic::Ordering::SeqCst) > 0, "the endpoint saw no refused handshake");
    let (code, _, err) = lag(&certs.ca());
    assert_eq!(code, 0, "with the right CA: {err}");
}

/// Elasticsearch over HTTPS with a CA file and an API key: a worker
/// applies commands and `denorm search` reads them through the TLS
/// endpoint in front of noida-db, which receives the API key; a client
/// trusting another CA is refused with a clear error.
#[test]
fn elasticsearch_over_https_with_a_ca_file_and_an_api_key() {
    let es = elastic::elastic();
    let es_port: u16 = es.url.rsplit(':').next().unwrap().trim_end_matches('/').parse().expect("the server's port");
    let (certs, other) = (Certs::new(), Certs::new());
    let front = Endpoint::bind().forward_to(&certs, es_port);
    let mut r = Rig::new(3);
    r.index = PathBuf::from(format!("https://127.0.0.1:{}", front.port));
    let ca = certs.ca();
    let env = |ca: &Path| -> Vec<(&'static str, std::ffi::OsString)> {
        vec![("DENORM_ES_CA_CERT", ca.as_os_str().to_owned()), ("DENORM_ES_API_KEY_ID", "denorm-worker".into()), ("DENORM_ES_API_KEY", "api-s3cret".into())]
    };
    let worker_env = env(&ca);
    let refs: Vec<(&str, &OsStr)> = worker_env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    let w = Worker::start_env(&r.cfg, &r.group, &r.index, &[], &refs);
    let log = produce(&r.cfg, files("h", 12));
    wait_applied_by(&r.cfg, &r.group, log.len(), &[&w]);
    let search = |ca: &Path| output(cli(&r.cfg, &r.group, &r.index).envs(env(ca)).args(["search", "files", "--under", "/h/moved", "--json"]));
    let (code, out, err) = search(&ca);
    assert_eq!(code, 0, "{err}");
    let mut ids: Vec<String> = json_lines(&out).iter().map(|f| f["id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    assert_eq!(ids, vec!["h1", "h10", "h4", "h7"], "{out}");
    // `ApiKey base64(id:key)`, as Elasticsearch documents it.
    assert!(front.saw(b"ApiKey ZGVub3JtLXdvcmtlcjphcGktczNjcmV0"), "no request carried the API key");
    let (code, _, err) = search(&other.ca());
    assert_ne!(code, 0, "a certificate of another CA was accepted");
    assert!(err.to_lowercase().contains("certificate"), "the error does not say the certificate was refused:\n{err}");
    drop(w);
}

/// The chart's documented SASL_SSL values (helm/denorm/ci/elasticsearch-values.yaml:
/// SCRAM-SHA-512, the broker's CA and the password each from a Secret, a
/// Kafka credential of its own for the topics Job, signing keys) start a
/// worker: `scripts/check-chart.py --boot` renders them with Helm and runs
/// the topics hook and the worker as rendered against this broker, their
/// Secrets' files written here.
#[test]
fn the_charts_documented_sasl_ssl_values_start_a_worker() {
    let certs = Certs::new();
    let broker = scram_broker(&certs);
    let secrets = tempfile::tempdir().unwrap();
    let ca = std::fs::read(certs.ca()).unwrap();
    let credential = format!("sasl.username=denorm\nsasl.password={PASSWORD}\n");
    let keys = format!("{}\n", uuid::Uuid::new_v4().simple().to_string().repeat(2));
    for (secret, file, text) in [
        ("denorm-kafka", "kafka.properties", credential.as_bytes()),
        ("denorm-kafka-admin", "kafka.properties", credential.as_bytes()),
        ("denorm-kafka-ca", "ca.crt", &ca[..]),
        ("denorm-signing", "signing.keys", keys.as_bytes()),
        ("denorm-es", "username", b"denorm"),
        ("denorm-es", "password", b"unused-here"),
        ("denorm-es-ca", "ca.crt", &ca[..]),
    ] {
        std::fs::create_dir_all(secrets.path().join(secret)).unwrap();
        std::fs::write(secrets.path().join(secret).join(file), text).unwrap();
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Proc::new("python3")
        .arg(repo.join("scripts/check-chart.py"))
        .args([env!("CARGO_BIN_EXE_denorm"), "--boot", "elasticsearch"])
        .env("DENORM_TEST_BROKERS", &broker.brokers)
        .env("DENORM_TEST_SECRETS", secrets.path())
        .output()
        .expect("run scripts/check-chart.py");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the chart's SASL_SSL values did not start a worker:\n{stdout}\n{stderr}");
    assert!(stdout.contains("ran against the test broker: ready, then a clean SIGTERM stop"), "{stdout}\n{stderr}");
    let front = broker.front.as_ref().unwrap();
    assert!(front.saw(b"SCRAM-SHA-512"), "no SCRAM-SHA-512 handshake went through the TLS endpoint");
    assert_eq!(front.refused.load(std::sync::atomic::Ordering::SeqCst), 0, "a handshake failed");
    assert!(!stdout.contains(PASSWORD) && !stderr.contains(PASSWORD), "the password was shown");
}
