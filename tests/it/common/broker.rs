//! The Kafka-protocol brokers of the tests: a tansu of the test's own
//! (plaintext, or behind a TLS endpoint with SCRAM), `DENORM_TEST_BROKERS`,
//! or noida-db's broker; and noida-db's servers.

use std::path::{Path, PathBuf};
use std::process::{Child, Command as Proc, Stdio};

use super::ports::{listens_itself, on_a_free_port};
use super::{tls, Private};

/// Makes a SCRAM user on a broker reached at an address (`host:port`) over
/// TLS with a CA file ([`Broker::private_tls`]).
pub type MakeUser<'a> = &'a dyn Fn(&str, &Path);

/// The broker of this test: `DENORM_TEST_BROKERS` (one broker for every
/// test, a cluster of yours), or else a private tansu started from the
/// cached install, as scripts/test.sh runs the suite: a fresh SQLite
/// database per test keeps tansu fast (docs/development.md).
pub struct Broker {
    pub brokers: String,
    private: Option<Private>,
    /// The TLS endpoint clients reach the broker through
    /// ([`Broker::private_tls`]).
    pub front: Option<tls::Front>,
}

pub fn broker() -> Broker {
    if let Ok(b) = std::env::var("DENORM_TEST_BROKERS") {
        return Broker { brokers: b, private: None, front: None };
    }
    Broker::private()
}

impl Broker {
    /// A tansu of this test's own (one that may be stopped), from the cached
    /// install (`DENORM_TANSU` overrides its path).
    pub fn private() -> Broker {
        let dir = tempfile::tempdir().unwrap();
        let (port, child) = on_a_free_port("tansu", |port| start_tansu(dir.path(), port));
        Broker { brokers: format!("127.0.0.1:{port}"), private: Some(Private { child, dir }), front: None }
    }

    /// A tansu of this test's own reached over TLS only: it advertises the
    /// port of a TLS endpoint ([`tls::Front`]) that forwards to its own
    /// plaintext listener (tansu 0.6 parses `--cert` but never uses it).
    /// With `scram` (a user and a password), tansu then requires SASL
    /// (`--authentication`): it is started first without, the user made
    /// over TLS by librdkafka's Python client (`scram`, which runs it with
    /// the broker's address and the CA file), then restarted with it on
    /// the same database, since tansu 0.6 offers SCRAM only and so admits
    /// nobody before a user exists.
    pub fn private_tls(certs: &tls::Certs, scram: Option<MakeUser>) -> Broker {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = tls::Endpoint::bind();
        let advertised = format!("tcp://127.0.0.1:{}", endpoint.port);
        let (port, mut child) = on_a_free_port("tansu", |port| start_tansu_as(dir.path(), port, &advertised, &[]));
        let front = endpoint.forward_to(certs, port);
        let brokers = format!("127.0.0.1:{}", front.port);
        if let Some(make_user) = scram {
            make_user(&brokers, &certs.ca());
            child.kill().unwrap();
            child.wait().unwrap();
            child = start_tansu_as(dir.path(), port, &advertised, &["--authentication"]);
            assert!(listens_itself(&mut child, port), "tansu did not listen on port {port} again with --authentication");
        }
        Broker { brokers, private: Some(Private { child, dir }), front: Some(front) }
    }

    /// noida-db's Kafka-protocol broker, of this test's own: a broker
    /// written by others that implements what tansu 0.6 does not (adding
    /// partitions to a topic).
    pub fn noida() -> Broker {
        let (port, private) = start_noida("kafka");
        Broker { brokers: format!("127.0.0.1:{port}"), private: Some(private), front: None }
    }

    /// SIGKILLs a private broker.
    pub fn kill(&mut self) {
        let c = &mut self.private.as_mut().expect("a private broker").child;
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// Starts a killed private broker again, same port and storage.
    pub fn restart(&mut self) {
        let private = self.private.as_mut().expect("a private broker");
        let port: u16 = self.brokers.rsplit(':').next().unwrap().parse().unwrap();
        let mut child = start_tansu(private.dir.path(), port);
        assert!(listens_itself(&mut child, port), "tansu did not listen on port {port} again");
        private.child = child;
    }
}

/// Starts one of noida-db's servers (`elasticsearch` or `kafka`), from
/// scripts/install-noida.sh (installed once per machine), on a free
/// loopback port: the port, and the process to stop.
pub fn start_noida(service: &str) -> (u16, Private) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-noida.sh");
    let out = Proc::new("bash").arg(&script).stderr(Stdio::inherit()).output().expect("run scripts/install-noida.sh");
    assert!(out.status.success(), "scripts/install-noida.sh failed: install noida-db (or set DENORM_ES_URL for Elasticsearch)");
    let bin = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let dir = tempfile::tempdir().unwrap();
    let (port, child) = on_a_free_port(&format!("noida-db ({service})"), |port| {
        Proc::new(&bin)
            .args(["start", "--only", service, "--host", "127.0.0.1", &format!("--{service}-port"), &port.to_string(), "--data-dir"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start noida-db")
    });
    (port, Private { child, dir })
}

fn start_tansu(dir: &Path, port: u16) -> Child {
    start_tansu_as(dir, port, &format!("tcp://127.0.0.1:{port}"), &[])
}

/// tansu listening on `port`, advertising `advertised`, with `extra` flags.
fn start_tansu_as(dir: &Path, port: u16, advertised: &str, extra: &[&str]) -> Child {
    let bin = std::env::var("DENORM_TANSU").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/denorm/tansu-0.6.0/bin/tansu"));
    assert!(bin.exists(), "no broker: set DENORM_TEST_BROKERS or install tansu with scripts/install-tansu.sh (looked for {})", bin.display());
    let url = format!("tcp://127.0.0.1:{port}");
    Proc::new(&bin)
        .args(["broker", "--listener-url", &url, "--advertised-listener-url", advertised])
        .args(["--storage-engine", "sqlite://broker.db"])
        .args(extra)
        .current_dir(dir)
        .env_remove("LISTENER_URL")
        .env_remove("ADVERTISED_LISTENER_URL")
        .env_remove("STORAGE_ENGINE")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start tansu")
}
