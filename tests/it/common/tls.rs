//! A TLS endpoint in front of a plaintext server of the tests (tansu 0.6
//! parses `--cert` but serves plaintext; noida-db serves plain HTTP): it
//! terminates TLS with rustls and forwards each connection, decrypted, to
//! the server. The certificates come from the `openssl` command: a CA of
//! the test's own and a server certificate for 127.0.0.1 and localhost.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command as Proc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A CA and the server certificate it signed, as PEM files in a directory
/// of the test's own.
pub struct Certs {
    pub dir: tempfile::TempDir,
}

impl Certs {
    /// A new CA (`ca.pem`) and a server certificate (`server.pem`,
    /// `server.key`) for 127.0.0.1 and localhost, valid for two days.
    pub fn new() -> Certs {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("server.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
            .unwrap();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        openssl(
            d,
            &["req", "-x509"],
            &ec,
            &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=denorm test CA", "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        );
        openssl(d, &["req"], &ec, &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]);
        openssl(d, &["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext"], &[], &[]);
        Certs { dir }
    }

    /// The CA certificate's file.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }
}

fn openssl(dir: &Path, head: &[&str], key: &[&str], tail: &[&str]) {
    let out = Proc::new("openssl").args(head).args(key).args(tail).current_dir(dir).output().expect("run openssl (Debian package openssl)");
    assert!(out.status.success(), "openssl {head:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Bytes of each connection kept for [`Front::saw`].
pub const KEPT: usize = 64 << 10;

/// A listening TLS endpoint ([`Endpoint::bind`]), forwarding once told
/// where to ([`Endpoint::forward_to`]): a broker's advertised address must
/// be known before the broker starts.
pub struct Endpoint {
    listener: std::net::TcpListener,
    pub port: u16,
}

/// A running TLS endpoint: what it saw.
pub struct Front {
    pub port: u16,
    /// The first bytes (up to [`KEPT`]) each connection sent, decrypted
    /// (HTTP requests' heads, Kafka requests).
    pub heads: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Connections whose TLS handshake failed (a client that refused the
    /// certificate, or spoke plaintext).
    pub refused: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Endpoint {
    /// Listens on a free loopback port.
    pub fn bind() -> Endpoint {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        Endpoint { listener, port }
    }

    /// Serves TLS with `certs`' server certificate, forwarding every
    /// connection to 127.0.0.1:`port`.
    pub fn forward_to(self, certs: &Certs, port: u16) -> Front {
        let d = certs.dir.path();
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(d.join("server.pem")).unwrap().map(Result::unwrap).collect();
        let key = PrivateKeyDer::from_pem_file(d.join("server.key")).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let (heads, refused) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicUsize::new(0)));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let backend = SocketAddr::from(([127, 0, 0, 1], port));
        let (h, r, listener, front_port) = (heads.clone(), refused.clone(), self.listener, self.port);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
            rt.block_on(async move {
                listener.set_nonblocking(true).unwrap();
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let serve = async {
                    loop {
                        let Ok((tcp, _)) = listener.accept().await else { continue };
                        let (acceptor, h, r) = (acceptor.clone(), h.clone(), r.clone());
                        tokio::spawn(async move {
                            let tls = match acceptor.accept(tcp).await {
                                Ok(s) => s,
                                Err(_) => {
                                    r.fetch_add(1, Ordering::SeqCst);
                                    return;
                                }
                            };
                            let Ok(plain) = tokio::net::TcpStream::connect(backend).await else { return };
                            let slot = {
                                let mut heads = h.lock().unwrap();
                                heads.push(Vec::new());
                                heads.len() - 1
                            };
                            let (mut from_client, mut to_client) = tokio::io::split(tls);
                            let (mut from_server, mut to_server) = plain.into_split();
                            // What the client sends, kept up to KEPT bytes.
                            let up = async {
                                let mut buf = vec![0u8; 8192];
                                loop {
                                    let n = match from_client.read(&mut buf).await {
                                        Ok(0) | Err(_) => break,
                                        Ok(n) => n,
                                    };
                                    {
                                        let mut heads = h.lock().unwrap();
                                        let kept = &mut heads[slot];
                                        let room = KEPT.saturating_sub(kept.len()).min(n);
                                        kept.extend_from_slice(&buf[..room]);
                                    }
                                    if to_server.write_all(&buf[..n]).await.is_err() {
                                        break;
                                    }
                                }
                                let _ = to_server.shutdown().await;
                            };
                            let down = async {
                                let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                                let _ = to_client.shutdown().await;
                            };
                            tokio::join!(up, down);
                        });
                    }
                };
                tokio::select! {
                    _ = serve => {}
                    _ = stopped => {}
                }
            });
        });
        Front { port: front_port, heads, refused, stop: Some(stop), thread: Some(thread) }
    }
}

impl Front {
    /// Whether any connection's first bytes contain `needle`.
    pub fn saw(&self, needle: &[u8]) -> bool {
        self.heads.lock().unwrap().iter().any(|h| h.windows(needle.len()).any(|w| w == needle))
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
