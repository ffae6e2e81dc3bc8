//! Servers of the tests on ports of their own: a free port, and the check
//! that the server started is the one listening there.

use std::process::Child;
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts a server with `start` on a free port, until it is the one that
/// listens there: between choosing a free port and the server's binding
/// it, another process of the suite may take the port (the server then
/// exits, and a check that only connects would reach the other process).
pub fn on_a_free_port(name: &str, mut start: impl FnMut(u16) -> Child) -> (u16, Child) {
    for _ in 0..5 {
        let port = free_port();
        let mut child = start(port);
        if listens_itself(&mut child, port) {
            return (port, child);
        }
        let _ = child.kill();
        let _ = child.wait();
        eprintln!("{name} could not listen on port {port} (taken meanwhile): another port");
    }
    panic!("{name} did not listen on any of 5 free ports");
}

/// Waits (30 s at most) until `child`, or a process it started, listens
/// on 127.0.0.1:`port`; false once it exited, or at the deadline.
pub fn listens_itself(child: &mut Child, port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return false;
        }
        if listener_pids(port).into_iter().any(|pid| descends_from(pid, child.id())) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The processes that hold a socket listening on TCP `port` (IPv4), from
/// /proc.
fn listener_pids(port: u16) -> Vec<u32> {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let inodes: Vec<String> = tcp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = f.get(1)?.rsplit(':').next()?;
            let inode = f.get(9)?;
            (u16::from_str_radix(local_port, 16).ok()? == port && *f.get(3)? == "0A").then(|| format!("socket:[{inode}]"))
        })
        .collect();
    if inodes.is_empty() {
        return Vec::new();
    }
    let mut pids = Vec::new();
    for proc in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = proc.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(fds) = std::fs::read_dir(proc.path().join("fd")) else { continue };
        if fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| inodes.iter().any(|i| l.as_os_str() == i.as_str()))) {
            pids.push(pid);
        }
    }
    pids
}

/// Whether `pid` is `ancestor` or one of its descendants.
fn descends_from(mut pid: u32, ancestor: u32) -> bool {
    for _ in 0..16 {
        if pid == ancestor {
            return true;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The parent is the second field after the command's closing
        // parenthesis.
        match stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok()) {
            Some(parent) if parent > 1 => pid = parent,
            _ => return false,
        }
    }
    false
}
