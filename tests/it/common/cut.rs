//! A TCP forwarder that can be cut: an outage of the server behind it as
//! its clients see one (connections reset, new ones refused), with the
//! server itself untouched.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub struct Cut {
    /// The port clients connect to, on 127.0.0.1.
    pub port: u16,
    down: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    /// Connections refused while cut.
    pub refused: Arc<AtomicUsize>,
}

impl Cut {
    /// Forwards connections to 127.0.0.1:`upstream`.
    pub fn to(upstream: u16) -> Cut {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (down, open, refused): (Arc<AtomicBool>, Arc<Mutex<Vec<TcpStream>>>, Arc<AtomicUsize>) = Default::default();
        let (d, o, r) = (down.clone(), open.clone(), refused.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if d.load(Ordering::SeqCst) {
                    r.fetch_add(1, Ordering::SeqCst);
                    continue; // dropped: closed at once
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                let mut open = o.lock().unwrap();
                open.retain(|s| s.peer_addr().is_ok());
                open.push(client.try_clone().unwrap());
                open.push(server.try_clone().unwrap());
                drop(open);
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Cut { port, down, open, refused }
    }

    /// The outage begins: every open connection is shut, new ones refused.
    pub fn down(&self) {
        self.down.store(true, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// The outage ends.
    pub fn up(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either side closes.
fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 64 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
        let _ = from.shutdown(Shutdown::Read);
    });
}
